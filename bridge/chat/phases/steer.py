"""Messages for a running turn: button answers as eve's answers, texts as a steer (T4, T5, F4).

Every write of the queue is a transition (``claim_steer``, ``steer_taken``, ``steer_returned``,
``delivered``); this module decides which, and what eve is sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import eve_client as eve

from ... import log
from ...storage.payloads import InputAnswer, QueuedMessage, decode
from ...storage.store import Chat
from ..delivery import Lost, Unheard, caller, send
from ..endings import SessionLost, gone, say_unheard
from ..transitions import Settling, steer_claim
from .base import Ended, Period

__all__ = ["Steered", "adopt", "steer", "unsure"]

logger = log.get(__name__)


@dataclass(frozen=True, slots=True)
class Steered:
    """What went to eve: ``answers`` button answers, ``messages`` messages (their delivery, when
    eve named it)."""

    answers: int = 0
    messages: int = 0
    delivery: str | None = None


async def unsure(p: Period) -> list[int]:
    """The messages of a steer eve may or may not have (still under the steer's own claim)."""
    mine = steer_claim(p.owned())
    return [m.id for m in await p.s.queue.inflight(p.address) if m.claim == mine]


async def adopt(p: Period, deliveries: Sequence[str]) -> list[str]:
    """F4 for a steer: eve shows a message we have no record of sending while a steer is unsure —
    it is that steer. Recorded as the turn's, so it is answered here and never sent again. The
    deliveries adopted (none: nothing was unsure, or eve's are known already)."""
    steered = await unsure(p)
    if not steered:
        return []
    chat = await p.s.store.chat(p.address)
    unknown = [d for d in deliveries if chat is not None and d not in chat.deliveries]
    claim = p.owned()
    for delivery in unknown:
        await p.s.transitions.delivered(p.address, claim, delivery, steered=steered, steer_claim=steer_claim(claim))
        steered = []
    if unknown:
        logger.info("unsure_steer_found_at_eve", deliveries=unknown)
    return unknown


async def steer(p: Period, chat: Chat, *, answers_only: bool = False) -> Steered | Ended | None:
    """Claim what waits and give it to the running turn. None: nothing went. ``answers_only``:
    the button answers go, messages wait for the next turn (a budget prompt is open, V6)."""
    s, claim = p.s, p.owned()
    claimed = await s.transitions.claim_steer(p.address, claim, limit=s.settings.chat.batch_size,
                                              answers_only=answers_only)
    if claimed is None:
        return None
    if isinstance(claimed, Settling):
        # An album still arriving: a look once it settled (a new part pokes sooner).
        p.poke(after=claimed.at - s.transitions.mono())  # F9: monotonic
        return None
    rows = list(claimed.messages)
    answers = [m for m in rows if isinstance(decode(m.payload), InputAnswer)]
    messages = [m for m in rows if m not in answers]
    taken = 0
    if answers:
        ids = [m.id for m in answers]
        pressed = [a for a in (decode(m.payload) for m in answers) if isinstance(a, InputAnswer)]
        try:
            await s.eve.respond(p.session, [eve.Answer(a.request_id, option_id=a.option_id) for a in pressed],
                                headers=(await caller(s, p.address, pressed)).headers())  # D2
        except eve.SessionGone as exc:
            await s.transitions.steer_returned(p.address, claim, ids)
            return Ended(gone(SessionLost(str(exc)), exc))
        except eve.EveError as exc:
            logger.warning("eve_input_response_failed", error=str(exc))
            await s.transitions.steer_returned(p.address, claim, ids)
        else:
            await s.transitions.steer_taken(p.address, claim, ids)
            taken = len(answers)
    if not messages:
        return Steered(answers=taken) if taken else None
    ids = [m.id for m in messages]
    items = [decode(m.payload) for m in messages]
    if chat.owner_turn and not all(isinstance(i, QueuedMessage) and i.owner for i in items):
        # Someone else's words join the owner's turn: from here on it is not the owner's (N1).
        await s.transitions.turn_shared(p.address, claim)
    try:
        delivery = await send(s, p.address, claim, items, policy="steer", steered=ids, steer_claim=steer_claim(claim))
    except Lost as exc:
        return Ended(gone(SessionLost(str(exc)), exc.__cause__ or exc))
    except Unheard as exc:
        # Recordings without a transcript, and nothing else: each sender is told, the turn goes on.
        async with s.store.db.transaction():
            await say_unheard(s, p.address, exc.items)
            await s.transitions.steer_taken(p.address, claim, ids)
        return Steered(answers=taken) if taken else None
    except eve.EveTransportError as exc:
        if isinstance(exc, eve.EveConnectError):
            logger.warning("eve_steer_failed", error=str(exc))
            await s.transitions.steer_returned(p.address, claim, ids)  # eve never saw it
            return Steered(answers=taken) if taken else None
        # Ambiguous (a 5xx, a timeout after it went out): eve may have it. The claim stays; if
        # eve shows it (message.received) it is this turn's, else parking puts it back (F4).
        logger.warning("eve_steer_unsure", error=str(exc))
        return Steered(answers=taken) if taken else None
    except eve.EveError as exc:
        logger.warning("eve_steer_failed", error=str(exc))
        await s.transitions.steer_returned(p.address, claim, ids)
        return Steered(answers=taken) if taken else None
    for item in items:
        if isinstance(item, QueuedMessage):
            s.spawn(s.sender.react(chat.chat_id, item.message_id, "⚡"))
    return Steered(answers=taken, messages=len(messages), delivery=delivery.delivery_id)
