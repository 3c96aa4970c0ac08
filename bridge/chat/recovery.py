"""A busy record with no live consumer — found at start, or left by a consumer that stopped —
goes to the same consumer from its saved cursor (R2): one procedure for turns and compactions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import eve_client as eve
from diskqueue import Message

from .. import log
from ..metrics import METRICS
from ..push import turns as pushed
from ..storage.payloads import Kind, Origin, decode
from ..storage.store import Chat, CompactPhase
from ..telegram.texts import t
from .consumer import BusyPeriod, Inbox
from .delivery import Lost, Unheard, send
from .endings import NotHeard, Refused, SessionLost, end, gone
from .services import Services, Slot

__all__ = ["drive", "released_announced", "resume"]

logger = log.get(__name__)


def _compaction_began(event: eve.Event) -> bool:
    """eve began a compaction between turns (not its own safety net inside one)."""
    return isinstance(event, eve.ContextStarted) and event.kind == "compaction" and not event.in_turn


async def resume(s: Services, inbox: Inbox, chat: Chat) -> None:
    """Take a busy record from where it stands."""
    logger.info("busy_record_resumed", kind=chat.kind, origin=chat.origin, session=chat.eve_session,
                cursor=str(chat.cursor), phase=chat.compact_phase)
    assert chat.claim is not None
    if chat.kind is Kind.COMPACT:
        await _resume_compaction(s, inbox, chat)
        return
    if not chat.eve_session:
        await s.transitions.give_back(chat.address, chat.claim)  # claimed, but no session yet: eve never saw it
        return
    if chat.kind is not Kind.TURN:
        await end(s, chat.address, chat.claim, SessionLost(f"unknown busy kind {chat.kind!r}"))
        return
    if not chat.deliveries:
        if s.eve.dedupes_sends:
            # V4 (eve 1.x): the send is keyed by its messages; sent again, eve answers it once —
            # with the first delivery if it had it (its turn then followed from the cursor).
            page: eve.StreamPage | None = None
        else:
            try:
                page = await s.eve.read(chat.eve_session, chat.cursor)
            except eve.SessionGone as exc:
                await end(s, chat.address, chat.claim, gone(SessionLost(str(exc)), exc))
                return
        if page is None or not any(isinstance(e, eve.TurnBegan | eve.InputTaken) for e in page.events):
            # Claimed and marked busy, but the send never reached eve: send it now — unless eve
            # has answered these messages with a server error as often as we try (F6): then
            # the person is told and the chat moves on, instead of one message blocking it.
            inflight = await s.queue.inflight(chat.address)
            if chat.stop_wanted:
                # Stopped before eve ever had it (a restart in between): it is not sent at all (a
                # pushed turn reads "stopped").
                await pushed.stopped(s.queue, [m for m in inflight if m.claim == chat.claim])
                await end(s, chat.address, chat.claim, Refused(None))
                logger.info("stopped_before_sent", messages=[m.id for m in inflight])
                return
            mine = [m for m in inflight if m.claim == chat.claim]
            tried = max((m.attempts for m in mine), default=0)
            # The age on the steady clock (F9): the queue's stamps are steady wall times, and a
            # step of the wall clock since (or a restart in the same boot) does not age it.
            first = min((m.enqueued_at for m in mine), default=None)
            age = 0.0 if first is None else s.transitions.spent(first, limit=s.settings.eve.send_max_age)
            # A cap by attempts or by age, either one (a message eve fails on slowly, each try
            # far apart, must not hold the chat for ever); an outage is never counted (R6).
            if tried >= s.settings.eve.send_attempts or (tried and age >= s.settings.eve.send_max_age):
                logger.error("eve_send_given_up", attempts=tried, age_s=round(age), messages=[m.id for m in inflight])
                dead = f"eve failed on it {tried}x" + (f" over {round(age)}s"
                                                       if tried < s.settings.eve.send_attempts else "")
                await end(s, chat.address, chat.claim, Refused(t("eve_server_error", chat.lang), dead=dead))
                return
            events = page.events if page is not None else []
            if events and (not isinstance(events[-1], eve.Idle) or any(_compaction_began(e) for e in events)):
                # eve is running something, or just ran a compaction: a message it took meanwhile
                # waits behind it and starts right after eve is idle (PROTOCOL.md §5).
                # Follow the stream: the turn is ours when it comes; idle without it, sent again.
                logger.info("unrecorded_send_followed", events=len(events))
                await BusyPeriod(s, inbox, chat).run()
                return
            await drive(s, inbox, chat.address, chat.claim, inflight)
            return
    await BusyPeriod(s, inbox, chat).run()


async def released_announced(s: Services, chat: Chat) -> bool:
    """C6 across a restart: a released compaction's watch lives in the process that released
    it, so after a restart nothing reads eve's stream for the late announcement. Before a
    message of such a chat is claimed for a turn, eve's stream is read from the cursor; if eve
    announced the compaction, the chat is taken again as compacting (resumed from the cursor as
    any busy compaction) and the message waits behind it, never sent into it (seed 004). True
    when the chat was taken."""
    if not chat.eve_session or chat.reset_mark:
        return False
    try:
        page = await s.eve.read(chat.eve_session, chat.cursor)
    except eve.EveError:
        return False  # the turn's own read decides, as before
    if not any(_compaction_began(e) for e in page.events):
        return False
    taken = await s.transitions.recapture(chat.address) is not None
    if taken:
        logger.info("released_compaction_recaptured_at_claim")
    return taken


async def _eve_is_up(s: Services) -> bool:
    """eve answers its health check: failures of one message are that message's, not an outage
    (while eve is down or its proxy answers 5xx to everything, messages wait: R6)."""
    try:
        async with asyncio.timeout(10):
            return (await s.eve.health()).ok
    except (eve.EveError, TimeoutError):
        return False


async def drive(s: Services, inbox: Inbox, address: str, claim: str,
                messages: Sequence[Message] | None = None, *, slot: Slot | None = None) -> None:
    """Send the turn's claimed messages (read back when not given) and follow the turn."""
    if messages is None:
        messages = await s.queue.inflight(address)
    if not messages:
        await s.transitions.give_back(address, claim)
        return
    try:
        await send(s, address, claim, [decode(m.payload) for m in messages], policy="queue")
    except eve.EveConnectError:
        await s.transitions.give_back(address, claim)  # eve never saw it: back to the queue's head
        raise
    except eve.EveTransportError:
        # Ambiguous (a 5xx, a timeout after the request went out): eve may have it. The claim
        # stays; the worker's next look resumes the busy record, which reads eve's stream from
        # the cursor and sends again only if eve never started the turn (F4). While eve itself
        # is up, the failure is counted: a message eve always fails on is sent a bounded number
        # of times (F6); an outage is waited out, never counted (R6).
        chat = await s.store.chat(address)
        if chat is not None and chat.eve_session and await _eve_is_up(s):  # the send's failure, not the session's
            await s.transitions.send_failed(address, claim, [m.id for m in messages])
        raise
    except Lost as exc:
        await end(s, address, claim, gone(SessionLost(str(exc)), exc.__cause__ or exc))
        return
    except Unheard as exc:
        await end(s, address, claim, NotHeard(exc.items))
        return
    except eve.EveRejected as exc:
        logger.error("eve_rejected_message", error=str(exc))
        await end(s, address, claim, Refused(f"eve: {exc.status}"))
        return
    chat = await s.store.chat(address)
    assert chat is not None
    await BusyPeriod(s, inbox, chat, slot=slot).run()


