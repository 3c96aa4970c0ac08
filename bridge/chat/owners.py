"""N1, seed 000: "в чужих турах блокнот в промпт не идёт вовсе" — a turn is the owner's or
someone else's from its first message to its end.

Every model call of an owner turn carries the owner's notebook, so a member's message never
joins a running owner turn (a steer under the immediate policy, a free-form answer to the
owner's open question), and an owner's message never joins someone else's: it waits in the
queue for a turn of its own, as a pushed turn does.
"""

from __future__ import annotations

from collections.abc import Sequence

from diskqueue import DiskQueue, Message

from ..storage.payloads import QueuedMessage, decode

__all__ = ["own_kind"]


async def own_kind(queue: DiskQueue, claimed: Sequence[Message], *, owner_turn: bool, claim: str) -> list[Message]:
    """The steer's claimed rows that are of the running turn's kind; the others go back to the
    queue (at its head, in order) for their own turn."""
    others = [m.id for m in claimed
              if isinstance(item := decode(m.payload), QueuedMessage) and item.owner != owner_turn]
    if others:
        await queue.nack(others, claim=claim)
    return [m for m in claimed if m.id not in others]
