"""Voice for voice (P4, ``IVA_SPEAK_CMD``): the answer to a voice message also comes as
a voice message, its text kept as it was sent.

The mirror of :mod:`.transcribe`, with the same rules: the operator's command runs without a
shell, in a fresh directory only we can read (0700, its working directory, removed afterwards),
in a session of its own whose whole process group is killed when it is done, out of time or
cancelled, with the bridge's environment minus the ``IVA_*`` settings and systemd's variables.
It reads the answer's plain text on its standard input and writes OGG/Opus audio on its standard
output (what ``sendVoice`` takes), within ``IVA_SPEAK_TIMEOUT``.

Off by default. It never holds the turn: the text goes first, as always; the voice follows from
a task of its own. A speaker that fails, hangs or prints something that is not OGG costs the
voice only — the person has the text — and is said once in the log, per answer. Not durable: a
crash between the text and the voice loses the voice, never the text.

F13: the speakers run in a bounded pool with a queue (:class:`~.voices.Voices`): a chat's voices
are made and sent one after another, in the order of their answers, each after its text.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from functools import partial

from aiogram.types import BufferedInputFile

from .. import log
from ..config import Settings
from ..errors import BridgeError
from ..storage.payloads import QueuedMessage, Spoken, decode
from ..telegram.render import render
from .services import Services
from .transcribe import _drain, _end, _environment

__all__ = ["MAX_VOICE", "SpeakFailed", "Speaker", "after_answer", "answer_aloud", "spoken_to"]

logger = log.get(__name__)

MAX_VOICE = 20 * 1024 * 1024  # bytes of audio kept; a longer output is no voice we send
MAX_TEXT = 20_000  # characters of an answer read aloud
MAX_STDERR = 2000


class SpeakFailed(BridgeError):
    """No voice for an answer: ``outcome`` for the log, the message says why."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class Speaker:
    argv: tuple[str, ...]
    timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Speaker | None:
        return cls(settings.voice.speak_cmd, settings.voice.speak_timeout) if settings.voice.speak_cmd else None

    async def speak(self, text: str) -> bytes:
        """OGG/Opus audio of ``text``; raises :class:`SpeakFailed`."""
        try:
            workdir = tempfile.mkdtemp(prefix="iva-speak-")  # mode 0700: ours alone
        except OSError as exc:
            raise SpeakFailed("failed", f"no private directory for the speaker: {exc}") from exc
        try:
            return await self._run(text, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run(self, text: str, workdir: str) -> bytes:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=workdir, env=_environment(os.environ), start_new_session=True)
        except OSError as exc:
            raise SpeakFailed("failed", f"the command could not start: {exc}") from exc
        try:
            async with asyncio.timeout(self.timeout):
                (out, cut), (err, _), _ = await asyncio.gather(
                    _drain(proc.stdout, MAX_VOICE), _drain(proc.stderr, MAX_STDERR, tail=True),
                    _feed(proc, text.encode()))
                code = await proc.wait()
        except TimeoutError:
            raise SpeakFailed("timeout", f"no voice within {self.timeout:g} s") from None
        finally:
            await _end(proc)
        if code != 0:
            stderr = err.decode("utf-8", "replace").strip()
            raise SpeakFailed("failed", f"the command exited with {code}: {stderr[-300:]}")
        if cut:
            raise SpeakFailed("too_long", f"the command printed more than {MAX_VOICE} bytes")
        if not out.startswith(b"OggS"):
            raise SpeakFailed("not_ogg", f"the command printed {len(out)} bytes that are not OGG audio")
        return out


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """The text on the command's standard input, then its end; a command that does not read
    it (or is gone) is not an error here: its exit code and output say what happened."""
    stdin = proc.stdin
    if stdin is None:
        return
    try:
        stdin.write(data)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        stdin.close()


def spoken_to(messages: list[QueuedMessage]) -> QueuedMessage | None:
    """The voice message among a turn's messages that an answer answers (the last), if any."""
    voices = [m for m in messages if m.attachment is not None and m.attachment.spoken is Spoken.VOICE]
    return voices[-1] if voices else None


async def after_answer(s: Services, address: str, chat_id: int, thread_id: int | None, text: str) -> None:
    """Called by the turn's consumer once an answer's text is on its way: when a speaker is set
    and the turn answers a voice message (read now, while the turn's messages are in flight),
    the voice is queued in the speakers' pool (F13), behind the chat's earlier voices — the turn
    never waits for it."""
    speaker = Speaker.from_settings(s.settings)
    if speaker is None:
        return
    turn = [m for m in (decode(r.payload) for r in await s.queue.inflight(address)) if isinstance(m, QueuedMessage)]
    if spoken_to(turn) is None:
        return
    if not s.voices.add(address, partial(answer_aloud, s, speaker, chat_id, thread_id, text), s.spawn):
        logger.warning("voice_answer_failed", outcome="queue_full", waiting=s.voices.waiting, fallback="text only")


async def answer_aloud(s: Services, speaker: Speaker, chat_id: int, thread_id: int | None, text: str) -> bool:
    """The answer ``text`` as a voice message; True when it went. Any failure is one log line."""
    plain = "\n".join(chunk.text for chunk in render(text, markdown=True)).strip()[:MAX_TEXT]
    if not plain:
        return False
    started = time.monotonic()
    try:
        audio = await speaker.speak(plain)
        await s.sender.bot.send_voice(chat_id=chat_id, voice=BufferedInputFile(audio, "answer.ogg"),
                                      message_thread_id=thread_id)
    except SpeakFailed as exc:
        logger.warning("voice_answer_failed", outcome=exc.outcome, error=str(exc), fallback="text only")
        return False
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # Telegram refused it: the text was sent, the voice is extra
        logger.warning("voice_answer_failed", outcome="telegram", error=str(exc)[:300], fallback="text only")
        return False
    logger.info("voice_answer_sent", bytes=len(audio), seconds=round(time.monotonic() - started, 2))
    return True
