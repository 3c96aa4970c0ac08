"""A turn's messages on their way to eve: the session made or replaced, the ``[state]`` block of
an owner's turn (N6), the delivery recorded."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

import eve_client as eve

from .. import log
from ..payloads import Queued, QueuedMessage
from .compose import compose
from .services import Services

__all__ = ["GONE", "Lost", "send"]

logger = log.get("bridge.chat.delivery")

# eve no longer has the session (or it cannot go on): the busy period ends with the reset mark.
GONE = (eve.SessionNotFound, eve.SessionNotActive, eve.SessionStranded, eve.SessionExpired)


class Lost(Exception):
    """The eve session is gone, stranded or stuck: free the chat with the reset mark."""


async def send(s: Services, address: str, claim: str, items: Sequence[Queued], *,
               policy: eve.TurnPolicy, steered: Sequence[int] = (), steer_claim: str | None = None) -> eve.Delivery:
    """Deliver to eve; a session eve no longer knows is replaced once, transparently (a steer
    cannot be: its turn is in the old session)."""
    for attempt in (1, 2):
        session = await _ensure_session(s, address, claim)
        context, marks = await _state_block(s, address, policy)
        try:
            if any(isinstance(i, QueuedMessage) and i.attachment is not None for i in items):
                async with s.files:  # the files of at most FILE_TURNS turns in memory at once
                    delivery = await _send(s, session, items, policy, context)
            else:
                delivery = await _send(s, session, items, policy, context)
        except GONE as exc:
            if attempt == 2 or policy == "steer":
                raise Lost(str(exc)) from exc
            logger.warning("eve_session_replaced", reason=str(exc))
            await s.transitions.session_dropped(address, claim)
            continue
        # The one-shot marks (N6) once the block is with eve: a crash before this shows it again.
        await s.transitions.delivered(address, claim, delivery.delivery_id, marks, steered=steered,
                                      steer_claim=steer_claim)
        return delivery
    raise AssertionError("unreachable")


async def _send(s: Services, session: str, items: Sequence[Queued], policy: eve.TurnPolicy,
                context: eve.ClientContext | None) -> eve.Delivery:
    message = await compose(s.sender.bot, items, max_file_mb=s.settings.max_file_mb)
    return await s.eve.send(session, message, turn_policy=policy, client_context=context)


async def _ensure_session(s: Services, address: str, claim: str) -> str:
    chat = await s.store.chat(address)
    assert chat is not None
    if chat.eve_session:
        return chat.eve_session
    session = await s.eve.create_session()
    await s.transitions.session_opened(address, claim, session)
    structlog.contextvars.bind_contextvars(session=session)
    logger.info("eve_session_created", session=session)
    return session


async def _state_block(s: Services, address: str, policy: eve.TurnPolicy) -> tuple[str | None, dict[str, int]]:
    """N6: the ``[state]`` block as clientContext of an owner's turn; nothing for anyone else."""
    if s.notebook is None or policy == "steer":
        return None, {}
    chat = await s.store.chat(address)
    if chat is None or not chat.owner_turn:
        return None, {}
    return await s.notebook.block(chat, threshold=s.threshold(), window=s.window.tokens)
