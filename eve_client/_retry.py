"""Retry policy: bounded, jittered, and only for errors worth another try."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from ._errors import EveConnectError, EveServerError, EveTransportError, SessionNotReady

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How eve_client retries. ``attempts`` and ``deadline`` both bound it."""

    attempts: int = 5
    deadline: float = 30.0
    initial_wait: float = 0.1
    max_wait: float = 4.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.deadline <= 0 or self.initial_wait < 0 or self.max_wait < self.initial_wait:
            raise ValueError("RetryPolicy waits must be positive and max_wait >= initial_wait")

    def backoff(self, failures: int) -> float:
        """The jittered wait before attempt ``failures + 1`` of a hand-written loop."""
        factor: int = 2 ** max(0, failures - 1)  # int ** int is typed Any (a negative power is a float)
        base = min(self.max_wait, self.initial_wait * factor)
        return base + random.uniform(0, self.jitter)

    def retrying(self, *, idempotent: bool, keyed: bool = False) -> AsyncRetrying:
        """A tenacity controller; a non-idempotent route retries only what eve never saw. A
        ``keyed`` one (a send with an idempotency key, eve 1.x: eve answers the same key once,
        V4) is sent again when its answer was lost — a dropped connection, a timeout, a proxy's
        502/503/504 — but not on eve's own 500 about the message (counted by the caller, F6)."""
        if keyed:
            return AsyncRetrying(
                stop=stop_after_attempt(self.attempts) | stop_after_delay(self.deadline),
                wait=wait_exponential_jitter(multiplier=self.initial_wait, max=self.max_wait, jitter=self.jitter),
                retry=retry_if_exception(_lost_answer),
                reraise=True,
            )
        retryable: tuple[type[BaseException], ...] = (
            (EveTransportError, SessionNotReady) if idempotent else (EveConnectError, SessionNotReady)
        )
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.deadline),
            wait=wait_exponential_jitter(multiplier=self.initial_wait, max=self.max_wait, jitter=self.jitter),
            retry=retry_if_exception_type(retryable),
            reraise=True,
        )


def _lost_answer(exc: BaseException) -> bool:
    """The request may have reached eve and only its answer was lost (or eve never saw it)."""
    if isinstance(exc, EveServerError):
        return exc.status in (502, 503, 504)
    return isinstance(exc, EveTransportError | SessionNotReady)
