"""One backoff value for every retry loop of the bridge: exponential, capped, with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["COMMIT", "EVE", "POLL", "STARTUP", "TELEGRAM", "WEBHOOK", "WORKER", "Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """``min(cap, base × factor**attempt)``, then up to ``jitter`` (a fraction) added on top.

    ``attempt`` counts failures so far, from 0 or 1 as the caller counts; the cap bounds it.
    """

    base: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        raw = self.cap if attempt >= 64 else min(self.cap, self.base * self.factor ** max(0, attempt))
        return raw * (1.0 + random.uniform(0.0, self.jitter)) if self.jitter else raw


EVE = Backoff(base=0.5, cap=30.0)  # eve unreachable: the worker waits (a poke wakes it early)
TELEGRAM = Backoff(base=0.5, cap=30.0)  # a reply's 5xx or dropped connection
POLL = Backoff(base=0.5, cap=30.0, factor=1.6)  # getUpdates failing
STARTUP = Backoff(base=0.5, cap=30.0)  # getMe / eve's info at start
WORKER = Backoff(base=2.0, cap=60.0, jitter=0.0)  # a worker's unexpected error (logged each time)
COMMIT = Backoff(base=0.2, cap=10.0, jitter=0.0)  # a state commit that failed (disk, lock)
WEBHOOK = Backoff(base=2.0, cap=300.0)  # the webhook's port busy or its URL refused: the operator's to fix
