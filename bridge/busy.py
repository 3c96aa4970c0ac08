"""One busy period of a chat, followed on eve's durable stream: a turn, its parking, a compaction.

The consumer reads events from the saved cursor and commits each effect (an outbox row, the
chat's release, the move into compaction) together with the cursor. A restart starts the same
consumer from the saved cursor, for a turn and a compaction alike (R1, R2): there is one busy
record and one procedure.

At the turn's last ``session.waiting`` the parking handler measures and, at or above the
threshold, moves the chat from busy(turn) to busy(compacting, auto) in the same transaction
that finishes the turn, so no message slips in between (C1, C2). The compact request is sent
through eve's own route; the chat is held while eve accepts it, at most
``IVA_COMPACT_ACK_SECONDS``, then let go and taken again when eve announces the compaction
(C6). ``session.waiting`` after the compaction events ends it (C7).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

import eve_client as eve

from . import log
from .metrics import METRICS
from .parking import Compacting, cooldown, parking_decision
from .sender import Typing
from .store import Chat, ChatStatus
from .texts import t

if TYPE_CHECKING:
    from .worker import ChatWorker

__all__ = ["POKE", "BusyPeriod"]

logger = log.get("bridge.busy")

RESUME_GRACE = 10.0
POKE = object()
_STREAM_END = object()
_GONE = (eve.SessionNotFound, eve.SessionNotActive, eve.SessionStranded, eve.SessionExpired)


@dataclass(frozen=True, slots=True)
class _Answer:
    """eve's answer to our compact request (or the error in its place)."""

    result: eve.Accepted | eve.EveError


