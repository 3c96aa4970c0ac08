"""How a busy period ends badly: one :func:`end` of an :data:`Outcome`, a transition with what the
person hears (R2, R3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import eve_client as eve

from .. import log
from ..metrics import METRICS
from ..push.turns import failed_line
from ..storage.payloads import Kind, Origin, QueuedMessage, decode
from ..telegram.texts import t
from .services import Services

__all__ = ["NotHeard", "Outcome", "Refused", "SessionLost", "end", "eve_upgraded", "gone", "say_unheard"]

logger = log.get(__name__)


@dataclass(frozen=True, slots=True)
class SessionLost:
    """The session is gone, stranded or stuck (R2, R3). ``answered``: eve had ended the turn and
    every message of it was answered (only eve's idle after it never came). ``upgraded``: eve
    was upgraded under it (its session stranded, or its stream now of another version, V5)."""

    reason: str
    answered: bool = False
    upgraded: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """eve refused the message itself (``reason`` for the person), or it was stopped before eve
    ever had it (``reason`` None: nothing to say). ``dead``: the messages were given up on (F6),
    kept for ``iva status --dead`` with that reason."""

    reason: str | None
    dead: str | None = None


@dataclass(frozen=True, slots=True)
class NotHeard:
    """Nothing of the turn could go to eve: its messages are recordings without a transcript (I4)."""

    items: tuple[QueuedMessage, ...]


Outcome = SessionLost | Refused | NotHeard


async def eve_upgraded(s: Services) -> None:
    """eve was upgraded under a session (V5): its version asked again, for `iva status` and `iva
    sessions` (the bridge may have run through the upgrade; a token that cannot read /info leaves
    it to the next new session's first event)."""
    try:
        info = await s.eve.info()
    except eve.EveError as exc:
        logger.info("eve_version_not_read", error=str(exc))
        return
    if info.eve_version:
        await s.store.set_meta("eve_version", info.eve_version)
        logger.info("eve_version_learned", version=info.eve_version)


def gone(outcome: Outcome, error: BaseException) -> Outcome:
    """The outcome of a session lost to ``error``: an eve upgrade's says so (V5)."""
    if isinstance(outcome, SessionLost) and isinstance(error, eve.StreamVersionChanged | eve.SessionStranded):
        return replace(outcome, upgraded=True)
    return outcome


async def end(s: Services, address: str, claim: str | None, outcome: Outcome) -> None:
    """The one way a busy period ends badly: the transition with what the person hears.

    * :class:`SessionLost` — free the chat with the session-reset mark. The person whose turn
      was interrupted is told to repeat it — unless it was answered, when they are only told
      that the next message starts a new conversation; an interrupted auto compaction is
      silent; an interrupted /compact asks for /compact again. The next message starts a new
      session at once, without waiting on a /reset that cannot succeed.
    * :class:`Refused` — say so (unless stopped before it was sent), free the chat; the
      messages are done with.
    * :class:`NotHeard` — each sender is told in one line, the messages are done with, the
      chat is free; eve never hears of it.
    """
    match outcome:
        case SessionLost():
            await _lost(s, address, claim, outcome)
            return
        case NotHeard():
            assert claim is not None
            async with s.store.db.transaction():
                await say_unheard(s, address, outcome.items)
                await s.transitions.fail_turn(address, claim)  # busy(turn) → idle, the messages acknowledged
            METRICS.turns.labels(outcome="unheard").inc()
        case Refused(reason=None):
            assert claim is not None
            await s.transitions.fail_turn(address, claim)
            return
        case Refused(reason=str(reason)):
            assert claim is not None
            async with s.store.db.transaction():
                chat, inflight = await s.transitions.fail_turn(address, claim)
                if outcome.dead is not None:
                    await s.store.bury(address, inflight, outcome.dead)
                replied = [m for m in map(decode, (m.payload for m in inflight)) if isinstance(m, QueuedMessage)]
                line = await failed_line(s.queue, chat, inflight, reason)
                await s.outbox.say(chat, f"failed:{chat.claim}", line or t("turn_failed", chat.lang, reason=reason),
                                   reply_to=replied[-1].message_id if replied else None)
            METRICS.turns.labels(outcome="failed").inc()


async def _lost(s: Services, address: str, claim: str | None, outcome: SessionLost) -> None:
    answered = outcome.answered
    if outcome.upgraded:
        await eve_upgraded(s)
    async with s.store.db.transaction():
        # V5: an upgrade is told once — by the next new session (a compaction, a pushed turn's
        # own line), or here, in the one line of a person's turn it cut
        chat, inflight = await s.transitions.session_lost(address, claim, upgraded=outcome.upgraded)
        replied = [m for m in map(decode, (m.payload for m in inflight)) if isinstance(m, QueuedMessage)]
        line = None if answered else await failed_line(s.queue, chat, inflight, t("pushed_lost_reason", chat.lang))
        if line is not None:
            await s.outbox.say(chat, f"lost:{chat.claim}", line)
        elif chat.kind is Kind.TURN and inflight:
            lost = "session_lost_after_answer" if answered else "session_lost"
            key = f"lost:{chat.claim}"
            if outcome.upgraded:
                # keyed as the new session's notice (upgraded:<old session>): one line, not two
                lost, key = ("eve_upgraded" if answered else "eve_upgraded_cut"), f"upgraded:{chat.eve_session}"
            await s.outbox.say(chat, key, t(lost, chat.lang), reply_to=replied[-1].message_id if replied else None)
        elif chat.origin is Origin.MANUAL and chat.kind is not Kind.TURN:
            await s.outbox.say(chat, f"compact-again:{chat.claim or chat.eve_session}",
                               t("compact_again", chat.compact_lang or chat.lang),
                               reply_to=chat.compact_reply_to)
    if chat.kind is not Kind.TURN:
        METRICS.compactions.labels(origin=str(chat.origin or Origin.AUTO), outcome="lost").inc()
    METRICS.turns.labels(outcome="lost").inc()
    logger.warning("eve_session_lost", reason=outcome.reason, session=chat.eve_session, kind=chat.kind)


async def say_unheard(s: Services, address: str, items: Sequence[QueuedMessage]) -> None:
    """One line to the sender of each recording that has no transcript, in the caller's
    transaction; keyed by the message, so a retried turn never says it twice."""
    chat = await s.store.chat(address)
    assert chat is not None
    for item in items:
        await s.outbox.say(chat, f"unheard:{chat.chat_id}:{item.message_id}", t("voice_unheard", chat.lang),
                           reply_to=item.message_id)
