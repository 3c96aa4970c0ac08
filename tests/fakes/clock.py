"""A clock a test moves by hand: ``clock()`` is the time, ``await clock.sleep(s)`` returns once
the test has advanced it by ``s`` (``await clock.advance(s)``). The pacer takes it for the holds
a 429 puts on a chat, so a test can tell a chat to wait 25 s without waiting them."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from bridge.chat.services import PeriodClock

T = TypeVar("T")


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleepers = 0  # sleeps not yet over
        self._changed = asyncio.Condition()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        self.sleepers += 1
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self.now >= until)
        finally:
            self.sleepers -= 1

    async def advance(self, seconds: float) -> None:
        async with self._changed:
            self.now += seconds
            self._changed.notify_all()


class HandClock(PeriodClock):
    """The busy periods' clock (:class:`bridge.chat.services.PeriodClock`), moved by hand: a consumer's
    deadline (the busy timeout, the ack window, a grace) passes when the test advances it past
    it, never in real seconds. ``waiting`` counts the consumers waiting on it now."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self.start = start
        self.waiting = 0
        self._changed = asyncio.Condition()
        self._reading = 0  # how often the clock was moved
        self._read: dict[object, int] = {}  # a deadline waiting on the clock → the reading it last saw

    def now(self) -> float:
        return self.t

    async def _until(self, at: float) -> None:
        token = object()
        self._read[token] = self._reading

        def due() -> bool:
            self._read[token] = self._reading
            return self.t >= at

        try:
            async with self._changed:
                await self._changed.wait_for(due)
        finally:
            del self._read[token]

    async def settled(self) -> None:
        """Every deadline waiting on the clock has looked at its latest reading (and so fired, if
        it was due): after an advance that reached none, nothing is left to happen."""
        # a turn of the loop at a time for the waiters to look: a condition polled, no time waited
        while any(seen < self._reading for seen in self._read.values()):  # noqa: ASYNC110
            await asyncio.sleep(0)

    async def get(self, queue: asyncio.Queue[T], within: float) -> T | None:
        if not queue.empty():
            return queue.get_nowait()
        getter = asyncio.ensure_future(queue.get())
        timer = asyncio.ensure_future(self._until(self.t + max(0.0, within)))
        self.waiting += 1
        try:
            await asyncio.wait({getter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.waiting -= 1
            timer.cancel()
            if not getter.done():
                getter.cancel()
        return getter.result() if getter.done() and not getter.cancelled() else None

    async def sleep(self, seconds: float) -> None:
        await self._until(self.t + seconds)

    async def advance(self, seconds: float) -> None:
        async with self._changed:
            self.t += seconds
            self._reading += 1
            self._changed.notify_all()


class SteppedWall:
    """The wall clock and the monotonic clock of a process, moved by hand: :meth:`passes` moves
    both (time passes), :meth:`step` the wall alone (NTP stepping it, an operator's ``date``).
    ``wall`` and ``mono`` are the two readings (a :class:`bridge.clock.Clock` is made of them)."""

    def __init__(self, wall: float, mono: float = 5_000.0) -> None:
        self.at = wall
        self.mono_at = mono

    def wall(self) -> float:
        return self.at

    def mono(self) -> float:
        return self.mono_at

    def passes(self, seconds: float) -> None:
        self.at += seconds
        self.mono_at += seconds

    def step(self, seconds: float) -> None:
        self.at += seconds
