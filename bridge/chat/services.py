"""What the chat's machinery is given: one frozen bundle of services, built by the composition
root (``bridge.app``) and by the in-process test harness alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from diskqueue import DiskQueue
from eve_client import EveClient

from ..config import Settings
from ..models import ChatModels
from ..notebook import Notebook, Rebuilder
from ..people import People
from ..storage.store import Store
from ..telegram.sender import Sender
from . import parking
from .media import Media
from .outbox import Outbox
from .transcribe import TRANSCRIBERS, Pool
from .transitions import Transitions
from .voices import Voices

__all__ = ["CompactRequests", "ContextWindow", "PeriodClock", "Services", "Slot"]

T = TypeVar("T")


class PeriodClock:
    """The busy periods' time, injected like :class:`~.transitions.Transitions`' clocks: the
    monotonic clock of their deadlines (the busy timeout, the ack window, the graces), its
    waits and its timers. A test gives one it moves by hand (``tests/fakes/clock.py``); the
    wall time written to the record is the transitions' steady one (:mod:`bridge.clock`)."""

    def now(self) -> float:
        return time.monotonic()

    async def get(self, queue: asyncio.Queue[T], within: float) -> T | None:
        """The queue's next item, or None when ``within`` seconds passed first."""
        try:
            async with asyncio.timeout(max(0.0, within)):
                return await queue.get()
        except TimeoutError:
            return None

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def later(self, delay: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback)


class Slot:
    """One of the global turn slots (T3), held while eve works on a turn. A turn waiting on the
    person gives it back — waiting is not work, and must not starve other chats (F5) — and takes
    one again when it goes on, if one is free (it never waits for one: eve already runs it)."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self.slots = slots
        self.held = False

    async def take(self) -> None:
        await self.slots.acquire()
        self.held = True

    async def retake(self) -> None:
        if not self.held and not self.slots.locked():
            await self.slots.acquire()
            self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()


@dataclass(slots=True)
class ContextWindow:
    """The model's context window: from IVA_CONTEXT_WINDOW, or learned from eve at start."""

    tokens: int | None = None

    def learn(self, tokens: int | None) -> None:
        self.tokens = tokens


class CompactRequests:
    """The compact requests in flight, one per address at most (C5). A request is a process
    fact: it outlives a busy period (a released compaction) but not the process."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def outstanding(self, address: str) -> bool:
        task = self._tasks.get(address)
        return task is not None and not task.done()

    def start(self, address: str, coro: Coroutine[Any, Any, None]) -> None:
        if self.outstanding(address):
            coro.close()
            raise RuntimeError(f"a compact request for {address} is in flight already")
        self._tasks[address] = asyncio.create_task(coro, name=f"compact:{address}")

    async def close(self) -> None:
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()


TURN_FILES_MB = 50  # the declared size of a turn's files, at most (a file of unknown size counts as the cap)
FILE_TURNS = 2  # turns with files composed and sent at once


def files_budget(max_file_mb: int) -> int:
    """Bytes of files one turn may carry: TURN_FILES_MB, or one file at the cap if that is more."""
    return max(TURN_FILES_MB, max_file_mb) * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    eve: EveClient
    store: Store
    queue: DiskQueue
    transitions: Transitions
    sender: Sender
    outbox: Outbox
    spawn: Callable[[Coroutine[Any, Any, Any]], object]
    people: People  # who may talk: the settings' ids and the paired and invited (P1-P4, S7)
    models: ChatModels  # which model answers each chat (D1): IVA_MODELS and /model's choices
    notebook: Notebook | None = None
    rebuilder: Rebuilder | None = None
    window: ContextWindow = field(default_factory=ContextWindow)
    requests: CompactRequests = field(default_factory=CompactRequests)
    # Turns whose files are in memory at once (each at most TURN_FILES_MB, about 3.5 copies while
    # encoded and sent): the bridge's memory stays bounded however many albums arrive.
    files: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(FILE_TURNS))
    media: Media = field(default_factory=Media)  # a turn's parts and transcripts, kept until eve has it
    voices: Voices = field(default_factory=Voices)  # the speakers' pool and queue (F13, voices.py)
    # Transcribers at once, all chats (F13, transcribe.py): the slot covers a recording's download too.
    hearing: Pool = field(default_factory=lambda: Pool(TRANSCRIBERS))
    clock: PeriodClock = field(default_factory=PeriodClock)  # the busy periods' time

    async def window_of(self, address: str | None) -> int | None:
        """D3: the window of the model that answers the chat (IVA_MODELS), else the agent's."""
        if address is not None and self.models.enabled:
            model = (await self.models.of(address)).model
            if model is not None:
                return model.window
        return self.window.tokens

    async def threshold(self, address: str | None = None) -> int:
        """The parking threshold of the chat's model (D3); without an address, the agent's."""
        s = self.settings
        return parking.threshold(await self.window_of(address), s.compaction.percent, s.compaction.ceiling)

    @classmethod
    def build(cls, *, settings: Settings, eve_client: EveClient, store: Store, queue: DiskQueue, sender: Sender,
              spawn: Callable[[Coroutine[Any, Any, Any]], object], notebook: Notebook | None = None,
              rebuilder: Rebuilder | None = None, clock: PeriodClock | None = None,
              models: ChatModels | None = None) -> Services:
        notebook = notebook if notebook is not None and notebook.enabled else None
        transitions = Transitions(store, queue, notebook)
        return cls(settings=settings, eve=eve_client, store=store, queue=queue, transitions=transitions,
                   sender=sender, outbox=Outbox(store, sender, transitions, spawn), spawn=spawn,
                   people=People(store, settings), notebook=notebook,
                   models=models or ChatModels(store.db, settings.models),
                   rebuilder=rebuilder if notebook is not None else None,
                   window=ContextWindow(settings.compaction.context_window), clock=clock or PeriodClock())
