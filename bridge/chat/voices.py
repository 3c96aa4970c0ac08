"""The speakers' pool and queue (F13, P4): at most :data:`SPEAKERS` speaker processes at once for
every chat together, each held from its start until its voice went (so the audio in memory is at
most ``SPEAKERS`` × ``speak.MAX_VOICE``); the rest wait in a queue of at most
:data:`VOICES_WAITING` answers (their text only), past which an answer stays text only (logged by
the caller). One chat's voices are made and sent one after another, in the order they were
queued — each queued after its answer's text went (``speak.after_answer``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .transcribe import Pool

__all__ = ["SPEAKERS", "VOICES_WAITING", "Voices"]

# F13. Speakers at once, all chats: text-to-speech is CPU-bound (espeak-ng and opusenc, or a
# neural model, take a core each) and the hosts Iva runs on have two; each also holds up to
# speak.MAX_VOICE (20 MB) of audio until its voice went — 40 MB at most. Two keep the turns' own work
# (eve's stream, the store) a core while voices are made.
SPEAKERS = 2
# Answers waiting for a speaker, all chats: each holds its text only (at most speak.MAX_TEXT
# characters). 64 is a voice for every one of IVA_MAX_TURNS' 16 turns four times over; more
# waiting means the speakers cannot keep up, and a voice minutes late is no answer.
VOICES_WAITING = 64


class Voices:
    """The speakers' pool and queue (F13): :data:`SPEAKERS` at once for every chat together, at
    most :data:`VOICES_WAITING` answers waiting; one chat's voices one after another, in order.
    ``speaking`` and ``waiting`` say how many now (tests and the log read them)."""

    def __init__(self, speakers: int = SPEAKERS, waiting: int = VOICES_WAITING) -> None:
        self._pool = Pool(speakers)
        self._limit = waiting
        self._chats: dict[str, deque[Callable[[], Awaitable[object]]]] = {}

    @property
    def speaking(self) -> int:
        return self._pool.busy

    @property
    def waiting(self) -> int:
        return sum(len(jobs) for jobs in self._chats.values())

    def add(self, address: str, job: Callable[[], Awaitable[object]],
            spawn: Callable[[Coroutine[Any, Any, Any]], object]) -> bool:
        """Queue ``job`` (making and sending one voice) behind the chat's earlier ones; False
        when the queue is full (the answer stays text only)."""
        if self.waiting >= self._limit:
            return False
        jobs = self._chats.get(address)
        if jobs is None:
            jobs = self._chats[address] = deque()
            spawn(self._chat(address, jobs))
        jobs.append(job)
        return True

    async def _chat(self, address: str, jobs: deque[Callable[[], Awaitable[object]]]) -> None:
        """One chat's voices, one after another, each when a speaker is free."""
        try:
            while jobs:
                async with self._pool:
                    await jobs.popleft()()
        finally:
            if self._chats.get(address) is jobs:
                del self._chats[address]
