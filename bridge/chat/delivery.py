"""A turn's messages on their way to eve: the session made or replaced, the ``[state]`` block of
an owner's turn (N6), the delivery recorded."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence

import structlog

import eve_client as eve

from .. import log
from ..errors import BridgeError
from ..models import Caller, Role, TurnKind
from ..people import Role as PersonRole
from ..push import turns as pushed
from ..storage.address import Address
from ..storage.payloads import InputAnswer, PushedTurn, Queued, QueuedMessage, decode
from ..telegram.texts import t
from . import carry
from .compose import Composed, compose, hear
from .endings import eve_upgraded, say_unheard
from .services import Services
from .transcribe import Transcriber

__all__ = ["Lost", "Unheard", "caller", "send"]

logger = log.get(__name__)


class Lost(BridgeError):
    """The eve session is gone, stranded or stuck: free the chat with the reset mark."""


class Unheard(BridgeError):
    """Nothing is left to send: the messages are recordings without a transcript (I4). The
    caller ends them — each sender told in one line — in the same commit as their end."""

    def __init__(self, items: Sequence[QueuedMessage]) -> None:
        super().__init__(f"{len(items)} recording(s) without a transcript")
        self.items = tuple(items)


async def send(s: Services, address: str, claim: str, items: Sequence[Queued], *,
               policy: eve.TurnPolicy, steered: Sequence[int] = (), steer_claim: str | None = None) -> eve.Delivery:
    """Deliver to eve; a session eve no longer knows is replaced once, transparently (a steer
    cannot be: its turn is in the old session). The turn is composed once, before: its files
    fetched, its recordings transcribed (in this worker, never in ingest's loop)."""
    # I4: the recordings heard first, without a file slot (a transcriber may take a while).
    heard = await hear(s.sender.bot, items, max_file_mb=s.settings.telegram.max_file_mb,
                       transcriber=Transcriber.from_settings(s.settings, s.hearing), media=s.media)
    async with contextlib.AsyncExitStack() as held:
        if any(isinstance(i, QueuedMessage) and i.attachment is not None and not i.attachment.transcribe
               for i in items):
            await held.enter_async_context(s.files)  # the files of at most FILE_TURNS turns in memory at once
        composed = await _compose(s, address, items, heard)
        for _ in range(3):
            # An edit while the turn was put together (a file fetched, a recording transcribed)
            # replaced the words on the record: eve gets the corrected ones (I2, edits.py).
            now = await _as_recorded(s, address, steer_claim or claim, steered, len(items))
            if now is None or now == list(items):
                break
            logger.info("turn_recomposed_after_edit")
            items = now
            composed = await _compose(s, address, items, heard)
        headers = (await caller(s, address, items)).headers()  # D2
        for attempt in (1, 2):
            history = await _carried(s, address, policy)
            session = await _ensure_session(s, address, claim, headers)
            context, marks = await _state_block(s, address, policy)
            context, told = await pushed.context(s.store.db, address, items, context, steer=policy == "steer")
            try:
                delivery = await s.eve.send(session, composed.message, turn_policy=policy,
                                            client_context=carry.with_history(context, history),
                                            idempotency_key=idempotency_key(s.sender.bot.id, address, items, session),
                                            headers=headers)
            except eve.SessionGone as exc:
                if attempt == 2 or policy == "steer":
                    raise Lost(str(exc)) from exc
                logger.warning("eve_session_replaced", reason=str(exc))
                if isinstance(exc, eve.SessionStranded):
                    await eve_upgraded(s)
                # V5: a session another eve built (an upgrade) — the new one tells the person
                await s.transitions.session_dropped(address, claim, upgraded=isinstance(exc, eve.SessionStranded))
                continue
            # The one-shot marks (N6) once the block is with eve: a crash before this shows it again.
            await s.transitions.delivered(address, claim, delivery.delivery_id, marks, steered=steered,
                                          steer_claim=steer_claim)
            await pushed.told(s.store.db, address, told)  # W5: eve has heard of them
            s.media.forget(items)  # kept across an outage's retries until now (media.py)
            return delivery
    raise AssertionError("unreachable")


def idempotency_key(bot: int, address: str, items: Sequence[Queued], session: str) -> str | None:
    """V4: what makes these messages unique in Iva's queue — the bot, the chat (its address), the
    messages' ids (an edit is the same message), or a pushed turn's own key — and the session, so
    that a message sent again after its session was replaced is new there. eve 1.x answers a key
    it has seen with the first delivery and starts no second turn; None when nothing names them."""
    names = [_name(i) for i in items if isinstance(i, QueuedMessage) or (isinstance(i, PushedTurn) and i.key)]
    if len(names) != len(items):
        return None
    key = f"iva:{bot}:{address}:{session}:{','.join(names)}"
    # eve takes at most 256 characters; a cut key could name another batch: a long one is hashed
    return key if len(key) <= 256 else f"iva:{bot}:{hashlib.sha256(key.encode()).hexdigest()}"


def _name(item: QueuedMessage | PushedTurn) -> str:
    if isinstance(item, PushedTurn):
        return f"p{item.key}"
    if item.correction:  # I2: each edit of a message eve has is a correction of its own
        return f"e{item.message_id}.{hashlib.sha256(item.text.encode()).hexdigest()[:12]}"
    return f"m{item.message_id}"


async def _as_recorded(s: Services, address: str, claim: str, ids: Sequence[int], count: int) -> list[Queued] | None:
    """The claimed messages as the record has them now (None when they are not all there: the
    caller's own items stand)."""
    rows = [m for m in await s.queue.inflight(address) if m.claim == claim and (not ids or m.id in ids)]
    return [decode(m.payload) for m in rows] if len(rows) == count else None


async def _compose(s: Services, address: str, items: Sequence[Queued],
                   heard: dict[str, str | None] | None = None) -> Composed:
    """The turn for eve. Recordings left out (no transcript) are answered now, once each (keyed
    by the message), and the rest goes on; when nothing is left, :class:`Unheard`."""
    composed = await compose(s.sender.bot, items, max_file_mb=s.settings.telegram.max_file_mb,
                             transcriber=Transcriber.from_settings(s.settings, s.hearing), media=s.media, heard=heard)
    if composed.unheard and not composed.message:
        raise Unheard(composed.unheard)
    if composed.unheard:
        async with s.store.db.transaction():
            await say_unheard(s, address, composed.unheard)
    return composed


async def caller(s: Services, address: str, items: Sequence[Queued]) -> Caller:
    """D2: what the agent's channel is told with this turn's requests: the chat's model, the chat,
    the turn's kind; for people's messages the latest speaker, and the weakest role among the
    turn's authors (a template never grants a batch more than its least trusted author); a pushed
    turn or a reminder is the owner's (N1)."""
    model = (await s.models.of(address)).model
    push = next((i for i in items if isinstance(i, PushedTurn)), None)
    if push is not None:
        kind = TurnKind.REMINDER if push.source == "reminder" else TurnKind.PUSHED
        return Caller(address, kind, model, role=Role.OWNER)
    people = [i.user_id for i in items if isinstance(i, QueuedMessage | InputAnswer)]
    if not people:
        return Caller(address, TurnKind.PERSON, model)
    private = Address.parse(address).chat_id > 0  # Telegram's groups and channels have negative ids
    ranks = (Role.OWNER, Role.ALLOWED, Role.MEMBER)
    roles = [await _role(s, user, private) for user in people]
    return Caller(address, TurnKind.PERSON, model, speaker=people[-1], role=max(roles, key=ranks.index))


async def _role(s: Services, user: int, private: bool) -> Role:
    known = await s.people.role(user)
    if known is PersonRole.OWNER:
        return Role.OWNER
    return Role.ALLOWED if known is PersonRole.ALLOWED and private else Role.MEMBER


async def _carried(s: Services, address: str, policy: eve.TurnPolicy) -> list[dict[str, str]]:
    """V5: the recent exchange of the session an upgrade stranded, for the new session's first
    message (bridge/chat/carry.py); [] for any other send."""
    chat = await s.store.chat(address)
    if policy == "steer" or chat is None or not chat.upgraded_from or chat.upgraded_from == chat.eve_session:
        return []
    return await carry.transcript(s.eve, chat.upgraded_from)


async def _ensure_session(s: Services, address: str, claim: str, headers: dict[str, str] | None = None) -> str:
    chat = await s.store.chat(address)
    assert chat is not None
    if chat.eve_session:
        return chat.eve_session
    session = await s.eve.create_session(headers=headers)
    async with s.store.db.transaction():
        was = await s.transitions.session_opened(address, claim, session, eve_version=s.eve.eve_version)
        if was.upgraded_from is not None:
            # V5: eve was upgraded under the chat's last session: said once (keyed on that
            # session), before the answer the new session gives
            await s.outbox.say(was, f"upgraded:{was.upgraded_from}", t("eve_upgraded", was.lang))
    structlog.contextvars.bind_contextvars(session=session)
    logger.info("eve_session_created", session=session, eve=s.eve.eve_version)
    return session


async def _state_block(s: Services, address: str, policy: eve.TurnPolicy) -> tuple[str | None, dict[str, int]]:
    """N6: the ``[state]`` block as clientContext of an owner's turn; nothing for anyone else."""
    if s.notebook is None or policy == "steer":
        return None, {}
    chat = await s.store.chat(address)
    if chat is None or not chat.owner_turn:
        return None, {}
    return await s.notebook.block(chat, threshold=await s.threshold(address), window=await s.window_of(address))
