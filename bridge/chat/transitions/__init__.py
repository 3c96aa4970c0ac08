"""Every write of a chat's state, each a named transition in one transaction (R1).

A transition reads the record, checks its precondition and writes, all inside one ``BEGIN
IMMEDIATE`` transaction; the transaction is re-entrant, so a caller may add its own effects (an
outbox row, a spend row) to the same commit. Nothing outside this module writes the state fields
of a chat (status, kind, origin, session, cursor, claim, deliveries, the compaction phase, the
marks); ``tests/unit/test_chat_layout.py`` greps for it.

Preconditions come in two sorts:

* **guards** — a race that is normal (a message claimed while /compact took the chat, a
  recapture after /new): the transition writes nothing and says so (``None`` / ``False``);
* **ownership** — the consumer of a busy period holds its ``claim``; every write the consumer
  makes names it, and a record that no longer carries that claim (the period ended, a /new
  retired it) raises :class:`Superseded`: the caller's view is stale and it must stop. A
  transition from a state it is not defined for raises :class:`IllegalTransition`.
"""

from __future__ import annotations

import sqlite3

from diskqueue import State

from ... import log
from ...storage.store import Chat
from .compactions import _Compactions
from .record import (
    _IDLE,
    FRESH_SESSION,
    ChatState,
    Claim,
    Finished,
    IllegalTransition,
    Parked,
    Settling,
    Superseded,
    _fresh,
    state_of,
    steer_claim,
)
from .turns import _TurnEnds, _Turns

__all__ = [
    "FRESH_SESSION",
    "ChatState",
    "Claim",
    "Finished",
    "IllegalTransition",
    "Parked",
    "Settling",
    "Superseded",
    "Transitions",
    "state_of",
    "steer_claim",
]

logger = log.get(__name__)


class Transitions(_Turns, _TurnEnds, _Compactions):
    """The transitions of every chat, on the store and the queue: /new and start-up here, the
    rest in the bases by the part of the record they move."""

    __slots__ = ()

    # -- /new ------------------------------------------------------------------------------

    async def request_new(self, address: str, *, reply_to: int) -> int:
        """M7: any state → a /new waits; the queued messages are dropped (their number returned)."""
        async with self.store.db.transaction():
            chat = await self._chat(address)
            dropped = await self.queue.drop_queued(address)
            await self._write(address, reset_requested=True, reset_reply_to=reply_to,
                              reset_dropped=chat.reset_dropped + dropped)
            return dropped

    async def new_conversation(self, address: str) -> Chat:
        """A /new waited → idle in a fresh session (eve's session was reset or left behind)."""
        async with self.store.db.transaction():
            chat = await self._chat(address)
            if not chat.reset_requested:
                raise IllegalTransition(f"{address}: no /new waits")
            inflight = await self.queue.inflight(address)
            await self.queue.ack([m.id for m in inflight])  # /new: what was in flight is done with
            await self._write(address, _IDLE, _fresh(chat), reset_mark=False, reset_requested=False,
                              reset_reply_to=None, reset_dropped=0, upgraded_from=None)
            return chat

    # -- start-up ---------------------------------------------------------------------------

    async def repair_at_start(self) -> int:
        """Before any worker runs: in-flight messages of chats that are not busy go back to the
        queue (a crash between claim and busy cannot happen, but an old schema's could). A
        released chat stays released: its worker reads eve's stream before anything is sent
        (C6; recovery.released_announced). Returns the number of messages requeued."""
        async with self.store.db.transaction():
            busy = {c.address for c in await self.store.busy_chats()}
            requeued = 0
            for address in await self.queue.addresses_with(State.INFLIGHT):
                if address not in busy:
                    requeued += await self.queue.requeue_inflight(address)
        await self._anchor_clock()
        return requeued

    async def _anchor_clock(self) -> None:
        """F9: read the last process's clock anchor, leave ours — best effort (a full disk must
        not stop the start: elapsed times then fall back to the clamped wall difference)."""
        try:
            self.previous_anchor = await self.store.clock_anchor()
            async with self.store.db.transaction():
                await self.store.set_people_meta("clock_anchor", self.steady.anchor())
        except sqlite3.OperationalError as exc:
            logger.warning("clock_anchor_not_written", error=str(exc))