class BusyPeriod:
    def __init__(self, worker: ChatWorker, chat: Chat, *, compaction: Compacting | None = None) -> None:
        assert chat.eve_session
        self.w = worker
        self.s = worker.s
        self.address = worker.address
        self.chat = chat
        self.session = chat.eve_session
        self.cursor = chat.cursor
        self.pending = set(chat.deliveries)
        self.deliveries_known = bool(chat.deliveries)
        self.turn_ended = False
        self.measurement: int | None = None
        self.compaction = compaction
        self.progress = time.monotonic()
        timeout = self.s.settings.busy_timeout
        if chat.progress_at:
            # The time since the last persisted progress counts (a restart does not reset it), but
            # a resumed consumer always gets a moment to read what eve wrote meanwhile.
            grace = min(timeout, RESUME_GRACE)
            self.progress -= max(0.0, min(timeout - grace, time.time() - chat.progress_at))
        self.typing: Typing | None = None
        self.waiting_input = chat.waiting_input
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
        elif self.compaction.post is None and not self.compaction.acked:
            self._post_compact()
        reader = asyncio.create_task(self._reader(), name=f"stream:{self.address}")
        started = time.monotonic()
        try:
            await self._loop()
        finally:
            if self.typing is not None:
                await self.typing.stop()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            # What the reader had queued is dropped; a later consumer starts again from the cursor.
            inbox = self.w.inbox
            while not inbox.empty():
                inbox.get_nowait()
        METRICS.turn_seconds.observe(time.monotonic() - started)

    async def _reader(self) -> None:
        try:
            async for event in self.s.eve.stream(self.session, self.cursor):
                await self.w.inbox.put(event)
            await self.w.inbox.put(_STREAM_END)
        except eve.EveError as exc:
            await self.w.inbox.put(exc)

    def _deadline(self) -> tuple[float, str]:
        loop = asyncio.get_running_loop()
        busy_left = self.s.settings.busy_timeout - (time.monotonic() - self.progress)
        c = self.compaction
        if c is not None and c.ack_deadline is not None and not c.acked and not c.released:
            ack_left = c.ack_deadline - loop.time()
            if ack_left < busy_left:
                return ack_left, "ack"
        return busy_left, "busy"

    async def _loop(self) -> None:
        while True:
            remaining, why = self._deadline()
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    item = await self.w.inbox.get()
            except TimeoutError:
                if why == "ack":
                    await self._ack_timeout()
                    continue
                if self.compaction is not None and self.compaction.released:
                    logger.info("compaction_watch_ended")  # the chat is free already
                    return
                logger.warning("busy_timeout", seconds=self.s.settings.busy_timeout)
                await self.w.lost("no progress within the busy timeout")
                return
            if item is POKE:
                if await self._on_poke():
                    return
                continue
            if isinstance(item, _Answer):
                if await self._on_answer(item.result):
                    return
                continue
            if item is _STREAM_END:
                await self.w.lost("eve closed the session stream")
                return
            if isinstance(item, _GONE):
                await self.w.lost(str(item))
                return
            if isinstance(item, eve.EveError):
                METRICS.eve_errors.labels(kind="stream").inc()
                raise item  # the worker waits and starts over from the cursor
            assert isinstance(item, eve.Event)
            self.progress = time.monotonic()
            self.cursor = item.index + 1
            if isinstance(item, eve.SessionCompleted | eve.SessionFailed):
                await self.w.lost(item.type)
                return
            done = await (self._on_compaction_event(item) if self.compaction else self._on_turn_event(item))
            if done:
                return

    # -- the turn ---------------------------------------------------------------------------

    async def _on_turn_event(self, event: eve.Event) -> bool:
        store, chat = self.s.store, self.chat
        match event:
            case eve.MessageCompleted() if event.message.strip():
                async with store.db.transaction():
                    await store.put_outgoing(self.address, event.id, chat.chat_id, chat.thread_id, event.message)
                    await store.update_chat(self.address, cursor=self.cursor, progress_at=time.time())
                    await self._commit_spend()
                if self.typing is not None and event.finish_reason == "stop":
                    await self.typing.stop()  # never after the final send (LESSONS #12)
                await self.w.flush_outbox(chat)
            case eve.TurnStarted() | eve.StepStarted():
                if self.typing is not None:
                    self.typing.start()
            case eve.StepCompleted():
                usage = event.usage
                if usage is not None and usage.input_tokens is not None:
                    self.measurement = usage.input_tokens
                if usage is not None:
                    self.usage[0] += 1
                    self.usage[1] += usage.input_tokens or 0
                    self.usage[2] += usage.output_tokens or 0
                    self.usage[3] += usage.cache_read_tokens or 0
            case eve.CompactionRequested():
                logger.info("eve_in_turn_compaction", estimate=event.usage_input_tokens)  # eve's, not ours
            case eve.CompactionCompleted():
                # eve's own compaction inside the turn is a compaction all the same: the notebook's
                # post-compaction nudge (N6) counts it.
                current = await store.chat(self.address)
                assert current is not None
                await store.update_chat(self.address, compactions=current.compactions + 1, cursor=self.cursor)
            case eve.InputRequested():
                await self._show_prompts(event)
            case eve.TurnWaiting() if event.on == "input":
                # T5: the turn cannot end until the person answers; their next message goes at once.
                self.waiting_input = True
                await store.update_chat(self.address, waiting_input=1, cursor=self.cursor, progress_at=time.time())
                if self.typing is not None:
                    await self.typing.stop()
            case eve.InputResolved():
                await store.close_prompts(self.session, event.request_ids)
            case eve.TurnFailed():
                logger.warning("eve_turn_failed", code=event.code, error=event.message[:300])
                METRICS.turns.labels(outcome="failed").inc()
                async with store.db.transaction():
                    await self.w.say(chat, f"failed:{event.id}", t("turn_failed", chat.lang, reason=event.code or "error"))
                    await store.update_chat(self.address, cursor=self.cursor, progress_at=time.time())
                    await self._commit_spend()
                await self.w.flush_outbox(chat)
        if (self.waiting_input and isinstance(event, eve.StepStarted | eve.InputResolved)) or event.terminal:
            if self.waiting_input:
                self.waiting_input = False
                await store.update_chat(self.address, waiting_input=0)
        if event.terminal:
            await store.close_prompts(self.session)
            self.turn_ended = True
            self.pending.difference_update(event.delivery_ids)
            if not self.deliveries_known:
                self.pending.clear()
        if isinstance(event, eve.SessionWaiting) and self.turn_ended and not self.pending:
            return await self._park()
        return False

    async def _park(self) -> bool:
        """The parking handler: release the chat, or move it straight into a compaction (C1, C2)."""
        store = self.s.store
        compacting = False
        async with store.db.transaction():
            chat = await store.chat(self.address)
            assert chat is not None
            decision = parking_decision(chat, self.measurement, self.s.threshold())
            fields: dict[str, object] = dict(cursor=self.cursor, progress_at=time.time(), turns=chat.turns + 1,
                                             **decision.updates)
            if self.measurement is not None:
                fields.update(measurement=self.measurement, measured_at=time.time())
            if decision.compact and not self.w.compact_outstanding:
                compacting = True
                fields.update(status=ChatStatus.BUSY, kind="compact", origin="auto", claim=uuid.uuid4().hex,
                              deliveries=[], busy_since=time.time(), compact_notified=0,
                              compact_before=self.measurement)
                _, inflight = await self.w.end_busy(keep_busy=True, **fields)
            else:
                _, inflight = await self.w.end_busy(**fields)
            await self._commit_spend()
            report = self.s.after_reports.pop(self.address, None) if decision.after is not None else None
            if report is not None:
                lang, before = report
                await self.w.say(chat, f"after:{self.cursor}:{chat.claim}", t("compact_after", lang, after=_n(decision.after),
                                                                        before=_n(before)))
        METRICS.turns.labels(outcome="completed").inc()
        logger.info("turn_finished", measurement=self.measurement, messages=len(inflight),
                    threshold=self.s.threshold(), compacting=compacting, **decision.updates)
        if report is not None:
            await self.w.flush_outbox(chat)
        if chat.owner_turn and self.s.rebuilder is not None and self.s.rebuilder.wanted(self.address):
            # N7: after the turn, beside the compaction, never in front of the reply (sent already).
            self.s.spawn(self.s.rebuilder.maybe_run(self.address))
        if not compacting:
            return True
        # busy(turn) → busy(compacting, auto): auto compaction is silent (C11).
        if self.typing is not None:
            await self.typing.stop()
            self.typing = None
        self.compaction = Compacting(origin="auto", before=self.measurement)
        self._post_compact()
        return False

    # -- the compaction ---------------------------------------------------------------------

    def _post_compact(self) -> None:
        c = self.compaction
        assert c is not None
        loop = asyncio.get_running_loop()
        c.ack_deadline = loop.time() + self.s.settings.compact_ack_seconds
        logger.info("compaction_requested", origin=c.origin, before=c.before)
        inbox = self.w.inbox

        async def post() -> None:
            try:
                result: eve.Accepted | eve.EveError = await self.s.eve.compact(self.session)
            except eve.EveError as exc:
                result = exc
            await inbox.put(_Answer(result))

        c.post = self.w.track_compact(post())

    async def _ack_timeout(self) -> None:
        """eve did not accept within the window: let the chat go, watch for eve's announcement (C6)."""
        c = self.compaction
        assert c is not None
        c.released = True
        async with self.s.store.db.transaction():
            await self.w.end_busy(cursor=self.cursor)
        logger.warning("compaction_ack_late_chat_released", seconds=self.s.settings.compact_ack_seconds)
        if await self.s.queue.depth(self.address):
            self.w.poke()

    async def _on_answer(self, result: eve.Accepted | eve.EveError) -> bool:
        c = self.compaction
        if c is None:
            return False
        if isinstance(result, eve.Accepted) and result.accepted:
            c.acked = True
            await self._cancel_compaction()  # a message asked for it before eve had the compaction
            return False
        if isinstance(result, eve.Accepted) or isinstance(result, _GONE):
            await self.w.lost(f"compact: {result}")
            return True
        logger.warning("compaction_request_failed", error=str(result))
        if c.requested:
            return False  # eve started it anyway; its events decide
        await self._finish(ok=False)
        return True

    async def _on_compaction_event(self, event: eve.Event) -> bool:
        c = self.compaction
        assert c is not None
        match event:
            case eve.CompactionRequested():
                c.requested = True
                c.acked = True  # eve announced it: accepted, whatever the HTTP answer says
                await self._cancel_compaction()
                if c.released:
                    # C6: the late acceptance came after all; take the chat again until it waits.
                    if await self.s.store.capture(self.address, kind="compact", origin=c.origin,
                                                  claim=uuid.uuid4().hex, compact_notified=0):
                        c.released = False
                        logger.info("compaction_chat_recaptured")
            case eve.CompactionCompleted():
                c.completed = True
            case eve.SessionWaiting() if c.requested or c.cancel_sent:
                await self._finish(ok=c.completed and not c.cancelled)
                return True
            case eve.TurnStarted():
                # A message reached eve while we watched a released compaction: it is a turn now.
                logger.info("compaction_watch_turn_started")
        return False

    async def _finish(self, *, ok: bool) -> None:
        """C7: session.waiting after the compaction; without compaction.completed it failed."""
        c = self.compaction
        assert c is not None
        store = self.s.store
        outcome = "completed" if ok else ("cancelled" if c.cancelled else "failed")
        async with store.db.transaction():
            chat = await store.chat(self.address)
            assert chat is not None
            fields: dict[str, object] = dict(cursor=self.cursor, progress_at=time.time())
            if ok:
                fields.update(after_pending=1, compact_failures=0, compact_retry_at=None,
                              compactions=chat.compactions + 1)
            elif outcome == "failed" and c.origin == "auto":
                failures = chat.compact_failures + 1
                fields.update(compact_failures=failures, compact_retry_at=time.time() + cooldown(failures))
            if c.released:
                await self.s.store.update_chat(self.address, **fields)  # the chat is free already
            else:
                await self.w.end_busy(**fields)
            manual = self.s.manual.pop(self.address, None) if c.origin == "manual" else None
            if c.origin == "manual":
                # Live, or finished while we were down (R2): the person hears how it ended.
                lang = manual.lang if manual is not None else chat.lang
                text = t("compact_done" if ok else "compact_failed", lang)
                await self.w.say(chat, f"compact:{chat.claim}:{outcome}", text,
                                 reply_to=manual.reply_to if manual is not None else None)
                if ok and c.before is not None:
                    self.s.after_reports[self.address] = (lang, c.before)
        self.s.manual_marks.discard(self.address)
        METRICS.compactions.labels(origin=c.origin, outcome=outcome).inc()
        logger.info("compaction_finished", origin=c.origin, outcome=outcome, before=c.before)
        if c.origin == "manual":
            await self.w.flush_outbox(chat)

    async def _on_poke(self) -> bool:
        """Something arrived for this chat while it is busy. True when this busy period ended."""
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        if chat.reset_requested:
            return True  # /new: the worker resets (eve's reset cancels a turn or a compaction)
        c = self.compaction
        if c is not None:
            if c.released:
                # While we only watch, a message (or a /compact that took the free chat) ends the
                # watch: the worker takes it from here; eve's compaction events then show up in
                # that consumer's stream.
                return chat.busy or bool(await self.s.queue.depth(self.address))
            if self.s.settings.turn_policy == "immediate" and not c.cancelled and await self.s.queue.depth(self.address):
                # C4: a message interrupts the compaction; eve does not let it, so we cancel it —
                # once eve has it: a cancel that overtakes the compact request would cancel nothing.
                c.cancelled = True
                logger.info("compaction_interrupted_by_message", origin=c.origin, eve_has_it=c.acked or c.requested)
                await self._cancel_compaction()
            return False
        if chat.kind == "turn" and (self.waiting_input or self.s.settings.turn_policy == "immediate"):
            return await self._steer(chat)
        return False

    async def _cancel_compaction(self) -> None:
        c = self.compaction
        if c is None or not c.cancelled or c.cancel_sent or not (c.acked or c.requested):
            return
        c.cancel_sent = True
        try:
            await self.s.eve.cancel(self.session)
        except eve.EveError as exc:
            logger.warning("compaction_cancel_failed", error=str(exc))

    async def _show_prompts(self, event: eve.InputRequested) -> None:
        """T5: each question or approval as a message with its options as inline buttons."""
        chat, store = self.chat, self.s.store
        async with store.db.transaction():
            for request in event.requests:
                prompt_id = await store.add_prompt(self.address, self.session, request.request_id,
                                                   [o.id for o in request.options])
                buttons = [{"text": o.label[:60], "callback_data": f"in:{prompt_id}:{i}"}
                           for i, o in enumerate(request.options[:12])]
                rows = [buttons[i:i + 3] for i in range(0, len(buttons), 3)] or None
                text = request.prompt or t("input_needed", chat.lang)
                await store.put_outgoing(self.address, f"{event.id}:{request.request_id}", chat.chat_id,
                                         chat.thread_id, text, markup=rows)
            await store.update_chat(self.address, cursor=self.cursor, progress_at=time.time())
        if self.typing is not None:
            await self.typing.stop()
        await self.w.flush_outbox(chat)

    async def _steer(self, chat: Chat) -> bool:
        """Messages for a running turn: button answers as inputResponses, texts as a steer (T4, T5)."""
        messages = await self.s.queue.claim(self.address, limit=self.s.settings.batch_size, claim=chat.claim)
        if not messages:
            return False
        answers = [m for m in messages if m.payload.get("kind") == "input"]
        messages = [m for m in messages if m.payload.get("kind") != "input"]
        if answers:
            try:
                await self.s.eve.respond(self.session, [
                    {"requestId": m.payload["request_id"], "optionId": m.payload["option_id"]} for m in answers
                ])
            except eve.EveError as exc:
                logger.warning("eve_input_response_failed", error=str(exc))
                await self.s.queue.nack([m.id for m in answers], claim=chat.claim)
        if not messages:
            return False
        if chat.owner_turn and not all(m.payload.get("owner") for m in messages):
            # Someone else's words join the owner's turn: from here on it is not the owner's (N1).
            await self.s.store.update_chat(self.address, owner_turn=0)
        try:
            delivery = await self.w.send(messages, policy="steer")
        except self.w.Lost as exc:
            await self.w.lost(str(exc))
            return True
        except eve.EveError as exc:
            logger.warning("eve_steer_failed", error=str(exc))
            await self.s.queue.nack([m.id for m in messages], claim=chat.claim)
            return False
        if delivery.delivery_id:
            self.pending.add(delivery.delivery_id)
        self.turn_ended = False
        for m in messages:
            self.s.spawn(self.s.sender.react(chat.chat_id, int(m.payload["message_id"]), "⚡"))
        return False


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}".replace(",", " ")
