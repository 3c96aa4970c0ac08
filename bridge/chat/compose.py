"""Queued messages → what eve receives: one turn of text (and file parts) from several messages."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiogram import Bot

import eve_client as eve

from .. import log
from ..payloads import Attachment, Queued, QueuedMessage

__all__ = ["compose"]

logger = log.get("bridge.chat.compose")


async def compose(bot: Bot, items: Sequence[Queued]) -> str | list[dict[str, Any]]:
    """Several waiting messages go as one turn; in groups each says who wrote it; photos and
    documents go as file parts (T8)."""
    texts: list[str] = []
    files: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, QueuedMessage):
            continue
        text = item.text
        if item.attachment is not None:
            part = await _download(bot, item.attachment)
            if part is not None:
                files.append(part)
            else:
                text = f"{text}\n[{item.attachment.name}: the file could not be fetched from Telegram]".strip()
        if not item.private:
            text = f"{item.user_name or 'someone'}: {text}"
        if text:
            texts.append(text)
    joined = "\n\n".join(texts)
    if not files:
        return joined
    return [*([{"type": "text", "text": joined}] if joined else []), *files]


async def _download(bot: Bot, attachment: Attachment) -> dict[str, Any] | None:
    try:
        file = await bot.get_file(attachment.file_id)
        path = file.file_path or ""
        if path.startswith("/"):
            # A local Bot API server (--local) answers with the file's absolute path on its disk
            # and serves no download URL for it: read it there.
            data = await asyncio.to_thread(Path(path).read_bytes)
        else:
            buffer = await bot.download_file(path, timeout=60)
            if buffer is None:
                return None
            data = buffer.read()
    except Exception as exc:  # a file we cannot fetch becomes a note in the text, not a lost turn
        logger.warning("telegram_download_failed", error=str(exc), name=attachment.name)
        return None
    return eve.file_part(data, attachment.mime, attachment.name)
