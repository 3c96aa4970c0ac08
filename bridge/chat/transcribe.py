"""Spoken input as text (I4, ``IVA_VOICE=command``): the operator's command, run without a
shell on a private copy of the recording, within a timeout; what it prints is the transcript.

The command line is ``IVA_TRANSCRIBE_CMD`` split as a shell would split it (config does that
once), with the recording's path appended as its last argument. The recording lives in a fresh
directory only we can read (0700), removed afterwards whatever happens; the command runs in a
session of its own, so when it is done, out of time or cancelled, its whole process group is
killed — a helper it started cannot outlive it. It gets the bridge's environment without the
``IVA_*`` settings (the bot token is not its business) and without systemd's notify and
watchdog variables (the bridge alone speaks to systemd).

F13: the transcribers run in a bounded pool, :data:`TRANSCRIBERS` at once for every chat
together (``Services.hearing``, passed in as ``pool``); a recording waits for its slot before it
is downloaded (:meth:`Transcriber.slot`), so one waiting holds nothing. The queue is the turns
themselves: at most ``IVA_MAX_TURNS`` (and a steer each) wait for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import PurePath

from .. import log
from ..config import Settings
from ..errors import BridgeError
from ..metrics import METRICS

__all__ = ["TRANSCRIBERS", "Pool", "TranscribeFailed", "Transcriber"]

logger = log.get(__name__)

MAX_TRANSCRIPT = 256 * 1024  # bytes of standard output kept (hours of speech); the rest is read and dropped
MAX_STDERR = 2000  # the tail of standard error kept for the log
REAP_SECONDS = 5.0  # after SIGKILL, how long the command may take to be gone
# F13. Transcriptions at once, all chats: speech recognition is CPU-bound (whisper.cpp and its
# kind take every core they are given) and the hosts Iva runs on have two; each also holds its
# recording (up to IVA_MAX_FILE_MB) and the command's own memory. Sixteen at once (one per turn
# slot) made every transcription sixteen times slower and held sixteen recordings.
TRANSCRIBERS = 2
_CHUNK = 64 * 1024
_HIDDEN = ("NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC")


class Pool:
    """A bounded pool's slots (F13), taken first come, first served: ``busy`` are held now,
    ``waiting`` wait for one."""

    def __init__(self, size: int) -> None:
        self._slots = asyncio.Semaphore(size)
        self.busy = 0
        self.waiting = 0

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.busy += 1

    async def __aexit__(self, *exc: object) -> None:
        self.busy -= 1
        self._slots.release()


class TranscribeFailed(BridgeError):
    """A recording has no transcript: ``outcome`` for the metric, the message for the log."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class Transcriber:
    argv: tuple[str, ...]
    timeout: float
    pool: Pool | None = field(default=None, compare=False)  # F13: the slots (None: unbounded)

    @classmethod
    def from_settings(cls, settings: Settings, pool: Pool | None = None) -> Transcriber | None:
        """The transcriber of ``IVA_VOICE=command``; None under any other setting."""
        if settings.voice.mode != "command" or not settings.voice.transcribe_cmd:
            return None
        return cls(settings.voice.transcribe_cmd, settings.voice.transcribe_timeout, pool)

    def slot(self) -> AbstractAsyncContextManager[None]:
        """One of the pool's slots, held for a recording's download and its transcription (F13)."""
        return self.pool if self.pool is not None else contextlib.nullcontext()

    async def transcribe(self, data: bytes, name: str) -> str:
        """The transcript of the recording ``data`` (``name`` gives the file its suffix only);
        raises :class:`TranscribeFailed`."""
        started = time.monotonic()
        try:
            text = await self._transcribe(data, name)
        except TranscribeFailed as exc:
            METRICS.transcriptions.labels(outcome=exc.outcome).inc()
            raise
        METRICS.transcriptions.labels(outcome="ok").inc()
        logger.info("voice_transcribed", chars=len(text), seconds=round(time.monotonic() - started, 2))
        return text

    async def _transcribe(self, data: bytes, name: str) -> str:
        try:
            workdir = tempfile.mkdtemp(prefix="iva-voice-")  # mode 0700: ours alone
        except OSError as exc:
            raise TranscribeFailed("failed", f"no private directory for the recording: {exc}") from exc
        try:
            path = os.path.join(workdir, f"recording{_suffix(name)}")
            try:
                # At most IVA_MAX_FILE_MB, written at once: no thread may still be writing into
                # the directory when it is removed below.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            except OSError as exc:
                raise TranscribeFailed("failed", f"the recording could not be written: {exc}") from exc
            return await self._run(path)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run(self, path: str) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, path, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=_environment(os.environ), start_new_session=True)
        except OSError as exc:
            raise TranscribeFailed("failed", f"the command could not start: {exc}") from exc
        try:
            async with asyncio.timeout(self.timeout):
                (out, cut), (err, _) = await asyncio.gather(_drain(proc.stdout, MAX_TRANSCRIPT),
                                                            _drain(proc.stderr, MAX_STDERR, tail=True))
                code = await proc.wait()
        except TimeoutError:
            raise TranscribeFailed("timeout", f"no transcript within {self.timeout:g} s") from None
        finally:
            await _end(proc)
        if code != 0:
            stderr = err.decode("utf-8", "replace").strip()
            raise TranscribeFailed("failed", f"the command exited with {code}: {stderr[-300:]}")
        text = out.decode("utf-8", "replace").strip()
        if not text:
            raise TranscribeFailed("empty", "the command printed nothing")
        return f"{text}…" if cut else text


async def _drain(stream: asyncio.StreamReader | None, cap: int, *, tail: bool = False) -> tuple[bytes, bool]:
    """Everything ``stream`` gives until its end, keeping ``cap`` bytes (the first, or with
    ``tail`` the last): a command that prints without end is read, never held in memory."""
    kept, cut = b"", False
    if stream is None:
        return kept, cut
    while chunk := await stream.read(_CHUNK):
        cut = cut or len(kept) + len(chunk) > cap
        if tail:
            kept = (kept + chunk)[-cap:]
        elif len(kept) < cap:
            kept += chunk[:cap - len(kept)]
    return kept, cut


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Done, out of time or cancelled: the command's whole process group is killed (a helper it
    left behind too) and the command reaped — waiting a bounded time, so a process we may not
    kill cannot hold the chat."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        try:
            async with asyncio.timeout(REAP_SECONDS):
                await proc.wait()
        except TimeoutError:
            logger.error("transcribe_command_unkillable", pid=proc.pid)


def _environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("IVA_") and k not in _HIDDEN}


def _suffix(name: str) -> str:
    """The recording's suffix (``.ogg``) for a command that goes by it; nothing of the name the
    sender chose reaches the path but that, and only when it is plain."""
    suffix = PurePath(name).suffix
    return suffix if re.fullmatch(r"\.[A-Za-z0-9]{1,8}", suffix) else ""
