"""The compaction phase of a busy period: request, ack window, cancel, finish (C1-C7, M1-M5).

The phase lives in the record (``compact_phase``, ``compact_cancel``): WANTED → POSTED →
ACCEPTED, or POSTED → RELEASED when eve does not accept within ``IVA_COMPACT_ACK_SECONDS``
(the chat is let go and taken again when eve announces the compaction, C6). What eve's stream
says — the compaction was requested, it completed — is read again from the cursor after a
restart, so it stays in memory here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import eve_client as eve

from .. import log
from ..metrics import METRICS
from ..storage.payloads import Origin, QueuedMessage, decode
from ..storage.store import CancelMark, Chat, CompactPhase
from ..telegram.texts import t
from .endings import lose
from .services import Services

__all__ = ["Answer", "Compaction"]

logger = log.get("bridge.chat.compaction")


@dataclass(frozen=True, slots=True)
class Answer:
    """eve's answer to our compact request (or the error in its place), through the inbox."""

    result: eve.Accepted | eve.EveError
    claim: str  # the compaction whose request this answers (an old answer is not this one's)


class Compaction:
    """One compaction followed by the consumer. ``claim`` is None while the chat is released."""

    def __init__(self, s: Services, inbox: asyncio.Queue[object], chat: Chat) -> None:
        assert chat.eve_session
        self.s = s
        self.inbox = inbox
        self.address = chat.address
        self.session = chat.eve_session
        self.claim: str | None = chat.claim
        self.origin = chat.origin or Origin.AUTO
        self.before = chat.compact_before
        self.phase = chat.compact_phase or CompactPhase.WANTED
        self.cancel = chat.compact_cancel
        self.requested = False  # eve announced it (compaction.requested)
        self.completed = False  # compaction.completed
        self.ack_deadline: float | None = None
        self.request: str | None = None  # the claim the request was sent under

    @property
    def released(self) -> bool:
        return self.phase is CompactPhase.RELEASED

    @property
    def eve_has_it(self) -> bool:
        return self.phase is CompactPhase.ACCEPTED or self.requested

    def ack_left(self) -> float | None:
        """Seconds left for eve to accept, while we hold the chat waiting for it (C6)."""
        if self.ack_deadline is None or self.eve_has_it or self.released:
            return None
        return self.ack_deadline - asyncio.get_running_loop().time()

    # -- requesting ------------------------------------------------------------------------

    async def post(self) -> None:
        """WANTED → POSTED, then the request; its answer comes through the inbox (C5: once)."""
        assert self.claim is not None
        await self.s.transitions.compact_posted(self.address, self.claim)
        self.phase = CompactPhase.POSTED
        self.ack_deadline = asyncio.get_running_loop().time() + self.s.settings.compact_ack_seconds
        logger.info("compaction_requested", origin=self.origin, before=self.before)
        inbox, client, session, claim = self.inbox, self.s.eve, self.session, self.claim
        self.request = claim

        async def request() -> None:
            try:
                result: eve.Accepted | eve.EveError = await client.compact(session)
            except eve.EveError as exc:
                result = exc
            await inbox.put(Answer(result, claim))

        self.s.requests.start(self.address, request())

    async def ack_timeout(self, cursor: int) -> None:
        """eve did not accept within the window: let the chat go, watch for eve's announcement (C6)."""
        assert self.claim is not None
        await self.s.transitions.release(self.address, self.claim, cursor)
        self.claim, self.phase = None, CompactPhase.RELEASED
        logger.warning("compaction_ack_late_chat_released", seconds=self.s.settings.compact_ack_seconds)

    async def on_answer(self, result: eve.Accepted | eve.EveError, cursor: int) -> bool:
        """eve's HTTP answer to the request. True when the busy period is over."""
        if isinstance(result, eve.Accepted) and result.accepted:
            if not self.released and self.phase is not CompactPhase.ACCEPTED:
                assert self.claim is not None
                await self.s.transitions.compact_accepted(self.address, self.claim)
                self.phase = CompactPhase.ACCEPTED
            await self.send_cancel()  # a message asked for it before eve had the compaction
            return False
        if isinstance(result, eve.Accepted) or isinstance(result, eve.SessionGone):
            await lose(self.s, self.address, self.claim, f"compact: {result}")
            return True
        logger.warning("compaction_request_failed", error=str(result))
        if self.requested:
            return False  # eve started it anyway; its events decide
        await self.finish(ok=False, cursor=cursor)
        return True

    # -- eve's stream ----------------------------------------------------------------------

    async def on_event(self, event: eve.Event, cursor: int) -> bool:
        """An event of the compaction. True when the busy period is over."""
        match event:
            case eve.CompactionRequested():
                self.requested = True
                if self.released:
                    await self._recapture()
                elif self.phase is not CompactPhase.ACCEPTED:
                    assert self.claim is not None
                    await self.s.transitions.compact_accepted(self.address, self.claim)
                    self.phase = CompactPhase.ACCEPTED
                await self.send_cancel()
            case eve.CompactionCompleted():
                self.completed = True
            case eve.SessionWaiting() if self.requested or self.cancel is CancelMark.SENT:
                # A cancel that came after eve completed it cancelled nothing: it completed (C4/C7).
                await self.finish(ok=self.completed, cursor=cursor)
                return True
            case eve.TurnStarted():
                # A message reached eve while we watched a released compaction: it is a turn now.
                logger.info("compaction_watch_turn_started")
        return False

    async def _recapture(self) -> None:
        """C6: the late acceptance came after all; take the chat again until it waits. A message
        that came in the released window waits with it, and hears the C3 notice: the notice
        and the hold are one decision (seed 004: nothing goes to eve while it compacts)."""
        s = self.s
        async with s.store.db.transaction():
            claim = await s.transitions.recapture(self.address)
            if claim is None:
                return
            waiting = [m for m in map(decode, (m.payload for m in await s.queue.queued(self.address, limit=1)))
                       if isinstance(m, QueuedMessage)]
            noticed = bool(waiting) and s.settings.turn_policy == "queue" \
                and await s.transitions.notify_compacting(self.address)
            if noticed:
                chat = await s.store.chat(self.address)
                assert chat is not None
                await s.outbox.say(chat, f"c3:{claim}", t("compacting_notice", chat.lang),
                                   reply_to=waiting[0].message_id)
        self.claim, self.phase = claim, CompactPhase.ACCEPTED
        logger.info("compaction_chat_recaptured", noticed=noticed)
        if noticed:
            await s.outbox.flush(self.address)

    # -- C4: a message interrupts it -------------------------------------------------------

    async def interrupt(self) -> None:
        """A message arrived under the immediate policy: cancel the compaction — once eve has it,
        since a cancel that overtakes the compact request would cancel nothing."""
        if self.claim is None or self.cancel is not None:
            return
        if await self.s.transitions.want_cancel(self.address, self.claim):
            self.cancel = CancelMark.WANTED
            logger.info("compaction_interrupted_by_message", origin=self.origin, eve_has_it=self.eve_has_it)
        await self.send_cancel()

    async def send_cancel(self) -> None:
        if self.cancel is not CancelMark.WANTED or not self.eve_has_it or self.claim is None:
            return
        try:
            await self.s.eve.cancel(self.session)
        except eve.EveError as exc:
            logger.warning("compaction_cancel_failed", error=str(exc))
            return
        await self.s.transitions.cancel_sent(self.address, self.claim)
        self.cancel = CancelMark.SENT

    # -- the end ---------------------------------------------------------------------------

    async def finish(self, *, ok: bool, cursor: int) -> None:
        """C7: session.waiting after the compaction; without compaction.completed it failed."""
        s = self.s
        async with s.store.db.transaction():
            done = await s.transitions.finish_compaction(self.address, self.claim, cursor=cursor, ok=ok)
            chat = done.chat
            if chat.origin is Origin.MANUAL:
                # Live, or finished while we were down (R2): the person hears how it ended.
                lang = chat.compact_lang or chat.lang
                await s.outbox.say(chat, f"compact:{chat.claim or f'{self.session}:{cursor}'}:{done.outcome}",
                                   t("compact_done" if ok else "compact_failed", lang),
                                   reply_to=chat.compact_reply_to)
        METRICS.compactions.labels(origin=str(self.origin), outcome=done.outcome).inc()
        logger.info("compaction_finished", origin=self.origin, outcome=done.outcome, before=self.before)
        if chat.origin is Origin.MANUAL:
            await s.outbox.flush(self.address)
