"""A clock a test moves by hand: ``clock()`` is the time, ``await clock.sleep(s)`` returns once
the test has advanced it by ``s`` (``await clock.advance(s)``). The pacer takes it for the holds
a 429 puts on a chat, so a test can tell a chat to wait 25 s without waiting them."""

from __future__ import annotations

import asyncio


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
