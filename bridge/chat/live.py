"""The live draft of a private chat (L*): the text being written, shown as it arrives.

Bot API 10.3's ``sendMessageDraft`` shows an ephemeral preview in a private chat; a frame with the
same ``draft_id`` replaces the last one, and the bot's next real message ends it. The final text
still goes through the durable outbox (T7): a draft is never the answer, so a crash mid-stream
costs at most a preview.

Frames are never queued: :class:`Draft` keeps only the latest state and sends it when the throttle
allows (one frame per ``interval`` per chat; a 429 pushes the next frame out by ``retry_after``
and slows the pace). :meth:`Draft.settle` waits for a frame in flight before the final message is
sent, so no frame can land after it (a draft reappearing over the answer). Drafts are plain text
(a half-written Markdown can never become an entity error); a long block shows its tail.

The pacer in front of the bot (bridge/telegram/pacing.py) gives drafts a budget of their own per chat
(``IVA_DRAFT_RATE``) and skips a frame when the global budget is short: a skipped frame is never
queued, the latest state goes at the next chance. A frame has ``IVA_DRAFT_TIMEOUT`` (5 s) to be
answered, not aiogram's 60 s: a hung frame can hold neither the final answer (``settle``) nor a
shutdown (``close``) past it.
"""

from __future__ import annotations

import asyncio
import math

from aiogram import Bot
from aiogram.exceptions import TelegramBadRequest, TelegramForbiddenError, TelegramRetryAfter

from .. import log
from ..config import DEFAULT_DRAFT_TIMEOUT
from ..metrics import METRICS
from ..telegram.pacing import Paced, pacer_of

__all__ = ["FRAME_INTERVAL", "Draft", "progress_line"]

logger = log.get(__name__)

FRAME_INTERVAL = 0.3  # seconds between two frames of one chat, at least
MAX_INTERVAL = 3.0  # the slowest pace a run of 429s can push it to
DRAFT_CHARS = 4096

# What a tool is doing, in words (the tool's own name where none is known). Notebook writes
# show too: every write of the notebook is visible (seed 000).
_TOOLS: dict[str, tuple[str, str]] = {
    "chat_note_save": ("notebook: saving a note", "блокнот: сохраняю заметку"),
    "chat_note_read": ("notebook: reading a note", "блокнот: читаю заметку"),
    "chat_note_delete": ("notebook: deleting a note", "блокнот: удаляю заметку"),
    "chat_note_pin": ("notebook: pinning a note", "блокнот: закрепляю заметку"),
    "chat_note_unpin": ("notebook: unpinning a note", "блокнот: открепляю заметку"),
    "search": ("looking for a tool", "ищу инструмент"),
}


def progress_line(tool: str, lang: str) -> str:
    """One status line for a tool at work, e.g. "🔧 notebook: saving a note"."""
    name = tool.split("__", 1)[-1]
    en, ru = _TOOLS.get(name, (name, name))
    return f"🔧 {ru if lang == 'ru' else en}…"


def fit(text: str) -> str:
    """What a draft can show: the whole text, or its tail when it is longer than a message."""
    if len(text.encode("utf-16-le")) // 2 <= DRAFT_CHARS:
        return text
    # Telegram counts UTF-16 units (an emoji is two): the tail is cut by those, not characters.
    room, start = DRAFT_CHARS - 200, len(text)
    while start > 0 and room - (2 if ord(text[start - 1]) > 0xFFFF else 1) >= 0:
        start -= 1
        room -= 2 if ord(text[start]) > 0xFFFF else 1
    tail = text[start:]
    return "…" + tail[tail.find(" ") + 1:] if " " in tail[:200] else "…" + tail


class Draft:
    """The draft of one chat during one busy period."""

    def __init__(self, bot: Bot, chat_id: int, thread_id: int | None, *, interval: float = FRAME_INTERVAL) -> None:
        self.bot = bot
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.interval = interval
        self.frames = 0
        self._wanted: tuple[int, str] | None = None  # (draft_id, text): the latest state
        self._shown: tuple[int, str] | None = None
        self._next_at = 0.0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # no frame in flight
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._off = False  # the chat takes no drafts (an old client, a refused method): typing only
        pacer = pacer_of(bot)
        self.timeout = math.ceil(pacer.budget.draft_timeout if pacer is not None else DEFAULT_DRAFT_TIMEOUT)
        self.skipped = 0

    def show(self, draft_id: int, text: str) -> None:
        """The draft should now read ``text``; sent when the throttle allows (never queued)."""
        if self._off or not text.strip():
            return
        self._wanted = (draft_id, text)
        if self._task is None:
            self._task = asyncio.create_task(self._frames(), name=f"draft:{self.chat_id}")
        self._wake.set()

    async def settle(self) -> None:
        """The block is done: nothing more is shown, and a frame in flight has landed (the final
        message that follows can never be overtaken by a frame)."""
        self._wanted = None
        self._wake.clear()
        await self._idle.wait()

    async def close(self) -> None:
        await self.settle()
        if self._task is not None:
            self._task.cancel()
            # Wait for it without taking its cancellation for ours: a consumer cancelled here
            # (shutdown) must still end, not swallow the CancelledError and go on.
            await asyncio.wait({self._task})
            self._task = None

    async def _frames(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            delay = self._next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            wanted = self._wanted
            if wanted is None or wanted == self._shown:
                continue
            draft_id, text = wanted
            self._idle.clear()
            try:
                await self.bot.send_message_draft(chat_id=self.chat_id, draft_id=draft_id, text=fit(text),
                                                  message_thread_id=self.thread_id, parse_mode=None,
                                                  can_stop=True, keep_on_stop=True,
                                                  request_timeout=self.timeout)
                self._shown = wanted
                self.frames += 1
                METRICS.draft_frames.inc()
                self._next_at = loop.time() + self.interval
            except Paced as exc:  # not now (the pacer): the latest state at the next chance
                self.skipped += 1
                self._next_at = loop.time() + exc.retry_in
                self._wake.set()
            except TelegramRetryAfter as exc:
                # Adaptive: wait what Telegram asks, and go slower from then on.
                self.interval = min(MAX_INTERVAL, self.interval * 2)
                self._next_at = loop.time() + exc.retry_after
                METRICS.telegram_retries.labels(reason="draft_429").inc()
                self._wake.set()
            except (TelegramBadRequest, TelegramForbiddenError) as exc:
                logger.info("drafts_off_for_chat", error=exc.message[:200])
                self._off = True
                return
            except Exception as exc:  # a network fault costs a frame, never the answer
                logger.warning("draft_frame_failed", error=str(exc)[:200])
                self._next_at = loop.time() + max(self.interval, 1.0)
                self._wake.set()
            finally:
                self._idle.set()
