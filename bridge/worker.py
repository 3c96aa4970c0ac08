"""One worker per address: the chat's state machine (T3, T4, R1).

A chat is ``idle`` or ``busy``. The worker claims the address's next messages and marks the
chat busy in one transaction, sends them to eve, and hands the stream to a
:class:`~bridge.busy.BusyPeriod`, which follows the turn, its parking and any compaction.
A busy record found at start (a restart) goes to the same consumer from its saved cursor.

Workers wake on an event (a committed message, /new, /compact), never on a polling timer; an
idle worker exits and the scheduler starts a new one when the chat has work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

import eve_client as eve
from diskqueue import DiskQueue, Message

from . import log, parking
from .busy import _GONE, POKE, BusyPeriod
from .config import Settings
from .metrics import METRICS
from .notebook import Notebook, Rebuilder
from .parking import Compacting
from .sender import ChatGone, Sender
from .store import Chat, ChatStatus, Store
from .texts import t

__all__ = ["ManualCompaction", "Scheduler"]

logger = log.get("bridge.worker")

MAX_EVE_BACKOFF = 30.0
RESET_TIMEOUT = 10.0
_IDLE: dict[str, object] = dict(
    status=ChatStatus.IDLE, kind=None, origin=None, claim=None, deliveries=[], busy_since=None, owner_turn=0
)


class Lost(Exception):
    """The eve session is gone, stranded or stuck: free the chat with the reset mark."""


@dataclass
class ManualCompaction:
    """A /compact request; it lives in process memory, as the seed says (M5)."""

    lang: str
    reply_to: int
    before: int
    posted: bool = False


class Scheduler:
    """Starts a worker per address on demand; bounds concurrent eve turns (T3)."""

    def __init__(self, *, settings: Settings, eve_client: eve.EveClient, queue: DiskQueue,
                 store: Store, sender: Sender, spawn: Callable[[Coroutine[Any, Any, Any]], object],
                 notebook: Notebook | None = None, rebuilder: Rebuilder | None = None) -> None:
        self.settings = settings
        self.notebook = notebook if notebook is not None and notebook.enabled else None
        self.rebuilder = rebuilder if self.notebook is not None else None
        self.spawn = spawn
        self.eve = eve_client
        self.queue = queue
        self.store = store
        self.sender = sender
        self.slots = asyncio.Semaphore(settings.max_turns)
        self.workers: dict[str, ChatWorker] = {}
        self.window: int | None = settings.context_window
        self.manual: dict[str, ManualCompaction] = {}
        self.manual_marks: set[str] = set()  # M4: set synchronously, before the first await
        self.after_reports: dict[str, tuple[str, int]] = {}  # address → (lang, before) for M5's "after"
        self._closing = False

    def threshold(self) -> int:
        s = self.settings
        return parking.threshold(self.window, s.compact_percent, s.compact_ceiling)

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
    Lost = Lost

    def __init__(self, scheduler: Scheduler, address: str) -> None:
        self.s = scheduler
        self.address = address
        self.inbox: asyncio.Queue[object] = asyncio.Queue()
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._compact_post: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._main(), name=f"chat:{self.address}")
        self._task.add_done_callback(lambda _: self.s._finished(self))

    @property
    def done(self) -> bool:
        return self._task is None or self._task.done()

    def poke(self) -> None:
        self._poked.set()
        self.inbox.put_nowait(POKE)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def track_compact(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """The one compact request in flight for this chat (C5); it outlives a busy period."""
        self._compact_post = asyncio.create_task(coro, name=f"compact:{self.address}")
        return self._compact_post

    @property
    def compact_outstanding(self) -> bool:
        return self._compact_post is not None and not self._compact_post.done()

    async def _main(self) -> None:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(address=self.address)
        failures = 0
        try:
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
            if self._compact_post is not None and not self._compact_post.done():
                self._compact_post.cancel()

    async def _run(self) -> None:
        eve_failures = 0
        while True:
            self._poked.clear()
            chat = await self.s.store.chat(self.address)
            if chat is None:
                return
            await self.flush_outbox(chat)
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

    async def flush_outbox(self, chat: Chat) -> None:
        from aiogram.exceptions import TelegramBadRequest

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
            except TelegramBadRequest as exc:
                logger.error("telegram_rejected_reply", error=exc.message, outbox_id=out.id)
                await store.finish_outgoing(out.id, "failed")

    async def say(self, chat: Chat, key: str, text: str, *, reply_to: int | None = None) -> None:
        """A durable notice: through the outbox, so it is sent once even across restarts."""
        await self.s.store.put_outgoing(
            self.address, key, chat.chat_id, chat.thread_id, text, format="plain", reply_to=reply_to
        )

    # -- turns ------------------------------------------------------------------------------

    async def _compose(self, messages: Sequence[Message]) -> str | list[dict[str, Any]]:
        """Several waiting messages go as one turn; in groups each says who wrote it; photos and
        documents go as file parts (T8)."""
        texts: list[str] = []
        files: list[dict[str, Any]] = []
        for m in messages:
            text = str(m.payload.get("text", ""))
            attachment = m.payload.get("attachment")
            if attachment:
                part = await self._download(attachment)
                if part is not None:
                    files.append(part)
                else:
                    text = f"{text}\n[{attachment.get('name')}: the file could not be fetched from Telegram]".strip()
            if not m.payload.get("private", True):
                text = f"{m.payload.get('user_name') or 'someone'}: {text}"
            if text:
                texts.append(text)
        joined = "\n\n".join(texts)
        if not files:
            return joined
        return [*([{"type": "text", "text": joined}] if joined else []), *files]

    async def _download(self, attachment: dict[str, Any]) -> dict[str, Any] | None:
        bot = self.s.sender.bot
        try:
            buffer = await bot.download(attachment["file_id"], timeout=60)
        except Exception as exc:  # a file we cannot fetch becomes a note in the text, not a lost turn
            logger.warning("telegram_download_failed", error=str(exc), name=attachment.get("name"))
            return None
        assert buffer is not None
        return eve.file_part(buffer.getvalue(), attachment.get("mime") or "application/octet-stream",
                             attachment.get("name"))

    async def _start_turn(self, chat: Chat) -> bool:
        """idle → busy(turn): claim the next messages and hand them to eve."""
        store, queue = self.s.store, self.s.queue
        if await queue.depth(self.address) == 0:
            return False
        async with self.s.slots:
            claim = uuid.uuid4().hex
            async with store.db.transaction():
                current = await store.chat(self.address)
                if current is None or current.busy or current.reset_requested:
                    return True  # taken meanwhile (/compact, /new): the main loop looks again
                session = None if current.reset_mark else current.eve_session
                messages = await queue.claim(self.address, limit=self.s.settings.batch_size, claim=claim)
                if not messages:
                    return False
                stale = [m for m in messages if m.payload.get("kind") == "input"]
                if stale:
                    # A button pressed after its turn ended: nothing waits for it any more.
                    await queue.ack([m.id for m in stale], claim=claim)
                    messages = [m for m in messages if m.payload.get("kind") != "input"]
                    if not messages:
                        return True
                owner = bool(messages[0].payload.get("owner"))
                notes: dict[str, object] = {"owner_turn": int(owner)}
                notebook = self.s.notebook
                if notebook is not None:
                    # N1: the notebook rides only in the owner's turns, so a turn is one kind or the
                    # other: the first message that differs waits for the next turn.
                    cut = next((i for i, m in enumerate(messages) if bool(m.payload.get("owner")) != owner),
                               len(messages))
                    if cut < len(messages):
                        await queue.nack([m.id for m in messages[cut:]], claim=claim)
                        messages = messages[:cut]
                    if owner:
                        notes["notes_mode"] = await notebook.mode_at_entry(current)  # N2: fixed for the turn
                now = time.time()
                await store.update_chat(
                    self.address, status=ChatStatus.BUSY, kind="turn", origin=None, claim=claim,
                    deliveries=[], busy_since=now, progress_at=now,
                    eve_session=session, cursor=current.cursor if session else 0, reset_mark=0, **notes,
                    **({} if session else dict(compaction_disabled=0, after_pending=0, compact_failures=0,
                                               compact_retry_at=None)),
                )
            logger.info("turn_claimed", messages=[m.id for m in messages], session=session)
            await self._drive(messages)
        return True

    async def _ensure_session(self) -> str:
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        if chat.eve_session:
            return chat.eve_session
        session = await self.s.eve.create_session()
        await self.s.store.update_chat(self.address, eve_session=session, cursor=0)
        structlog.contextvars.bind_contextvars(session=session)
        logger.info("eve_session_created", session=session)
        return session

    async def send(self, messages: Sequence[Message], *, policy: eve.TurnPolicy) -> eve.Delivery:
        """Deliver to eve; a session eve no longer knows is replaced once, transparently."""
        for attempt in (1, 2):
            session = await self._ensure_session()
            context, marks = await self._state_block(policy)
            try:
                delivery = await self.s.eve.send(session, await self._compose(messages), turn_policy=policy,
                                                 client_context=context)
            except _GONE as exc:
                if attempt == 2 or policy == "steer":
                    raise Lost(str(exc)) from exc
                logger.warning("eve_session_replaced", reason=str(exc))
                await self.s.store.update_chat(self.address, eve_session=None, cursor=0, compaction_disabled=0,
                                               after_pending=0)
                continue
            chat = await self.s.store.chat(self.address)
            assert chat is not None
            known = [*chat.deliveries, delivery.delivery_id] if delivery.delivery_id else list(chat.deliveries)
            # The one-shot marks (N6) once the block is with eve: a crash before this shows it again.
            await self.s.store.update_chat(self.address, deliveries=known, progress_at=time.time(), **marks)
            return delivery
        raise AssertionError("unreachable")

    async def _state_block(self, policy: eve.TurnPolicy) -> tuple[str | None, dict[str, int]]:
        """N6: the ``[state]`` block as clientContext of an owner's turn; nothing for anyone else."""
        notebook = self.s.notebook
        if notebook is None or policy == "steer":
            return None, {}
        chat = await self.s.store.chat(self.address)
        if chat is None or not chat.owner_turn:
            return None, {}
        return await notebook.block(chat, threshold=self.s.threshold(), window=self.s.window)

    async def _drive(self, messages: Sequence[Message]) -> None:
        """Send the claimed messages and follow the turn to its end."""
        try:
            await self.send(messages, policy="queue")
        except eve.EveTransportError:
            await self._give_back()
            raise
        except Lost as exc:
            await self.lost(str(exc))
            return
        except eve.EveRejected as exc:
            logger.error("eve_rejected_message", error=str(exc))
            await self._fail_turn(f"eve: {exc.status}")
            return
        await self._follow()

    async def _follow(self, compaction: Compacting | None = None) -> None:
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        await BusyPeriod(self, chat, compaction=compaction).run()

    async def _give_back(self) -> None:
        """busy → idle without a turn: the claimed messages go back to the head of the queue."""
        store = self.s.store
        async with store.db.transaction():
            chat = await store.chat(self.address)
            assert chat is not None
            await self.s.queue.nack([m.id for m in await self.s.queue.inflight(self.address)], claim=chat.claim)
            await store.update_chat(self.address, **_IDLE)

    async def _resume(self, chat: Chat) -> None:
        """A busy record with no live consumer: the same consumer, from the saved cursor (R2)."""
        logger.info("busy_record_resumed", kind=chat.kind, origin=chat.origin, session=chat.eve_session,
                    cursor=chat.cursor)
        if not chat.eve_session:
            await self._give_back()  # claimed, but no session yet: eve never saw it
            return
        if chat.kind == "compact":
            await self._resume_compaction(chat)
            return
        if chat.kind != "turn":
            await self.lost(f"unknown busy kind {chat.kind!r}")
            return
        if not chat.deliveries:
            try:
                page = await self.s.eve.read(chat.eve_session, chat.cursor)
            except _GONE as exc:
                await self.lost(str(exc))
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

    async def _resume_compaction(self, chat: Chat) -> None:
        assert chat.eve_session
        manual = self.s.manual.get(self.address)
        origin = chat.origin or "auto"
        if origin == "manual" and manual is not None and not manual.posted:
            manual.posted = True  # a live /compact, captured by ingest (M1): request it now
            await self._follow(Compacting(origin="manual", before=manual.before))
            return
        try:
            page = await self.s.eve.read(chat.eve_session, chat.cursor)
        except _GONE as exc:
            await self.lost(str(exc))
            return
        if any(isinstance(e, eve.CompactionRequested) for e in page.events):
            await self._follow(Compacting(origin=origin, before=chat.compact_before, acked=True))
            return
        # The compaction never started in eve (we stopped before asking, or eve never began):
        # free the chat; an auto compaction is silent, a manual one asks for /compact again (R3).
        async with self.s.store.db.transaction():
            current, _ = await self.end_busy()
            if origin == "manual":
                await self.say(current, f"compact-again:{current.claim}", t("compact_again", current.lang))
        self.s.manual.pop(self.address, None)
        self.s.manual_marks.discard(self.address)
        logger.info("compaction_not_started_freed", origin=origin)

    # -- the ways out of busy ---------------------------------------------------------------

    async def end_busy(self, *, keep_busy: bool = False, **fields: object) -> tuple[Chat, list[Message]]:
        """Inside the caller's transaction: ack what was in flight and go idle (or stay busy
        with the given fields, for parking → compacting). Returns the chat as it was."""
        chat = await self.s.store.chat(self.address)
        assert chat is not None
        inflight = await self.s.queue.inflight(self.address)
        await self.s.queue.ack([m.id for m in inflight], claim=chat.claim)
        await self.s.store.update_chat(self.address, **({} if keep_busy else _IDLE), **fields)
        return chat, inflight

    async def _fail_turn(self, reason: str) -> None:
        """eve refused the message itself: say so, free the chat."""
        async with self.s.store.db.transaction():
            chat, inflight = await self.end_busy()
            reply_to = int(inflight[-1].payload["message_id"]) if inflight else None
            await self.say(chat, f"failed:{chat.claim}", t("turn_failed", chat.lang, reason=reason), reply_to=reply_to)
        METRICS.turns.labels(outcome="failed").inc()

    async def lost(self, reason: str) -> None:
        """The session is gone or stuck: free the chat with the session-reset mark (R2, R3).

        The person whose turn was interrupted is told to repeat it; an interrupted auto
        compaction is silent; an interrupted /compact asks for /compact again. The next message
        starts a new session at once, without waiting on a /reset that cannot succeed.
        """
        async with self.s.store.db.transaction():
            chat, inflight = await self.end_busy(
                reset_mark=1, eve_session=None, cursor=0, measurement=None, compaction_disabled=0,
                after_pending=0, compact_failures=0, compact_retry_at=None,
            )
            if chat.kind == "turn" and inflight:
                await self.say(chat, f"lost:{chat.claim}", t("session_lost", chat.lang),
                               reply_to=int(inflight[-1].payload["message_id"]))
            elif chat.kind == "compact" and chat.origin == "manual":
                await self.say(chat, f"compact-again:{chat.claim}", t("compact_again", chat.lang))
        if chat.kind == "compact":
            METRICS.compactions.labels(origin=chat.origin or "auto", outcome="lost").inc()
        self.s.manual.pop(self.address, None)
        self.s.manual_marks.discard(self.address)
        METRICS.turns.labels(outcome="lost").inc()
        logger.warning("eve_session_lost", reason=reason, session=chat.eve_session, kind=chat.kind)
        await self.flush_outbox(chat)

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
            current, _ = await self.end_busy(
                eve_session=None, cursor=0, measurement=None, compaction_disabled=0, reset_mark=0,
                reset_requested=0, reset_reply_to=None, reset_dropped=0, after_pending=0,
                compact_failures=0, compact_retry_at=None,
            )
            dropped = current.reset_dropped
            text = t("new_dropped", current.lang, n=dropped) if dropped else t("new_done", current.lang)
            if self.s.notebook is not None and (kept := await self.s.notebook.count(self.address)):
                text += " " + t("new_notes_kept", current.lang, n=kept)  # N8: the notebook outlives /new
            await self.say(current, f"new:{current.reset_reply_to}", text, reply_to=current.reset_reply_to)
        self.s.manual.pop(self.address, None)
        self.s.manual_marks.discard(self.address)
        self.s.after_reports.pop(self.address, None)
        logger.info("conversation_reset", dropped=dropped)
        await self.flush_outbox(current)
