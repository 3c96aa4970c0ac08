"""One worker per address, started on demand by the scheduler (T3, T4).

The worker claims the address's next messages and marks the chat busy in one transition, sends
them to eve, and hands the stream to a :class:`~bridge.chat.consumer.BusyPeriod`, which follows
the turn, its parking and any compaction. A busy record found when the worker looks (a restart,
a /compact captured by ingest) goes to :func:`~bridge.chat.recovery.resume`.

Workers wake on an event (a committed message, /new, /compact), never on a polling timer; an
idle worker exits and the scheduler starts a new one when the chat has work again.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

import eve_client as eve

from .. import backoff, log
from ..metrics import METRICS
from ..telegram.texts import t
from .consumer import POKE, Inbox
from .recovery import drive, released_announced, resume
from .services import Services, Slot, files_budget
from .transitions import ChatState, Settling, state_of

__all__ = ["ChatWorker", "Scheduler"]

UNSUPPORTED_WAIT = 60.0  # seconds between looks at an eve whose stream this Iva cannot read

logger = log.get(__name__)

RESET_TIMEOUT = 10.0


class Scheduler:
    """Starts a worker per address on demand; bounds concurrent eve turns (T3)."""

    def __init__(self, services: Services) -> None:
        self.s = services
        self.slots = asyncio.Semaphore(services.settings.chat.max_turns)
        self.workers: dict[str, ChatWorker] = {}
        self._closing = False

    def wake(self, address: str) -> None:
        if self._closing:
            return
        worker = self.workers.get(address)
        if worker is not None and not worker.done:
            worker.poke()
            return
        worker = ChatWorker(self.s, self.slots, address)
        self.workers[address] = worker
        worker.start(on_done=self._finished)

    def _finished(self, worker: ChatWorker) -> None:
        if self.workers.get(worker.address) is worker:
            del self.workers[worker.address]

    async def recover(self) -> int:
        """Wake every address with unfinished business; the workers do the rest (R2)."""
        s = self.s
        addresses = {c.address for c in await s.store.busy_chats()}
        addresses.update(await s.queue.addresses_with())
        addresses.update(await s.store.addresses_with_pending_outgoing())
        addresses.update(await s.store.chats_wanting_reset())
        addresses.update(await s.store.released_chats())  # C6: a released compaction nobody watches now
        for address in sorted(addresses):
            self.wake(address)
        return len(addresses)

    def halt(self) -> None:
        """Start no worker from now on and cancel the running ones, without waiting for them (the
        first half of :meth:`close`; a crash in the tests' harness is this, then whatever follows)."""
        self._closing = True
        for worker in self.workers.values():
            if not worker.done:
                worker.cancel()

    async def close(self) -> None:
        """Stop every worker; busy records stay as they are, for recovery (R4)."""
        workers = [w for w in self.workers.values() if not w.done]
        self.halt()
        for worker in workers:
            await worker.wait()
        await self.s.requests.close()

    def settled(self) -> bool:
        """No worker runs (tests and benchmarks wait for this)."""
        return all(w.done for w in self.workers.values())


class ChatWorker:
    def __init__(self, services: Services, slots: asyncio.Semaphore, address: str) -> None:
        self.s = services
        self.slots = slots
        self.address = address
        self.inbox: Inbox = asyncio.Queue()
        self._poked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, on_done: object = None) -> None:
        self._task = asyncio.create_task(self._main(), name=f"chat:{self.address}")
        if callable(on_done):
            self._task.add_done_callback(lambda _: on_done(self))

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
            await asyncio.wait({self._task})

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
                await asyncio.sleep(backoff.WORKER.delay(failures))

    async def _run(self) -> None:
        s = self.s
        eve_failures = 0
        while True:
            self._poked.clear()
            # What an earlier process or a failed send left pending (an answer may wait for an
            # address with no record yet); what a commit writes from now on, the commit sends.
            await s.outbox.resend_left(self.address)
            chat = await s.store.chat(self.address)
            if chat is None:
                return
            if chat.reset_requested:
                await self._reset()
                continue
            try:
                if chat.busy:
                    await resume(s, self.inbox, chat)
                    eve_failures = 0
                    continue
                if state_of(chat) is ChatState.RELEASED:
                    # C6: eve may have announced the released compaction (after a restart nothing
                    # watched for it): then it is ours again and a message waits behind it.
                    if await released_announced(s, chat):
                        continue
                    if not await s.queue.depth(self.address):
                        return  # nothing waits: the next message reads eve's stream again
                if not await self._start_turn():
                    if self._poked.is_set():
                        continue
                    return
                eve_failures = 0
            except eve.UnsupportedStream:
                # V1: eve speaks a stream version this Iva cannot read. Nothing is lost (the queue
                # and the busy record keep everything); it is said once (eve_client's log, /healthz,
                # /status, iva check), and looked at again after a while or on a new message.
                METRICS.eve_errors.labels(kind="stream_version").inc()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(UNSUPPORTED_WAIT):
                        await self._poked.wait()
            except eve.EveTransportError as exc:
                # R6: eve is unreachable. Nothing is lost: the busy record or the queue keeps
                # the messages. Wait and try again; a poke (new message, /new) wakes us early.
                eve_failures += 1
                METRICS.eve_errors.labels(kind="transport").inc()
                wait = backoff.EVE.delay(eve_failures)
                logger.warning("eve_unreachable", error=str(exc), wait=round(wait, 1))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._poked.wait()

    async def _start_turn(self) -> bool:
        """idle → busy(turn): claim the next messages and hand them to eve. False: nothing to do."""
        s = self.s
        if await s.queue.depth(self.address) == 0:
            return False
        slot = Slot(self.slots)
        await slot.take()
        try:
            claimed = await s.transitions.claim_turn(self.address, limit=s.settings.chat.batch_size,
                                                     files_budget=files_budget(s.settings.telegram.max_file_mb),
                                                     file_cap=s.settings.telegram.max_file_mb * 1024 * 1024)
            if claimed is None:
                chat = await s.store.chat(self.address)
                # Taken meanwhile (/compact, /new), or only stale button presses were taken off:
                # the main loop looks again; else there is nothing to do.
                return chat is not None and (chat.busy or chat.reset_requested
                                             or await s.queue.depth(self.address) > 0)
            if not isinstance(claimed, Settling):
                logger.info("turn_claimed", messages=[m.id for m in claimed.messages], session=claimed.session)
                await drive(s, self.inbox, self.address, claimed.claim, claimed.messages, slot=slot)
                return True
        finally:
            slot.give_back()
        # An album still arriving: look again once it settled, or sooner when poked (a new part,
        # /new); without the turn slot meanwhile.
        logger.debug("album_settling", wait=round(claimed.at - s.transitions.mono(), 3))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, claimed.at - s.transitions.mono())):  # F9: monotonic
                await self._poked.wait()
        return True

    # -- /new -------------------------------------------------------------------------------

    async def _reset(self) -> None:
        """M7: retire the eve session (cancelling what runs) and start afresh."""
        s = self.s
        chat = await s.store.chat(self.address)
        assert chat is not None
        if chat.eve_session and not chat.reset_mark:
            try:
                async with asyncio.timeout(RESET_TIMEOUT):
                    await s.eve.end(chat.eve_session, reason="/new")
            except (eve.EveError, TimeoutError) as exc:
                # A stuck session cannot be reset (PROTOCOL.md §9); we leave it behind.
                logger.warning("eve_reset_failed", error=str(exc))
        async with s.store.db.transaction():
            current = await s.transitions.new_conversation(self.address)
            dropped = current.reset_dropped
            text = t("new_dropped", current.lang, n=dropped) if dropped else t("new_done", current.lang)
            if s.notebook is not None and (kept := await s.notebook.count(self.address)):
                text += " " + t("new_notes_kept", current.lang, n=kept)  # N8: the notebook outlives /new
            await s.outbox.say(current, f"new:{self.address}:{current.reset_reply_to}", text,
                               reply_to=current.reset_reply_to)
        logger.info("conversation_reset", dropped=dropped)
