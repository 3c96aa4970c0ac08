"""The compaction phase of a busy period and its released watch (C1-C7, M1-M5).

The compaction's phase lives in the record (``compact_phase``, ``compact_cancel``): WANTED →
POSTED → ACCEPTED, or POSTED → RELEASED when eve does not accept within
``IVA_COMPACT_ACK_SECONDS``: the chat is let go (:class:`WatchPhase`) and taken again when eve
announces the compaction (C6). What eve's stream says — the compaction was requested, it
completed — is read again from the cursor after a restart, so it stays in memory here.
"""

from __future__ import annotations

import enum

import eve_client as eve

from ... import log
from ...metrics import METRICS
from ...push import turns as pushed
from ...storage.payloads import Origin, QueuedMessage, decode
from ...storage.store import CancelMark, Chat, CompactPhase
from ...telegram.texts import t
from ..endings import SessionLost
from .base import CompactAnswer, Ended, Period, Phase, Stop, apply

__all__ = ["Compaction", "CompactionPhase", "WatchPhase"]

logger = log.get(__name__)


class Heard(enum.Enum):
    """What eve's stream said of the compaction so far."""

    NOTHING = "nothing"
    REQUESTED = "requested"  # the compaction began at eve: eve has it
    COMPLETED = "completed"  # it ended completed: the summary is in
    FAILED = "failed"  # it ended failed or interrupted (eve 1.x says so; 0.80 only goes idle)


class Compaction:
    """The facts of one compaction (its claim is the period's: None while released)."""

    def __init__(self, chat: Chat) -> None:
        self.origin = chat.origin or Origin.AUTO
        self.before = chat.compact_before
        self.phase = chat.compact_phase or CompactPhase.WANTED
        self.cancel = chat.compact_cancel
        self.heard = Heard.NOTHING
        self.ack_deadline: float | None = None
        self.request: str | None = None  # the claim the request was sent under

    @property
    def eve_has_it(self) -> bool:
        return self.phase is CompactPhase.ACCEPTED or self.heard is not Heard.NOTHING


