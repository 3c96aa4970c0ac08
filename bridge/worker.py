"""One worker per address: the chat's state machine, driven by eve's durable stream (T3, T4, R1).

A chat is ``idle`` or ``busy``. A worker claims the address's next messages and marks the chat
busy in one transaction, sends them to eve, then consumes eve's stream from the saved cursor;
the effects of an event (an outbox row, the chat's release) are committed together with the
cursor. Recovery after a restart is the same consumer started from the saved cursor, so a
restart in the middle of a turn needs no code of its own.

Workers wake on an event (a committed message, /new), never on a polling timer; an idle worker
exits and the scheduler starts a new one when the chat has work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

import eve_client as eve
from diskqueue import DiskQueue, Message

from . import log
from .config import Settings
from .metrics import METRICS
from .sender import ChatGone, Sender, Typing
from .store import Chat, ChatStatus, Store
from .texts import t

__all__ = ["Scheduler"]

logger = log.get("bridge.worker")

_POKE = object()
_STREAM_END = object()
MAX_EVE_BACKOFF = 30.0
RESET_TIMEOUT = 10.0
_IDLE: dict[str, object] = dict(
    status=ChatStatus.IDLE, kind=None, origin=None, claim=None, deliveries=[], busy_since=None
)


class _Lost(Exception):
    """The eve session is gone, stranded or stuck: free the chat with the reset mark."""


@dataclass
class _Busy:
    """What the consumer knows about the busy period it follows."""

    session: str
    cursor: int
    pending: set[str]
    deliveries_known: bool
    turn_ended: bool = False
    measurement: int | None = None
    progress: float = field(default_factory=time.monotonic)


class Scheduler:
    """Starts a worker per address on demand; bounds concurrent eve turns (T3)."""

    def __init__(self, *, settings: Settings, eve_client: eve.EveClient, queue: DiskQueue,
                 store: Store, sender: Sender, spawn: Callable[[Coroutine[Any, Any, Any]], object]) -> None:
        self.settings = settings
        self.spawn = spawn
        self.eve = eve_client
        self.queue = queue
        self.store = store
        self.sender = sender
        self.slots = asyncio.Semaphore(settings.max_turns)
        self.workers: dict[str, ChatWorker] = {}
        self.window: int | None = settings.context_window
        self._closing = False

    def threshold(self) -> int:
        s = self.settings
        if self.window:
            return min(self.window * s.compact_percent // 100, s.compact_ceiling)
        return s.compact_ceiling

    def wake(self, address: str) -> None:
        if self._closing:
            return
        worker = self.workers.get(address)
        if worker is not None and not worker.done:
            worker.poke()
            return
        worker = ChatWorker(self, address)
        self.workers[address] = worker
        worker.start()

    def _finished(self, worker: ChatWorker) -> None:
        if self.workers.get(worker.address) is worker:
            del self.workers[worker.address]

    async def recover(self) -> int:
        """Wake every address with unfinished business; the workers do the rest (R2)."""
        addresses = {c.address for c in await self.store.busy_chats()}
        addresses.update(await self.queue.addresses_with())
        addresses.update(await self.store.addresses_with_pending_outgoing())
        addresses.update(await self.store.chats_wanting_reset())
        for address in sorted(addresses):
            self.wake(address)
        return len(addresses)

    async def close(self) -> None:
        """Stop every worker; busy records stay as they are, for recovery (R4)."""
        self._closing = True
        workers = [w for w in self.workers.values() if not w.done]
        for worker in workers:
            worker.cancel()
        for worker in workers:
            await worker.wait()


class ChatWorker:
    def __init__(self, scheduler: Scheduler, address: str) -> None:
        self.s = scheduler
        self.address = address
        self._inbox: asyncio.Queue[object] = asyncio.Queue()
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._typing: Typing | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._main(), name=f"chat:{self.address}")
        self._task.add_done_callback(lambda _: self.s._finished(self))

    @property
    def done(self) -> bool:
        return self._task is None or self._task.done()

    def poke(self) -> None:
        self._poked.set()
        self._inbox.put_nowait(_POKE)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _main(self) -> None:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(address=self.address)
        failures = 0
        while True:
            try:
                await self._run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # The state is durable: log, wait, and go again from what the database says.
                failures += 1
                logger.exception("worker_failed", failures=failures)
                await asyncio.sleep(min(60.0, 2.0**failures))
            finally:
                if self._typing is not None:
                    await self._typing.stop()

    async def _run(self) -> None:
        eve_failures = 0
        while True:
            self._poked.clear()
            chat = await self.s.store.chat(self.address)
            if chat is None:
                return
            await self._flush_outbox(chat)
            if chat.reset_requested:
                await self._reset(chat)
                continue
            try:
                if chat.busy:
                    await self._resume(chat)
                    eve_failures = 0
                    continue
                if not await self._start_turn(chat):
                    if self._poked.is_set():
                        continue
                    return
                eve_failures = 0
            except eve.EveTransportError as exc:
                # R6: eve is unreachable. Nothing is lost: the busy record or the queue keeps
                # the messages. Wait and try again; a poke (new message, /new) wakes us early.
                eve_failures += 1
                METRICS.eve_errors.labels(kind="transport").inc()
                wait = min(MAX_EVE_BACKOFF, 0.5 * 2**eve_failures) + random.uniform(0, 0.5)
                logger.warning("eve_unreachable", error=str(exc), wait=round(wait, 1))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._poked.wait()

    # -- outbox -----------------------------------------------------------------------------

    async def _flush_outbox(self, chat: Chat) -> None:
        store = self.s.store
        for out in await store.pending_outgoing(self.address):
            if chat.blocked:
                await store.finish_outgoing(out.id, "failed")
                continue
            try:
                await self.s.sender.deliver(out)
            except ChatGone as exc:
                logger.warning("chat_gone", reason=str(exc))
                async with store.db.transaction():
                    await store.update_chat(self.address, blocked=1, blocked_reason=str(exc)[:200])
                    await store.fail_outgoing_of_chat(out.chat_id)
                return
            except Exception as exc:
                from aiogram.exceptions import TelegramBadRequest

                if isinstance(exc, TelegramBadRequest):
                    logger.error("telegram_rejected_reply", error=exc.message, outbox_id=out.id)
                    await store.finish_outgoing(out.id, "failed")
                    continue
                raise

    async def _say(self, chat: Chat, key: str, text: str, *, reply_to: int | None = None) -> None:
        """A durable notice: through the outbox, so it is sent once even across restarts."""
        await self.s.store.put_outgoing(
            self.address, key, chat.chat_id, chat.thread_id, text, format="plain", reply_to=reply_to
        )

    # -- turns ------------------------------------------------------------------------------

    def _compose(self, messages: Sequence[Message]) -> str:
        """Several waiting messages go as one turn; in groups each line says who wrote it."""
        parts = []
        for m in messages:
            text = str(m.payload.get("text", ""))
            if not m.payload.get("private", True):
                text = f"{m.payload.get('user_name') or 'someone'}: {text}"
            parts.append(text)
        return "\n\n".join(parts)

    async def _start_turn(self, chat: Chat) -> bool:
        """idle → busy(turn): claim the next messages and hand them to eve."""
        store, queue = self.s.store, self.s.queue
        if await queue.depth(self.address) == 0:
            return False
        async with self.s.slots:
            claim = uuid.uuid4().hex
            session = None if chat.reset_mark else chat.eve_session
            async with store.db.transaction():
                messages = await queue.claim(self.address, limit=self.s.settings.batch_size, claim=claim)
                if not messages:
                    return False
                now = time.time()
                await store.update_chat(
                    self.address, status=ChatStatus.BUSY, kind="turn", origin=None, claim=claim,
                    deliveries=[], busy_since=now, progress_at=now,
                    eve_session=session, cursor=chat.cursor if session else 0, reset_mark=0,
                )
            METRICS.busy.inc()
            logger.info("turn_claimed", messages=[m.id for m in messages], session=session)
            try:
                await self._drive(messages)
            finally:
                METRICS.busy.dec()
        return True

    async def _ensure_session(self) -> tuple[str, int]:
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        if chat.eve_session:
            return chat.eve_session, chat.cursor
        session = await self.s.eve.create_session()
        await self.s.store.update_chat(self.address, eve_session=session, cursor=0)
        structlog.contextvars.bind_contextvars(session=session)
        logger.info("eve_session_created", session=session)
        return session, 0

    async def _send(self, messages: Sequence[Message], *, policy: eve.TurnPolicy) -> eve.Delivery:
        """Deliver to eve; a session eve no longer knows is replaced once, transparently."""
        for attempt in (1, 2):
            session, _ = await self._ensure_session()
            try:
                delivery = await self.s.eve.send(session, self._compose(messages), turn_policy=policy)
            except (eve.SessionNotActive, eve.SessionNotFound, eve.SessionStranded, eve.SessionExpired) as exc:
                if attempt == 2 or policy == "steer":
                    raise _Lost(str(exc)) from exc
                logger.warning("eve_session_replaced", reason=str(exc))
                await self.s.store.update_chat(self.address, eve_session=None, cursor=0)
                continue
            chat = await self.s.store.chat(self.address)
            assert chat is not None
            known = [*chat.deliveries, delivery.delivery_id] if delivery.delivery_id else list(chat.deliveries)
            await self.s.store.update_chat(self.address, deliveries=known, progress_at=time.time())
            return delivery
        raise AssertionError("unreachable")

    async def _drive(self, messages: Sequence[Message]) -> None:
        """Send the claimed messages and follow the turn to its end."""
        try:
            await self._send(messages, policy="queue")
        except eve.EveTransportError:
            await self._give_back()
            raise
        except _Lost as exc:
            await self._lost(str(exc))
            return
        except eve.EveRejected as exc:
            logger.error("eve_rejected_message", error=str(exc))
            await self._fail_turn(f"eve: {exc.status}")
            return
        await self._follow()

    async def _give_back(self) -> None:
        """busy → idle without a turn: the claimed messages go back to the head of the queue."""
        store = self.s.store
        async with store.db.transaction():
            chat = await store.chat(self.address)
            assert chat is not None
            await self.s.queue.nack([m.id for m in await self.s.queue.inflight(self.address)], claim=chat.claim)
            await store.update_chat(self.address, **_IDLE)

    async def _resume(self, chat: Chat) -> None:
        """Recovery (R2): the same consumer, from the saved cursor."""
        logger.info("busy_record_resumed", kind=chat.kind, session=chat.eve_session, cursor=chat.cursor)
        METRICS.busy.inc()
        try:
            if chat.kind != "turn":
                await self._lost("unknown busy kind")
                return
            if not chat.eve_session:
                await self._give_back()  # claimed, but no session yet: eve never saw it
                return
            if not chat.deliveries:
                try:
                    page = await self.s.eve.read(chat.eve_session, chat.cursor)
                except (eve.SessionNotFound, eve.SessionNotActive, eve.SessionStranded, eve.SessionExpired) as exc:
                    await self._lost(str(exc))
                    return
                if not any(isinstance(e, eve.TurnStarted | eve.MessageReceived) for e in page.events):
                    # Claimed and marked busy, but the send never reached eve: send it now.
                    messages = await self.s.queue.inflight(self.address)
                    if not messages:
                        await self._give_back()
                        return
                    await self._drive(messages)
                    return
            await self._follow()
        finally:
            METRICS.busy.dec()

    async def _follow(self) -> None:
        chat = await self.s.store.chat(self.address)
        assert chat is not None and chat.eve_session
        busy = _Busy(
            session=chat.eve_session,
            cursor=chat.cursor,
            pending=set(chat.deliveries),
            deliveries_known=bool(chat.deliveries),
        )
        structlog.contextvars.bind_contextvars(session=busy.session)
        self._typing = Typing(self.s.sender.bot, chat.chat_id, chat.thread_id, ttl=self.s.settings.busy_timeout)
        self._typing.start()
        started = time.monotonic()
        try:
            await self._consume(chat, busy)
        finally:
            await self._typing.stop()
        METRICS.turn_seconds.observe(time.monotonic() - started)

    async def _reader(self, busy: _Busy) -> None:
        try:
            async for event in self.s.eve.stream(busy.session, busy.cursor):
                await self._inbox.put(event)
            await self._inbox.put(_STREAM_END)
        except eve.EveError as exc:
            await self._inbox.put(exc)

    async def _consume(self, chat: Chat, busy: _Busy) -> None:
        reader = asyncio.create_task(self._reader(busy), name=f"stream:{self.address}")
        timeout = self.s.settings.busy_timeout
        # The time since the last persisted progress counts too (a restart does not reset it).
        if chat.progress_at:
            busy.progress -= max(0.0, min(timeout, time.time() - chat.progress_at))
        try:
            while True:
                remaining = timeout - (time.monotonic() - busy.progress)
                try:
                    async with asyncio.timeout(max(0.0, remaining)):
                        item = await self._inbox.get()
                except TimeoutError:
                    logger.warning("busy_timeout", seconds=timeout)
                    await self._lost("no progress within the busy timeout")
                    return
                if item is _POKE:
                    if await self._on_poke(busy):
                        return
                    continue
                if item is _STREAM_END:
                    await self._lost("eve closed the session stream")
                    return
                if isinstance(item, eve.SessionNotFound | eve.SessionNotActive | eve.SessionStranded | eve.SessionExpired):
                    await self._lost(str(item))
                    return
                if isinstance(item, eve.EveError):
                    # The stream could not be resumed for now; start over from the cursor.
                    METRICS.eve_errors.labels(kind="stream").inc()
                    raise item
                assert isinstance(item, eve.Event)
                busy.progress = time.monotonic()
                if await self._apply(chat, busy, item):
                    return
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            # Drop what the reader had queued; a later consumer starts again from the cursor.
            while not self._inbox.empty():
                self._inbox.get_nowait()

    async def _on_poke(self, busy: _Busy) -> bool:
        """Something arrived for this chat while it is busy. True when the busy period ended."""
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        if chat.reset_requested:
            return True  # /new: the main loop resets (eve's reset cancels the running turn)
        if self.s.settings.turn_policy == "immediate" and chat.kind == "turn":
            messages = await self.s.queue.claim(self.address, limit=self.s.settings.batch_size, claim=chat.claim)
            if messages:
                try:
                    delivery = await self._send(messages, policy="steer")
                except _Lost as exc:
                    await self._lost(str(exc))
                    return True
                except eve.EveError as exc:
                    logger.warning("eve_steer_failed", error=str(exc))
                    await self.s.queue.nack([m.id for m in messages], claim=chat.claim)
                    return False
                if delivery.delivery_id:
                    busy.pending.add(delivery.delivery_id)
                busy.turn_ended = False
                for m in messages:
                    self.s.spawn(self.s.sender.react(chat.chat_id, int(m.payload["message_id"]), "⚡"))
        return False

    async def _apply(self, chat: Chat, busy: _Busy, event: eve.Event) -> bool:
        """Apply one event. True when the busy period ended (the chat was released)."""
        store = self.s.store
        busy.cursor = event.index + 1
        match event:
            case eve.MessageCompleted() if event.message.strip():
                async with store.db.transaction():
                    await store.put_outgoing(self.address, event.id, chat.chat_id, chat.thread_id, event.message)
                    await store.update_chat(self.address, cursor=busy.cursor, progress_at=time.time())
                if self._typing is not None and event.finish_reason == "stop":
                    await self._typing.stop()  # never after the final send (LESSONS #12)
                await self._flush_outbox(chat)
            case eve.TurnStarted() | eve.StepStarted():
                if self._typing is not None:
                    self._typing.start()
            case eve.StepCompleted():
                usage = event.usage
                if usage is not None and usage.input_tokens is not None:
                    busy.measurement = usage.input_tokens
            case eve.TurnFailed():
                logger.warning("eve_turn_failed", code=event.code, error=event.message[:300])
                METRICS.turns.labels(outcome="failed").inc()
                async with store.db.transaction():
                    await self._say(chat, f"failed:{event.id}", t("turn_failed", chat.lang, reason=event.code or "error"))
                    await store.update_chat(self.address, cursor=busy.cursor, progress_at=time.time())
                await self._flush_outbox(chat)
            case eve.SessionCompleted() | eve.SessionFailed():
                await self._lost(event.type)
                return True
        if event.terminal:
            busy.turn_ended = True
            busy.pending.difference_update(event.delivery_ids)
            if not busy.deliveries_known:
                busy.pending.clear()
        if isinstance(event, eve.SessionWaiting) and busy.turn_ended and not busy.pending:
            await self._release(busy)
            return True
        return False

    async def _end_busy(self, **fields: object) -> tuple[Chat, list[Message]]:
        """The one way out of busy, inside the caller's transaction: ack what was in flight, go idle."""
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        inflight = await self.s.queue.inflight(self.address)
        await self.s.queue.ack([m.id for m in inflight], claim=chat.claim)
        await self.s.store.update_chat(self.address, **{**_IDLE, **fields})
        return chat, inflight

    async def _release(self, busy: _Busy) -> None:
        """busy(turn) → idle after the turn's session.waiting, in one transaction."""
        async with self.s.store.db.transaction():
            chat = await self.s.store.chat(self.address)
            assert chat is not None
            fields: dict[str, object] = dict(cursor=busy.cursor, progress_at=time.time(), turns=chat.turns + 1)
            if busy.measurement is not None:
                fields.update(measurement=busy.measurement, measured_at=time.time())
            _, inflight = await self._end_busy(**fields)
        METRICS.turns.labels(outcome="completed").inc()
        logger.info("turn_finished", measurement=busy.measurement, messages=len(inflight))

    async def _fail_turn(self, reason: str) -> None:
        """eve refused the message itself: say so, free the chat."""
        async with self.s.store.db.transaction():
            chat, inflight = await self._end_busy()
            reply_to = int(inflight[-1].payload["message_id"]) if inflight else None
            await self._say(chat, f"failed:{chat.claim}", t("turn_failed", chat.lang, reason=reason), reply_to=reply_to)
        METRICS.turns.labels(outcome="failed").inc()

    async def _lost(self, reason: str) -> None:
        """The session is gone or stuck: free the chat with the session-reset mark (R2, R3).

        The person whose turn was interrupted is told to repeat it; the next message starts a
        new session at once, without waiting on a /reset that cannot succeed.
        """
        async with self.s.store.db.transaction():
            chat, inflight = await self._end_busy(
                reset_mark=1, eve_session=None, cursor=0, measurement=None, compaction_disabled=0,
            )
            if chat.kind == "turn" and inflight:
                await self._say(chat, f"lost:{chat.claim}", t("session_lost", chat.lang),
                                reply_to=int(inflight[-1].payload["message_id"]))
        METRICS.turns.labels(outcome="lost").inc()
        logger.warning("eve_session_lost", reason=reason, session=chat.eve_session)

    # -- /new -------------------------------------------------------------------------------

    async def _reset(self, chat: Chat) -> None:
        """M7: retire the eve session (cancelling what runs) and start afresh."""
        store = self.s.store
        if chat.eve_session and not chat.reset_mark:
            try:
                async with asyncio.timeout(RESET_TIMEOUT):
                    await self.s.eve.reset(chat.eve_session, reason="/new")
            except (eve.EveError, TimeoutError) as exc:
                # A stuck session cannot be reset (PROTOCOL.md §9); we leave it behind.
                logger.warning("eve_reset_failed", error=str(exc))
        async with store.db.transaction():
            current, _ = await self._end_busy(
                eve_session=None, cursor=0, measurement=None, compaction_disabled=0, reset_mark=0,
                reset_requested=0, reset_reply_to=None, reset_dropped=0,
            )
            dropped = current.reset_dropped
            text = t("new_dropped", current.lang, n=dropped) if dropped else t("new_done", current.lang)
            await self._say(current, f"new:{current.reset_reply_to}", text, reply_to=current.reset_reply_to)
        logger.info("conversation_reset", dropped=dropped)
        await self._flush_outbox(current)
