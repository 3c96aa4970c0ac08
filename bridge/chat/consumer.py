"""One busy period of a chat, followed on eve's durable stream: a turn, its parking, a compaction.

The consumer reads events from the saved cursor and commits each effect (an outbox row, the
chat's release, the move into compaction) together with the cursor, through the transitions. A
restart starts the same consumer from the saved cursor, for a turn and a compaction alike (R1,
R2): there is one busy record and one procedure.

At the turn's last ``session.waiting`` the parking handler measures and, at or above the
threshold, moves the chat from busy(turn) to busy(compacting, auto) in the same transaction
that finishes the turn, so no message slips in between (C1, C2); :mod:`.compaction` follows it
from there.

The consumer is given the services and the worker's inbox, never the worker: what arrives for
the chat while it is busy comes as a :data:`POKE` in the inbox, next to the stream's events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog

import eve_client as eve

from .. import backoff, log
from ..metrics import METRICS
from ..push import turns as pushed
from ..storage.payloads import InputAnswer, Kind, PromptButton, QueuedMessage, decode
from ..storage.store import Chat, CompactPhase
from ..telegram.sender import Typing
from ..telegram.texts import number, t
from . import albums, draftids, notewrites, owners, speak
from .compaction import Answer, Compaction
from .delivery import Lost, Unheard, send
from .endings import lose, say_unheard
from .live import Draft, progress_line
from .services import Services, Slot
from .transitions import Superseded

__all__ = ["POKE", "BusyPeriod"]

logger = log.get("bridge.chat.consumer")

RESUME_GRACE = 10.0
WAITING_ON_PERSON = 7 * 24 * 3600.0  # a question open this long without an answer: the turn is lost
POKE = object()
# What a handler raises on an event of a shape it does not expect (a bad event, F6).
BAD_EVENT = (LookupError, TypeError, ValueError, AttributeError, ArithmeticError)
_STREAM_END = object()


def _steer_claim(claim: str) -> str:
    """What a steer's messages are claimed under until eve's acceptance of them is recorded (F4)."""
    return f"{claim}:steer"


class BusyPeriod:
    def __init__(self, s: Services, inbox: asyncio.Queue[object], chat: Chat, *, slot: Slot | None = None) -> None:
        assert chat.eve_session and chat.busy
        self.s = s
        self.inbox = inbox
        self.address = chat.address
        self.chat = chat
        self.claim: str | None = chat.claim
        self.session = chat.eve_session
        self.cursor = chat.cursor
        self.pending = set(chat.deliveries)
        self.deliveries_known = bool(chat.deliveries)
        self.turn_ended = False
        self.prompted = False
        self.measurement: int | None = None
        self.first_measurement: int | None = None  # a compaction's "after" (seed 004)
        self.compaction = Compaction(s, inbox, chat) if chat.kind is Kind.COMPACT else None
        self.progress = time.monotonic()
        timeout = s.settings.busy_timeout
        if chat.progress_at:
            # The time since the last persisted progress counts (a restart does not reset it), but
            # a resumed consumer always gets a moment to read what eve wrote meanwhile.
            grace = min(timeout, RESUME_GRACE)
            self.progress -= s.transitions.spent(chat.progress_at, limit=timeout - grace)  # F9: no step counts
        self.typing: Typing | None = None
        self.waiting_input = chat.waiting_input
        self.answered = False  # the person answered the open question: eve must go on now
        self.slot = slot
        self.in_turn = False  # between eve's turn.started and the turn's end
        # C6: a compaction released before this turn may still be announced by eve; if it is,
        # outside a turn, the person hears the C3 notice and the turn's end need not watch for it.
        self.outstanding = chat.kind is Kind.TURN and chat.compact_phase is CompactPhase.RELEASED
        self.announced = False
        # L*: the live draft (private chats), the text block being written, and the stop.
        self.draft: Draft | None = None
        self.block = ""
        self.draft_id = 0
        self.turn_id: str | None = None
        self.steer_grace: float | None = None  # parking waits until then for eve's turn with an unsure steer
        self.unsent_grace: float | None = None  # an unrecorded send: resent if eve begins no turn by then
        self.stopping = chat.stop_wanted
        self.cancel_sent = False  # eve accepted the stop's cancel (until then a poke tries again)
        self.cancel_failures = 0
        self.cancel_retry: asyncio.TimerHandle | None = None
        self.reader: asyncio.Task[None]  # the stream's reader (a new one after an unexpected error)
        self.reader_failures = 0
        self.stopped_shown = False
        self.usage = [0, 0, 0, 0]  # steps, input, output, cache read: spend not yet committed

    async def _commit_spend(self) -> None:
        """Inside a transaction that moves the cursor: the usage read up to it, exactly once."""
        calls, tokens_in, tokens_out, cached = self.usage
        if calls:
            await self.s.store.add_spend(self.address, "turns", calls=calls, input_tokens=tokens_in,
                                         output_tokens=tokens_out, cache_read_tokens=cached)
            self.usage = [0, 0, 0, 0]

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        structlog.contextvars.bind_contextvars(session=self.session)
        if self.compaction is None:
            self.typing = Typing(self.s.sender.bot, self.chat.chat_id, self.chat.thread_id,
                                 ttl=self.s.settings.busy_timeout)
            self.typing.start()
            if self.s.settings.streaming == "draft" and self.chat.chat_id > 0:  # drafts: private chats only
                self.draft = Draft(self.s.sender.bot, self.chat.chat_id, self.chat.thread_id)
        self.reader = asyncio.create_task(self._reader(), name=f"stream:{self.address}")
        started = time.monotonic()
        try:
            if self.compaction is not None and self.compaction.phase is CompactPhase.WANTED:
                await self.compaction.post()
            if self.stopping:
                await self._stop()  # asked for before a restart: a stop is durable
            await self._loop()
        except Superseded as exc:
            # The record moved on without us (a /new retired the period): nothing more to do here.
            logger.info("busy_period_superseded", reason=str(exc))
        finally:
            if self.typing is not None:
                await self.typing.stop()
            if self.draft is not None:
                await self.draft.close()
            self.reader.cancel()
            # Wait for the reader without taking its cancellation for ours: a consumer cancelled
            # here (shutdown) must still end, not swallow the CancelledError and go on.
            await asyncio.wait({self.reader})
            # What the reader had queued is dropped; a later consumer starts again from the cursor.
            while not self.inbox.empty():
                self.inbox.get_nowait()
        METRICS.turn_seconds.observe(time.monotonic() - started)

    async def _reader(self) -> None:
        try:
            async for event in self.s.eve.stream(self.session, self.cursor):
                await self.inbox.put(event)
            await self.inbox.put(_STREAM_END)
        except Exception as exc:  # not only eve's errors: the loop must see any end
            # An error the client did not translate (a bug, a closed client) would otherwise end the
            # reader unseen and leave the loop waiting out the busy timeout, losing the turn.
            await self.inbox.put(exc)

    def _deadline(self) -> tuple[float, str]:
        if self.steer_grace is not None:
            return self.steer_grace - time.monotonic(), "steer"
        if self.unsent_grace is not None:
            return self.unsent_grace - time.monotonic(), "unsent"
        if self.waiting_input and not self.answered and not self.stopping:
            # F5: waiting on the person is not "no progress": no busy timeout while a question
            # is open; a late answer reaches the same session. Once answered, eve must go on
            # within the busy timeout again (a session stuck since eve restarted is lost then).
            return WAITING_ON_PERSON, "busy"
        busy_left = self.s.settings.busy_timeout - (time.monotonic() - self.progress)
        ack_left = self.compaction.ack_left() if self.compaction is not None else None
        if ack_left is not None and ack_left < busy_left:
            return ack_left, "ack"
        return busy_left, "busy"

    async def _loop(self) -> None:
        while True:
            remaining, why = self._deadline()
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    item = await self.inbox.get()
            except TimeoutError:
                if why == "unsent":
                    # eve is idle and began no turn with our message: it never had it. Back to the
                    # head of the queue; the worker sends it again (F4, counted as before: F6).
                    logger.info("unrecorded_send_not_at_eve")
                    await self.s.transitions.give_back(self.address, self._owned())
                    return
                if why == "steer":
                    # eve began no turn with the unsure steer: it never had it (parking puts it back
                    # at the head of the queue, for the next turn).
                    self.steer_grace = None
                    logger.info("unsure_steer_not_at_eve")
                    if await self._park(self._owned()):
                        return
                    continue
                c = self.compaction
                if why == "ack" and c is not None:
                    await c.ack_timeout(self.cursor)
                    self.claim = None
                    if await self.s.queue.depth(self.address):
                        self.inbox.put_nowait(POKE)
                    continue
                if c is not None and c.released:
                    await self.s.transitions.end_watch(self.address)
                    logger.info("compaction_watch_ended")  # the chat is free already
                    return
                logger.warning("busy_timeout", seconds=self.s.settings.busy_timeout)
                await self._lose("no progress within the busy timeout")
                return
            if item is POKE:
                if await self._on_poke():
                    return
                continue
            if isinstance(item, Answer):
                c = self.compaction
                if c is not None and item.claim == c.request and await c.on_answer(item.result, self.cursor):
                    return
                self._sync_claim()
                continue
            if item is _STREAM_END:
                await self._lose("eve closed the session stream")
                return
            if isinstance(item, eve.SessionGone):
                await self._lose(str(item))
                return
            if isinstance(item, eve.EveError):
                METRICS.eve_errors.labels(kind="stream").inc()
                raise item  # the worker waits and starts over from the cursor
            if isinstance(item, Exception):
                # The reader's unexpected end (an error eve_client did not translate): logged, and
                # a new reader from the cursor after a pause, in this busy period — so the busy
                # timeout still counts: the same error at the same place each time is a stuck
                # turn, lost when the timeout comes (F6), never a chat busy for ever.
                self.reader_failures += 1
                logger.error("stream_reader_failed", error=repr(item)[:300], failures=self.reader_failures)
                await asyncio.sleep(min(5.0, backoff.EVE.delay(self.reader_failures)))
                self.reader = asyncio.create_task(self._reader(), name=f"stream:{self.address}")
                continue
            assert isinstance(item, eve.Event)
            if await self._apply(item):
                return

    async def _apply(self, item: eve.Event) -> bool:
        """One event of eve's stream. True when this busy period ended."""
        if item.index < self.cursor:
            return False  # applied already (read ahead of the stream)
        self.progress = time.monotonic()
        self.cursor = item.index + 1
        if isinstance(item, eve.SessionCompleted | eve.SessionFailed):
            await self._lose(item.type)
            return True
        try:
            if self.compaction is not None:
                done = await self.compaction.on_event(item, self.cursor)
                self._sync_claim()
                return done
            return await self._on_turn_event(item)
        except BAD_EVENT:
            # F6: an event we cannot take (a field of a shape no handler expects) is logged
            # and skipped: its transaction rolled back, the next effect moves the cursor past
            # it. Replaying it after a restart skips it again; it never wedges the chat.
            # Faults of the database, eve or Telegram are not in BAD_EVENT: they propagate
            # and the worker retries from the cursor.
            METRICS.eve_errors.labels(kind="event").inc()
            logger.exception("eve_event_skipped", type=item.type, index=item.index, event_id=item.id)
            return False

    async def _read_ahead(self) -> bool:
        """C6: a message came while we watch a released compaction. eve may have announced it
        already, in what the open stream has not brought yet: read eve's stream to its tail
        and apply it up to the announcement. True when it was announced (the chat is taken
        again: the message waits for the compaction and hears the C3 notice)."""
        try:
            page = await self.s.eve.read(self.session, self.cursor)
        except eve.EveError:
            return False  # the stream decides, as before
        for event in page.events:
            if await self._apply(event):
                return False
            if isinstance(event, eve.CompactionRequested):
                return self.compaction is not None and not self.compaction.released
        return False

    def _sync_claim(self) -> None:
        if self.compaction is not None:
            self.claim = self.compaction.claim

    def _owned(self) -> str:
        if self.claim is None:
            raise Superseded(f"{self.address}: the chat was released")
        return self.claim

    # -- the turn ---------------------------------------------------------------------------

    async def _on_turn_event(self, event: eve.Event) -> bool:
        s, chat, tr = self.s, self.chat, self.s.transitions
        claim = self._owned()
        if isinstance(event, eve.TurnStarted | eve.MessageReceived) and not self.deliveries_known \
                and event.delivery_ids:
            # Our send's answer was lost (an ambiguous send, F4), so no delivery is on the record:
            # this is the turn eve made of it. Recorded now, so that a restart after the cursor
            # has passed this point follows the turn instead of sending again.
            for delivery in event.delivery_ids:
                await tr.delivered(self.address, claim, delivery)
            self.pending.update(event.delivery_ids)
            self.deliveries_known = True
        elif isinstance(event, eve.TurnStarted | eve.MessageReceived) and event.delivery_ids:
            await self._adopt_steer(claim, event.delivery_ids)
        if not self.deliveries_known and not self.in_turn and not self.turn_ended:
            # Our send's answer was lost and eve has shown no turn of it yet: it may be queued behind
            # what eve runs (a compaction: its turn starts right after the session.waiting,
            # PROTOCOL.md §5). Idle with no turn for a moment: eve never had it.
            grace = self.s.settings.eve_grace
            self.unsent_grace = time.monotonic() + grace if isinstance(event, eve.SessionWaiting) else None
        match event:
            case eve.MessageAppended():
                self.block += event.delta
                self._show(event.index, self.block)
            case eve.ActionInputAppended() | eve.ActionsRequested() if not self.block.strip():
                tools = [event.tool_name] if isinstance(event, eve.ActionInputAppended) else event.tool_names
                if tools and tools[0]:
                    self._show(event.index, progress_line(tools[0], chat.lang))
            case eve.MessageCompleted():
                text, self.block, self.draft_id = event.message, "", 0
                if self.draft is not None:
                    await self.draft.settle()  # no frame may land after the final message
                if text.strip() and not (self.stopping and self.stopped_shown):
                    if self.stopping:  # written before the stop reached eve: readable, marked
                        text, self.stopped_shown = f"{text}\n\n{t('stopped_mark', chat.lang)}", True
                    async with s.store.db.transaction():
                        await s.store.put_outgoing(self.address, event.id, chat.chat_id, chat.thread_id, text)
                        await tr.advance(self.address, claim, self.cursor)
                        await self._commit_spend()
                    if self.typing is not None and event.finish_reason == "stop":
                        await self.typing.stop()  # never after the final send (LESSONS #12)
                    await s.outbox.flush(self.address)
                    await speak.after_answer(s, self.address, chat.chat_id, chat.thread_id, text)  # P4
            case eve.TurnStarted() | eve.StepStarted():
                if isinstance(event, eve.TurnStarted):
                    self.in_turn, self.turn_id = True, event.turn_id or self.turn_id
                    if self.stopping:
                        await self._stop()  # stopped before eve began it: cancel it by its id now
                if self.typing is not None and not self.stopping:
                    self.typing.start()
            case eve.StepCompleted():
                usage = event.usage
                if usage is not None and usage.input_tokens is not None:
                    self.measurement = usage.input_tokens
                    self.first_measurement = self.first_measurement or usage.input_tokens
                if usage is not None:
                    self.usage[0] += 1
                    self.usage[1] += usage.input_tokens or 0
                    self.usage[2] += usage.output_tokens or 0
                    self.usage[3] += usage.cache_read_tokens or 0
            case eve.CompactionRequested() if self.outstanding and not self.in_turn and not self.announced:
                # C6: the compaction released before this turn, announced now; our message waits
                # behind it at eve: the person hears the C3 notice.
                self.announced = True
                logger.info("compaction_announced_late", estimate=event.usage_input_tokens)
                await self._end_draft()
                async with s.store.db.transaction():
                    await s.outbox.say(chat, f"c3:{event.id}", t("compacting_notice", chat.lang))
                    await tr.advance(self.address, claim, self.cursor)
                await s.outbox.flush(self.address)
            case eve.CompactionRequested():
                logger.info("eve_in_turn_compaction", estimate=event.usage_input_tokens)  # eve's, not ours
            case eve.CompactionCompleted():
                await tr.in_turn_compacted(self.address, claim, self.cursor)
            case eve.InputRequested():
                await self._end_draft()
                await self._show_prompts(event, claim)
            case eve.TurnWaiting() if event.on == "input":
                # T5: the turn cannot end until the person answers; their next message goes at once.
                self.waiting_input, self.answered = True, False
                await tr.waiting_on_person(self.address, claim, waiting=True, cursor=self.cursor)
                if self.typing is not None:
                    await self.typing.stop()
                if self.slot is not None:
                    self.slot.give_back()  # F5: other chats' turns go on meanwhile
            case eve.InputResolved():
                await s.store.close_prompts(self.session, event.request_ids)
            case eve.TurnFailed():
                logger.warning("eve_turn_failed", code=event.code, error=event.message[:300])
                METRICS.turns.labels(outcome="failed").inc()
                await self._end_draft()
                async with s.store.db.transaction():
                    await s.outbox.say(chat, f"failed:{event.id}", await pushed.turn_failed(s.queue, chat, event.code or "error")
                                       or t("turn_failed", chat.lang, reason=event.code or "error"))  # W4
                    await tr.advance(self.address, claim, self.cursor)
                    await self._commit_spend()
                await s.outbox.flush(self.address)
        if self.waiting_input and (isinstance(event, eve.StepStarted | eve.InputResolved) or event.terminal):
            self.waiting_input = False
            self.progress = time.monotonic()
            await tr.waiting_on_person(self.address, claim, waiting=False)
            if self.slot is not None and not event.terminal:
                await self.slot.retake()
        if event.terminal:
            self.in_turn = False
            if self.stopping and self.block.strip() and not self.stopped_shown:
                # L*: what was written before the stop stays readable, marked as stopped.
                if self.draft is not None:
                    await self.draft.settle()
                async with s.store.db.transaction():
                    await s.store.put_outgoing(self.address, f"stopped:{event.id}", chat.chat_id, chat.thread_id,
                                               f"{self.block}\n\n{t('stopped_mark', chat.lang)}")
                    await tr.advance(self.address, claim, self.cursor)
                self.stopped_shown = True
                await s.outbox.flush(self.address)
            self.block, self.draft_id = "", 0
            if self.prompted:
                await s.store.close_prompts(self.session)
            self.turn_ended = True
            self.pending.difference_update(event.delivery_ids)
            if not self.deliveries_known:
                self.pending.clear()
        if isinstance(event, eve.SessionWaiting) and self.turn_ended and not self.pending:
            if await self._unsure_steer(claim):
                # A steer eve may have (its send's answer lost, or a restart before it was recorded)
                # and no sign of it yet: eve starts a turn with it right after session.waiting if
                # it has it (PROTOCOL.md §4). Park only once that did not come (F4).
                self.steer_grace = time.monotonic() + self.s.settings.eve_grace
                return False
            return await self._park(claim)
        return False

    async def _unsure_steer(self, claim: str) -> list[int]:
        """The messages of a steer eve may or may not have (still under the steer's own claim)."""
        return [m.id for m in await self.s.queue.inflight(self.address) if m.claim == _steer_claim(claim)]

    async def _adopt_steer(self, claim: str, deliveries: Sequence[str]) -> None:
        """F4 for a steer: eve shows a message we have no record of sending while a steer is unsure —
        it is that steer. Recorded as the turn's, so it is answered here and never sent again."""
        steered = await self._unsure_steer(claim)
        if not steered:
            return
        chat = await self.s.store.chat(self.address)
        unknown = [d for d in deliveries if chat is not None and d not in chat.deliveries]
        if not unknown:
            return
        for delivery in unknown:
            await self.s.transitions.delivered(self.address, claim, delivery, steered=steered,
                                               steer_claim=_steer_claim(claim))
            steered = []
        self.pending.update(unknown)
        self.turn_ended, self.steer_grace = False, None
        logger.info("unsure_steer_found_at_eve", deliveries=unknown)
        self.inbox.put_nowait(POKE)  # messages that waited behind it may steer now

    async def _park(self, claim: str) -> bool:
        """The parking handler: release the chat, or move it straight into a compaction (C1, C2)."""
        s = self.s
        async with s.store.db.transaction():
            parked = await s.transitions.park(
                self.address, claim, cursor=self.cursor, measurement=self.measurement, threshold=s.threshold(),
                may_compact=not s.requests.outstanding(self.address), announced=self.announced,
                first=self.first_measurement,
            )
            await self._commit_spend()
            chat = parked.chat
            told = await notewrites.tell_writes(s, chat, claim, parked.inflight)  # seed 000: every write visible
            if parked.after_before is not None and parked.decision.after is not None:
                await s.outbox.say(chat, f"after:{self.cursor}:{chat.claim}",
                                   t("compact_after", chat.compact_lang or chat.lang, after=number(parked.decision.after),
                                     before=number(parked.after_before)))
        METRICS.turns.labels(outcome="completed").inc()
        logger.info("turn_finished", measurement=self.measurement, messages=len(parked.inflight),
                    threshold=s.threshold(), compacting=parked.compaction_claim is not None,
                    **parked.decision.updates)
        if parked.after_before is not None:
            await s.outbox.flush(self.address)
        if told is not None:
            await s.outbox.flush(told)
        if chat.owner_turn and s.rebuilder is not None and s.rebuilder.wanted(self.address):
            # N7: after the turn, beside the compaction, never in front of the reply (sent already).
            s.spawn(s.rebuilder.maybe_run(self.address))
        if parked.compaction_claim is None:
            if chat.compact_phase is not CompactPhase.RELEASED:
                return True
            watched = await s.store.chat(self.address)
            if watched is None or watched.compact_phase is not CompactPhase.RELEASED:
                return True  # announced during the turn: nothing outstanding
            # C6: the compaction released before this turn is still outstanding at eve: watch
            # for its announcement (which takes the chat again) as the released watch does.
            if self.typing is not None:
                await self.typing.stop()
                self.typing = None
            self.claim = None
            self.compaction = Compaction(s, self.inbox, watched)
            logger.info("compaction_watch_resumed_after_turn")
            return False
        # busy(turn) → busy(compacting, auto): auto compaction is silent (C11).
        if self.typing is not None:
            await self.typing.stop()
            self.typing = None
        if self.draft is not None:
            await self.draft.close()
            self.draft = None
        current = await s.store.chat(self.address)
        assert current is not None
        # The turn's stop is over with the turn (the record's mark was cleared when it parked):
        # a /stop now stops the compaction.
        self.stopping = current.stop_wanted
        self.cancel_sent = self.stopped_shown = False
        self.claim = parked.compaction_claim
        self.compaction = Compaction(s, self.inbox, current)
        await self.compaction.post()
        return False

    # -- what arrives while busy ------------------------------------------------------------

    async def _on_poke(self) -> bool:
        """Something arrived for this chat while it is busy. True when this busy period ended."""
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        if chat.reset_requested:
            return True  # /new: the worker resets (eve's reset cancels a turn or a compaction)
        if chat.stop_wanted and not self.cancel_sent:
            await self._stop()  # the first stop, or one whose cancel eve has not accepted yet
            return False
        c = self.compaction
        if c is not None:
            if c.released:
                # While we only watch, a message (or a /compact that took the free chat) ends the
                # watch — unless eve announced the compaction meanwhile: the worker takes it from
                # here; eve's later compaction events then show up in that consumer's stream.
                if chat.busy:
                    return True
                if not await self.s.queue.depth(self.address):
                    return False
                if not await self._read_ahead():
                    return True
            if self.s.settings.turn_policy == "immediate" and await pushed.person_depth(self.s.store.db, self.address):
                await c.interrupt()  # C4 (a pushed turn waits for the compaction instead)
            return False
        if self.stopping:
            return False  # what arrives after a stop waits for the next turn, never joins this one
        if chat.kind is Kind.TURN and (self.waiting_input or self.s.settings.turn_policy == "immediate"):
            return await self._steer(chat)
        return False

    def _show(self, index: int, text: str) -> None:
        """The live draft shows ``text`` (one draft id per text block, from its first event)."""
        if self.draft is None or self.stopping:
            return
        if not self.draft_id:
            # Non-zero, the same when a restart replays the block, and naming this turn: a late
            # press of a finished draft's stop button never stops the turn after it.
            self.draft_id = draftids.draft_id(self._owned(), index)
        self.draft.show(self.draft_id, text)

    async def _stop(self) -> None:
        """L*: the person asked to stop (the draft's button, /stop; durable on the record). A turn
        is cancelled in eve by its id (the conversation stays); a compaction as under C4."""
        first = not self.stopping
        self.stopping = True
        if first and self.waiting_input and not self.answered:
            self.progress = time.monotonic()  # the busy timeout counts from the stop, not the question
        await self._end_draft()
        if self.typing is not None:
            await self.typing.stop()
        c = self.compaction
        if c is not None:
            if first:
                METRICS.stops.labels(kind="compaction").inc()
            await c.interrupt()
            self.cancel_sent = True
            return
        if first:
            METRICS.stops.labels(kind="turn").inc()
        try:
            result = await self.s.eve.cancel(self.session, turn_id=self.turn_id)
        except eve.EveError as exc:
            # The mark stays and the cancel is tried again: on the next poke (a message, another
            # /stop), at turn.started, after a restart, and on its own after a backoff.
            self.cancel_failures += 1
            wait = backoff.EVE.delay(self.cancel_failures)
            logger.warning("eve_cancel_failed", error=str(exc), wait=round(wait, 1))
            if self.cancel_retry is None or self.cancel_retry.cancelled():
                def retry() -> None:
                    self.cancel_retry = None
                    self.inbox.put_nowait(POKE)
                self.cancel_retry = asyncio.get_running_loop().call_later(wait, retry)  # one timer at a time
            return
        self.cancel_sent = True
        logger.info("turn_stop_sent", turn=self.turn_id, status=result.status)

    async def _lose(self, why: str) -> None:
        await self._end_draft()  # the "please repeat" line is the last thing shown
        # The turn had ended in eve and every message of it was answered: nobody is asked to
        # repeat what was answered (eve died before its session.waiting, PROTOCOL.md §9).
        answered = self.compaction is None and self.turn_ended and not self.pending and not self.stopping
        await lose(self.s, self.address, self.claim, why, answered=answered)

    async def _end_draft(self) -> None:
        """Before a message of ours goes out in the middle of a turn (a question, a notice): the
        draft shows nothing more and no frame can land after the message; the next block gets a
        draft of its own."""
        if self.draft is not None:
            await self.draft.settle()
        self.draft_id = 0

    async def _show_prompts(self, event: eve.InputRequested, claim: str) -> None:
        """T5: each question or approval as a message with its options as inline buttons."""
        chat, store = self.chat, self.s.store
        # S3: the people whose messages make this turn may answer (and the owners, always).
        askers = [m.user_id for m in map(decode, (r.payload for r in await self.s.queue.inflight(self.address)))
                  if isinstance(m, QueuedMessage)]
        async with store.db.transaction():
            for request in event.requests:
                prompt_id = await store.add_prompt(self.address, self.session, request.request_id,
                                                   [o.id for o in request.options], chat_id=chat.chat_id,
                                                   askers=askers)
                buttons = [{"text": o.label[:60], "callback_data": PromptButton(prompt_id, i).encode()}
                           for i, o in enumerate(request.options[:12])]
                rows = [buttons[i:i + 3] for i in range(0, len(buttons), 3)] or None
                text = request.prompt or t("input_needed", chat.lang)
                await store.put_outgoing(self.address, f"{event.id}:{request.request_id}", chat.chat_id,
                                         chat.thread_id, text, markup=rows)
            await self.s.transitions.advance(self.address, claim, self.cursor)
        self.prompted = True
        if self.typing is not None:
            await self.typing.stop()
        await self.s.outbox.flush(self.address)

    async def _steer(self, chat: Chat) -> bool:
        """Messages for a running turn: button answers as inputResponses, texts as a steer (T4, T5)."""
        s, claim = self.s, self._owned()
        # F4: claimed under a claim of their own until eve has them: a crash in between puts them
        # back in the queue at the turn's end instead of acknowledging what eve never got.
        steer = _steer_claim(claim)
        if not self.waiting_input and (not self.deliveries_known or await self._unsure_steer(claim)):
            # One unsure send at a time: what eve shows next is matched to it. Not while a question
            # waits on the person: eve shows nothing until it is answered, so a press or another
            # reply must still go (if eve took the unsure reply, the question is already over).
            return False
        limit = s.settings.batch_size
        claimed = await s.queue.claim(self.address, limit=limit + albums.LOOKAHEAD, claim=steer)
        claimed = await pushed.unsteered(s.queue, claimed, claim=steer)  # W1: never steered into a turn
        if s.notebook is not None:  # N1: the notebook rides one kind of turn; the other kind waits
            claimed = await owners.own_kind(s.queue, claimed, owner_turn=chat.owner_turn, claim=steer)
        if not claimed:
            return False
        # An album steers whole, once settled (I3): a part arriving alone waits for the rest.
        taken = s.transitions.album_cut(claimed, [decode(m.payload) for m in claimed],
                                        await s.queue.queued(self.address), limit=limit)
        if taken.take < len(claimed):
            await s.queue.nack([m.id for m in claimed[taken.take:]], claim=steer)
            claimed = claimed[:taken.take]
        if taken.wait_until is not None:
            asyncio.get_running_loop().call_later(max(0.0, taken.wait_until - s.transitions.mono()),
                                                  self.inbox.put_nowait, POKE)
            return False
        answers = [m for m in claimed if isinstance(decode(m.payload), InputAnswer)]
        messages = [m for m in claimed if m not in answers]
        if answers:
            try:
                await s.eve.respond(self.session, [
                    {"requestId": a.request_id, "optionId": a.option_id}
                    for a in (decode(m.payload) for m in answers) if isinstance(a, InputAnswer)
                ])
            except eve.SessionGone as exc:
                await s.queue.nack([m.id for m in answers], claim=steer)
                await lose(s, self.address, claim, str(exc))
                return True
            except eve.EveError as exc:
                logger.warning("eve_input_response_failed", error=str(exc))
                await s.queue.nack([m.id for m in answers], claim=steer)
            else:
                await s.queue.ack([m.id for m in answers], claim=steer)
                self.answered, self.progress = True, time.monotonic()
        if not messages:
            return False
        items = [decode(m.payload) for m in messages]
        if chat.owner_turn and not all(isinstance(i, QueuedMessage) and i.owner for i in items):
            # Someone else's words join the owner's turn: from here on it is not the owner's (N1).
            await s.transitions.turn_shared(self.address, claim)
        try:
            delivery = await send(s, self.address, claim, items, policy="steer", steered=[m.id for m in messages],
                                  steer_claim=steer)
        except Lost as exc:
            await lose(s, self.address, claim, str(exc))
            return True
        except Unheard as exc:
            # Recordings without a transcript, and nothing else: each sender is told, the turn goes on.
            async with s.store.db.transaction():
                await say_unheard(s, self.address, exc.items)
                await s.queue.ack([m.id for m in messages], claim=steer)
            await s.outbox.flush(self.address)
            return False
        except eve.EveTransportError as exc:
            if isinstance(exc, eve.EveConnectError):
                logger.warning("eve_steer_failed", error=str(exc))
                await s.queue.nack([m.id for m in messages], claim=steer)  # eve never saw it
                return False
            # Ambiguous (a 5xx, a timeout after it went out): eve may have it. The claim stays; if
            # eve shows it (message.received) it is this turn's, else parking puts it back (F4).
            logger.warning("eve_steer_unsure", error=str(exc))
            return False
        except eve.EveError as exc:
            logger.warning("eve_steer_failed", error=str(exc))
            await s.queue.nack([m.id for m in messages], claim=steer)
            return False
        if delivery.delivery_id:
            self.pending.add(delivery.delivery_id)
        self.turn_ended = False
        self.answered, self.progress = True, time.monotonic()
        for item in items:
            if isinstance(item, QueuedMessage):
                s.spawn(s.sender.react(chat.chat_id, item.message_id, "⚡"))
        return False