async def _resume_compaction(s: Services, inbox: Inbox, chat: Chat) -> None:
    assert chat.eve_session and chat.claim
    if chat.compact_phase is CompactPhase.WANTED:
        # Held for it, never requested (a /compact just captured, or parking's move into it cut by
        # a restart): eve never had it, so it is requested now. (A record of the schema before
        # the phase existed was migrated as "posted": its stream decides, below.)
        await BusyPeriod(s, inbox, chat).run()
        return
    try:
        page = await s.eve.read(chat.eve_session, chat.cursor)
    except eve.SessionGone as exc:
        await end(s, chat.address, chat.claim, gone(SessionLost(str(exc)), exc))
        return
    if any(_compaction_began(e) for e in page.events):
        await BusyPeriod(s, inbox, chat).run()
        return
    # Requested, but eve never began it (and the answer was lost with the process): free the
    # chat; an auto compaction is silent, a manual one asks for /compact again (R3).
    async with s.store.db.transaction():
        await s.transitions.drop_compaction(chat.address, chat.claim)
        if chat.origin is Origin.MANUAL:
            await s.outbox.say(chat, f"compact-again:{chat.claim}", t("compact_again", chat.compact_lang or chat.lang),
                               reply_to=chat.compact_reply_to)
    METRICS.compactions.labels(origin=str(chat.origin or Origin.AUTO), outcome="not_started").inc()
    logger.info("compaction_not_started_freed", origin=chat.origin)