class CompactionPhase(Phase):
    """busy(compacting): the request, the ack window, a cancel (C4), the end (C7)."""

    def __init__(self, p: Period, c: Compaction, *, stop: Stop = Stop.NONE) -> None:
        super().__init__(p)
        self.c = c
        self.stop = stop

    async def enter(self) -> None:
        if self.c.phase is CompactPhase.WANTED:
            await self.post()
        if self.stop:
            await self._stop()  # asked for before a restart: a stop is durable

    def deadline(self) -> tuple[float, str]:
        busy_left, c = self.p.busy_left(), self.c
        if c.ack_deadline is not None and not c.eve_has_it:
            ack_left = c.ack_deadline - self.p.clock.now()
            if ack_left < busy_left:
                return ack_left, "ack"
        return busy_left, "busy"

    async def on_timeout(self, why: str) -> Phase | Ended | None:
        if why != "ack":
            return await super().on_timeout(why)
        # eve did not accept within the window: let the chat go, watch for its announcement (C6).
        p = self.p
        await p.s.transitions.release(p.address, p.owned(), p.cursor)
        p.claim, self.c.phase = None, CompactPhase.RELEASED
        logger.warning("compaction_ack_late_chat_released", seconds=p.s.settings.compaction.ack_seconds)
        if await p.s.queue.depth(p.address):
            p.poke()
        return WatchPhase(p, self.c)

    async def on_poke(self, chat: Chat) -> Phase | Ended | None:
        if chat.stop_wanted and Stop.CANCELLED not in self.stop:
            await self._stop()
        elif self.p.s.settings.chat.turn_policy == "immediate" and await pushed.person_depth(self.p.s.store.db,
                                                                                        self.p.address):
            await self.interrupt()  # C4 (a pushed turn waits for the compaction instead)
        return None

    async def _stop(self) -> None:
        """L*: /stop cancels the compaction as under C4."""
        if Stop.WANTED not in self.stop:
            METRICS.stops.labels(kind="compaction").inc()
        self.stop |= Stop.WANTED
        await self.p.end_draft()
        await self.p.stop_typing()
        await self.interrupt()
        self.stop |= Stop.CANCELLED

    # -- requesting ------------------------------------------------------------------------

    async def post(self) -> None:
        """WANTED → POSTED, then the request; its answer comes through the inbox (C5: once)."""
        p, c = self.p, self.c
        claim = p.owned()
        await p.s.transitions.compact_posted(p.address, claim)
        c.phase = CompactPhase.POSTED
        c.ack_deadline = p.clock.now() + p.s.settings.compaction.ack_seconds
        logger.info("compaction_requested", origin=c.origin, before=c.before)
        inbox, client, session = p.inbox, p.s.eve, p.session
        c.request = claim

        async def request() -> None:
            try:
                result: eve.Accepted | eve.EveError = await client.compact(session)
            except eve.EveError as exc:
                result = exc
            await inbox.put(CompactAnswer(result, claim))

        p.s.requests.start(p.address, request())

    async def on_answer(self, answer: CompactAnswer) -> Phase | Ended | None:
        """eve's HTTP answer to the request."""
        p, c, result = self.p, self.c, answer.result
        if answer.claim != c.request:
            return None  # an old request's
        if isinstance(result, eve.Accepted) and result.accepted:
            if c.phase not in (CompactPhase.RELEASED, CompactPhase.ACCEPTED):
                await p.s.transitions.compact_accepted(p.address, p.owned())
                c.phase = CompactPhase.ACCEPTED
            await self.send_cancel()  # a message asked for it before eve had the compaction
            return None
        if isinstance(result, eve.Accepted | eve.SessionGone):
            return Ended(SessionLost(f"compact: {result}"))
        logger.warning("compaction_request_failed", error=str(result))
        if c.heard is not Heard.NOTHING:
            return None  # eve started it anyway; its events decide
        await self.finish(ok=False)
        return Ended()

    # -- eve's stream ----------------------------------------------------------------------

    async def on_event(self, event: eve.Event) -> Phase | Ended | None:
        c = self.c
        match event:
            case eve.ContextStarted(kind="compaction", in_turn=False):
                return await self.announced()
            case eve.ContextSettled(kind="compaction", in_turn=False):
                c.heard = Heard.COMPLETED if event.ok else Heard.FAILED
            case eve.Idle() if c.heard is not Heard.NOTHING or c.cancel is CancelMark.SENT:
                # A cancel that came after eve completed it cancelled nothing: it completed (C4/C7).
                await self.finish(ok=c.heard is Heard.COMPLETED)
                return Ended()
            case eve.TurnBegan():
                # A message reached eve while we watched a released compaction: it is a turn now.
                logger.info("compaction_watch_turn_started")
        return None

    async def announced(self) -> Phase | Ended | None:
        p, c = self.p, self.c
        c.heard = Heard.REQUESTED
        if c.phase is not CompactPhase.ACCEPTED:
            await p.s.transitions.compact_accepted(p.address, p.owned())
            c.phase = CompactPhase.ACCEPTED
        await self.send_cancel()
        return None

    # -- C4: a message interrupts it -------------------------------------------------------

    async def interrupt(self) -> None:
        """A message arrived under the immediate policy: cancel the compaction — once eve has it,
        since a cancel that overtakes the compact request would cancel nothing."""
        p, c = self.p, self.c
        if p.claim is None or c.cancel is not None:
            return
        if await p.s.transitions.want_cancel(p.address, p.claim):
            c.cancel = CancelMark.WANTED
            logger.info("compaction_interrupted_by_message", origin=c.origin, eve_has_it=c.eve_has_it)
        await self.send_cancel()

    async def send_cancel(self) -> None:
        p, c = self.p, self.c
        if c.cancel is not CancelMark.WANTED or not c.eve_has_it or p.claim is None:
            return
        try:
            await p.s.eve.cancel(p.session)
        except eve.EveError as exc:
            logger.warning("compaction_cancel_failed", error=str(exc))
            return
        await p.s.transitions.cancel_sent(p.address, p.claim)
        c.cancel = CancelMark.SENT

    # -- the end ---------------------------------------------------------------------------

    async def finish(self, *, ok: bool) -> None:
        """C7: eve idle after the compaction; unless it said the compaction completed, it failed."""
        p, s, c = self.p, self.p.s, self.c
        async with s.store.db.transaction():
            done = await s.transitions.finish_compaction(p.address, p.claim, cursor=p.cursor, ok=ok)
            chat = done.chat
            if chat.origin is Origin.MANUAL:
                # Live, or finished while we were down (R2): the person hears how it ended.
                lang = chat.compact_lang or chat.lang
                await s.outbox.say(chat, f"compact:{chat.claim or f'{p.session}:{p.cursor}'}:{done.outcome}",
                                   t("compact_done" if ok else "compact_failed", lang),
                                   reply_to=chat.compact_reply_to)
        METRICS.compactions.labels(origin=str(c.origin), outcome=done.outcome).inc()
        logger.info("compaction_finished", origin=c.origin, outcome=done.outcome, before=c.before)


