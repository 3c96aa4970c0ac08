"""Queued messages → what eve receives: one turn of text (and file parts) from several messages.

A message that replies to another carries that message as quoted context, on the lines before
the person's words (I1)::

    > (replying to you) the assistant's earlier answer, or the part the person quoted
    > and its further lines
    Ann: the person's words

"(replying to X)" for the whole message, "(quoting X)" for a part the person selected; X is "you"
(the assistant's own answer), the author's name in quotes (``"Ann"``: nobody can name themselves
"you"), or "a message" when Telegram does not say;
", in "Title"" or ", in another topic" follows for a message from elsewhere. The text is at most
1 000 characters (then "…"); its attachments are named ("[photo]"), never sent again.

An edit of a message eve already has comes as ``[correction of my earlier message] <the new
words>`` (:mod:`bridge.intake.edits`); the parts of an album go in one turn, every file a part, each
caption a line.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiogram import Bot

import eve_client as eve

from .. import log
from ..errors import BridgeError
from ..metrics import METRICS
from ..storage.payloads import Attachment, PushedTurn, Queued, QueuedMessage, Reply, Spoken
from .media import Media
from .transcribe import TranscribeFailed, Transcriber

__all__ = ["CORRECTION", "Composed", "compose", "framed", "hear"]

logger = log.get(__name__)

CORRECTION = "[correction of my earlier message]"  # an edit of a message eve already has


@dataclass(frozen=True, slots=True)
class Composed:
    """The turn for eve, and the recordings left out of it: no transcript (IVA_VOICE=command)."""

    message: str | list[dict[str, Any]]
    unheard: tuple[QueuedMessage, ...] = ()


async def hear(bot: Bot, items: Sequence[Queued], *, max_file_mb: int, transcriber: Transcriber | None,
               media: Media | None = None) -> dict[str, str | None]:
    """The transcripts of the turn's recordings (None: it has none), by file id — before the
    turn takes a file slot, so no transcriber runs while one is held; one kept from an earlier
    try of the same turn (an eve outage) is not made again."""
    heard: dict[str, str | None] = {}
    cap = max_file_mb * 1024 * 1024
    for item in items:
        if isinstance(item, QueuedMessage) and item.attachment is not None and item.attachment.transcribe:
            heard[item.attachment.file_id] = await _heard(bot, item.attachment, cap, transcriber, media)
    return heard


async def _heard(bot: Bot, attachment: Attachment, cap: int, transcriber: Transcriber | None,
                 media: Media | None) -> str | None:
    if media is not None and (kept := media.heard(attachment, cap)) is not None:
        return kept
    text = await _transcribe(bot, attachment, cap, transcriber)
    if media is not None and text is not None:
        media.keep_heard(attachment, cap, text)
    return text


async def compose(bot: Bot, items: Sequence[Queued], *, max_file_mb: int,
                  transcriber: Transcriber | None = None, media: Media | None = None,
                  heard: Mapping[str, str | None] | None = None) -> Composed:
    """Several waiting messages go as one turn; in groups each says who wrote it; photos and
    documents go as file parts (T8), each at most ``max_file_mb`` — enforced on the bytes as they
    arrive, since Telegram does not always say a file's size (the turn's claim bounds their sum).
    A recording queued for transcription goes as its transcript, marked; one that has none (the
    download or the command failed) is left out, with its caption — its sender is told instead."""
    texts: list[str] = []
    files: list[dict[str, Any]] = []
    unheard: list[QueuedMessage] = []
    albums: set[str] = set()
    for item in items:
        if isinstance(item, PushedTurn):
            texts.append(item.text)  # W1: who pushed it is in the clientContext, not in the words
            continue
        if not isinstance(item, QueuedMessage):
            continue
        text = f"{CORRECTION} {item.text}".rstrip() if item.correction else item.text
        # An album's parts go together: after its first part, one without a caption adds its
        # file and no line of its own.
        quiet = item.album is not None and item.album in albums and not text.strip()
        if item.album is not None:
            albums.add(item.album)
        if item.attachment is not None and item.attachment.transcribe:
            cap = max_file_mb * 1024 * 1024
            words = heard[item.attachment.file_id] if heard is not None and item.attachment.file_id in heard \
                else await _heard(bot, item.attachment, cap, transcriber, media)
            if words is None:
                unheard.append(item)
                continue
            text = f"{text}\n[{(item.attachment.spoken or Spoken.AUDIO).label}, transcribed] {words}".strip()
        elif item.attachment is not None:
            cap = max_file_mb * 1024 * 1024
            part: dict[str, Any] | str | None = media.part(item.attachment, cap) if media is not None else None
            if part is None:
                part = await _download(bot, item.attachment, cap)
                if media is not None and isinstance(part, dict):
                    media.keep_part(item.attachment, cap, part)
            if isinstance(part, dict):
                files.append(part)
            else:
                text = f"{text}\n[{item.attachment.name}: {part}]".strip()
        if quiet and not text.strip():
            continue
        if not item.private:
            text = f"{item.user_name or 'someone'}: {text}".rstrip()
        if item.reply is not None:
            text = f"{framed(item.reply)}\n{text}"
        if text:
            texts.append(text)
    joined = "\n\n".join(texts)
    if not files:
        return Composed(joined, tuple(unheard))
    return Composed([*([{"type": "text", "text": joined}] if joined else []), *files], tuple(unheard))


def framed(reply: Reply) -> str:
    """The replied-to message as quoted lines (the module's docstring shows the shape)."""
    # Another author's name is in quotes: nobody can name themselves so as to read as "you"
    # (the assistant's own words) or as the framing itself.
    who = "you" if reply.assistant else json.dumps(reply.author, ensure_ascii=False) if reply.author else "a message"
    where = f", in {reply.where}" if reply.where else ""
    head = f"({'quoting' if reply.partial else 'replying to'} {who}{where})"
    lines = reply.text.splitlines() or [""]
    return "\n".join(f"> {head} {lines[0]}".rstrip() if i == 0 else f"> {line}".rstrip()
                     for i, line in enumerate(lines))


class TooBig(BridgeError):
    pass


class _Capped(io.BytesIO):
    """A download buffer that refuses to grow past ``cap`` bytes (the download stops there)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.cap:
            raise TooBig
        return super().write(data)


async def _download(bot: Bot, attachment: Attachment, cap: int) -> dict[str, Any] | str:
    """The file as a part for eve, or why it is not attached (a note in the turn's text)."""
    data = await _fetch(bot, attachment, cap)
    return data if isinstance(data, str) else eve.file_part(data, attachment.mime, attachment.name)


async def _transcribe(bot: Bot, attachment: Attachment, cap: int, transcriber: Transcriber | None) -> str | None:
    """The recording's transcript, or None (logged) when it has none."""
    if transcriber is None:
        # Queued under IVA_VOICE=command, composed after a restart under another setting.
        logger.warning("voice_not_transcribed", reason="IVA_VOICE is no longer 'command'", name=attachment.name)
        return None
    async with transcriber.slot():  # F13: a slot of the pool, before the recording is in memory
        data = await _fetch(bot, attachment, cap)
        if isinstance(data, str):
            METRICS.transcriptions.labels(outcome="unfetched").inc()
            return None
        try:
            return await transcriber.transcribe(data, attachment.name)
        except TranscribeFailed as exc:
            logger.warning("voice_not_transcribed", reason=str(exc), outcome=exc.outcome, name=attachment.name)
            return None


async def _fetch(bot: Bot, attachment: Attachment, cap: int) -> bytes | str:
    """The file's bytes, or why there are none (logged)."""
    limit = f"larger than the {cap // (1024 * 1024)} MB limit, not attached"
    try:
        file = await bot.get_file(attachment.file_id)
        if file.file_size is not None and file.file_size > cap:
            return limit
        path = file.file_path or ""
        if path.startswith("/"):
            # A local Bot API server (--local) answers with the file's absolute path on its disk
            # and serves no download URL for it: read it there.
            local = Path(path)
            if (await asyncio.to_thread(local.stat)).st_size > cap:
                return limit
            return await asyncio.to_thread(local.read_bytes)
        buffer = await bot.download_file(path, destination=_Capped(cap), timeout=60)
        if buffer is None:
            return "the file could not be fetched from Telegram"
        return buffer.getvalue() if isinstance(buffer, io.BytesIO) else buffer.read()
    except TooBig:
        logger.warning("telegram_download_over_limit", name=attachment.name, limit_bytes=cap)
        return limit
    except Exception as exc:  # a file we cannot fetch becomes a note in the text, not a lost turn
        logger.warning("telegram_download_failed", error=str(exc), name=attachment.name)
        return "the file could not be fetched from Telegram"