class WatchPhase(CompactionPhase):
    """released (C6): the chat is free, and we watch for eve's late announcement of the
    compaction, which takes the chat again; a message, or the busy timeout (C10), ends the watch."""

    def deadline(self) -> tuple[float, str]:
        return self.p.busy_left(), "busy"

    async def on_timeout(self, why: str) -> Phase | Ended | None:
        await self.p.s.transitions.end_watch(self.p.address)
        logger.info("compaction_watch_ended")  # the chat is free already
        return Ended()

    async def on_poke(self, chat: Chat) -> Phase | Ended | None:
        # A message (or a /compact that took the free chat) ends the watch — unless eve announced
        # the compaction meanwhile: the worker takes it from here; eve's later compaction events
        # then show up in that consumer's stream.
        if chat.busy:
            return Ended()
        if not await self.p.s.queue.depth(self.p.address):
            return None
        taken = await self._read_ahead()
        if taken is None:
            return Ended()
        if isinstance(taken, CompactionPhase) and not isinstance(taken, WatchPhase):
            await taken.on_poke(chat)  # held: the compaction's rule for a message applies (C3, C4)
        return taken

    async def _read_ahead(self) -> Phase | Ended | None:
        """eve may have announced the compaction already, in what the open stream has not brought
        yet: eve's stream read to its tail and applied up to the announcement. The phase that
        follows (the compaction, the chat taken again: the message waits and hears the C3
        notice), or None when eve did not announce it."""
        try:
            page = await self.p.s.eve.read(self.p.session, self.p.cursor)
        except eve.EveError:
            return None  # the stream decides, as before
        for event in page.events:
            step = await apply(self, event)
            if step is not None or (isinstance(event, eve.ContextStarted) and event.kind == "compaction"):
                return step
        return None

    async def announced(self) -> Phase | Ended | None:
        """C6: the late acceptance came after all; take the chat again until it waits. A message
        that came in the released window waits with it, and hears the C3 notice: the notice
        and the hold are one decision (seed 004: nothing goes to eve while it compacts)."""
        p, s, c = self.p, self.p.s, self.c
        c.heard = Heard.REQUESTED
        async with s.store.db.transaction():
            claim = await s.transitions.recapture(p.address)
            if claim is None:
                return None  # a turn or a /new came first
            waiting = [m for m in map(decode, (m.payload for m in await s.queue.queued(p.address, limit=1)))
                       if isinstance(m, QueuedMessage)]
            noticed = bool(waiting) and s.settings.chat.turn_policy == "queue" \
                and await s.transitions.notify_compacting(p.address)
            if noticed:
                chat = await s.store.chat(p.address)
                assert chat is not None
                await s.outbox.say(chat, f"c3:{claim}", t("compacting_notice", chat.lang),
                                   reply_to=waiting[0].message_id)
        p.claim, c.phase = claim, CompactPhase.ACCEPTED
        logger.info("compaction_chat_recaptured", noticed=noticed)
        return CompactionPhase(p, c)
