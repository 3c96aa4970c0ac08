"""The one place that talks to Telegram for replies: the outbox → sendMessage (T6, T7).

Each outbox row is rendered, split, and sent chunk by chunk; the progress of a row is recorded
after every chunk, so a restart resends at most the one chunk whose answer was lost. 429 waits
``retry_after``; 5xx and network errors retry with backoff; an entity Telegram rejects falls
back to plain text for that chunk; a blocked bot or a vanished chat raises :class:`ChatGone`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from aiogram import Bot
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramBadRequest,
    TelegramForbiddenError,
    TelegramMigrateToChat,
    TelegramNetworkError,
    TelegramNotFound,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.types import (
    EphemeralMessageParameters,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    LinkPreviewOptions,
    ReactionTypeEmoji,
    ReplyParameters,
)

from .. import backoff, log
from ..errors import BridgeError
from ..metrics import METRICS
from ..storage.store import Outgoing, Store
from .pacing import Paced, pacer_of
from .render import Chunk, render

__all__ = ["ChatGone", "EphemeralRefused", "Sender", "TopicGone", "Typing", "topic_gone", "undecodable"]

logger = log.get(__name__)

TYPING_EVERY = 5.0  # Telegram shows a chat action 5 s; the pacer never sends it again within them


def undecodable(exc: ClientDecodeError) -> str:
    """Which fields of a Bot API answer aiogram could not read, in one line."""
    errors = getattr(exc.original, "errors", None)
    if callable(errors):
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors()[:3]]
        return "; ".join(parts) or exc.message
    return f"{exc.message} ({exc.original})"


class ChatGone(BridgeError):
    """The bot was blocked, kicked, or the chat (or topic) no longer exists."""


class EphemeralRefused(BridgeError):
    """Telegram would not show a message to one person alone (S7) and the caller wanted no
    plain fallback."""


class TopicGone(ChatGone):
    """A send into a topic found it deleted or not there (a private chat's topic the person
    deleted, a forum topic gone): the chat itself is still there (P1-P4, S7)."""


_TOPIC_MARKERS = ("message thread not found", "topic_deleted", "topic not found", "topic_id_invalid")


def topic_gone(description: str) -> bool:
    """Whether Telegram's answer says the topic, not the chat, is gone."""
    text = description.lower()
    return any(marker in text for marker in _TOPIC_MARKERS)


_GONE_MARKERS = ("chat not found", "bot was kicked", "user is deactivated", "message thread not found",
                 "topic_deleted", "have no rights to send", "not enough rights to send")


def _keyboard(rows: Sequence[Sequence[Mapping[str, str]]] | None) -> InlineKeyboardMarkup | None:
    """An outbox row's markup (JSON: ``[[{"text", "callback_data" | "url"}]]``) as Telegram's
    keyboard (a link button opens its ``url``: a sign-in, V6)."""
    if not rows:
        return None
    return InlineKeyboardMarkup(inline_keyboard=[
        [InlineKeyboardButton(text=b["text"], url=b["url"]) if "url" in b else
         InlineKeyboardButton(text=b["text"], callback_data=b["callback_data"]) for b in row]
        for row in rows
    ])


def _delivered_anyway(exc: ClientDecodeError, chat_id: int) -> int | None:
    """F3: ``ok`` means delivered, even when the rest of the answer cannot be read (a proxy, a
    newer Bot API, an emulator): its message id (0 when unreadable), to record it and never send
    it again; None when Telegram did not say ok."""
    data = exc.data
    if not (isinstance(data, dict) and data.get("ok") is True):
        return None
    result = data.get("result")
    message_id = result.get("message_id") if isinstance(result, dict) else None
    logger.warning("telegram_answer_undecodable_but_ok", chat_id=chat_id, error=undecodable(exc))
    return message_id if isinstance(message_id, int) else 0


class Sender:
    def __init__(self, bot: Bot, store: Store, *, written_before: int) -> None:
        """``written_before``: the outbox's last id when this process started (the store's
        :meth:`~bridge.storage.outbox.OutboxStore.last_outgoing_id`): a row up to it was pending when the
        last process ended. No clock decides it — a wall clock stepped back made every new reply
        look older than the start, each labelled "may repeat" and written once more."""
        self.bot = bot
        self.store = store
        self._unrecorded: dict[int, tuple[int, list[int]]] = {}  # outbox id → parts Telegram has
        self.written_before = written_before
        self._labelled: set[int] = set()

    async def deliver(self, out: Outgoing) -> None:
        """Send one outbox row to the end, recording progress; raises ChatGone.

        F3: what Telegram took is remembered in process until its record commits, so a record
        that fails (a lock, a full disk) is retried without sending the part again; only a
        crash in between can send it twice (the documented send → record window)."""
        chunks = render(out.text, markdown=out.format == "markdown")
        sent, ids = max((out.chunks_sent, list(out.message_ids)), self._unrecorded.get(out.id, (0, [])),
                        key=lambda progress: progress[0])
        ids = list(ids)
        chat_id = out.chat_id
        if out.id <= self.written_before and out.id not in self._labelled:
            # Pending when the last process ended: if it died between Telegram's answer and the
            # record, this part goes twice — the one duplicate window, labelled, never silent.
            # Only after a write succeeded: on a disk still full it is not sent at all.
            await self.store.attempt_outgoing(out.id)
            self._labelled.add(out.id)
            logger.warning("reply_sent_after_restart", outbox=out.id, key=out.key, parts_recorded=sent,
                           may_repeat=True)
        if out.fallback is not None and out.receiver is not None:
            await self._deliver_or_privately(out, out.receiver, out.fallback)
            return
        for number, chunk in enumerate(chunks):
            if number < sent:
                continue
            reply_to = out.reply_to if number == 0 else None
            markup = _keyboard(out.markup) if number == len(chunks) - 1 else None
            message_id, chat_id = await self._send_chunk(chat_id, out.thread_id, chunk, reply_to, markup,
                                                         receiver=out.receiver)
            ids.append(message_id)
            self._unrecorded[out.id] = (number + 1, list(ids))
            METRICS.telegram_sent.inc()
            if number + 1 < len(chunks):
                await self.store.record_chunk(out.id, number + 1, ids)
        # One commit records the last part and the row's end: the duplicate window is only
        # between Telegram's answer and this commit.
        await self.store.finish_outgoing(out.id, chunks_sent=len(chunks), message_ids=ids)
        self._unrecorded.pop(out.id, None)

    async def _deliver_or_privately(self, out: Outgoing, receiver: int, fallback: dict[str, str]) -> None:
        """S7, N9: shown to ``receiver`` alone in the group; where Telegram will not (refused, or
        the try itself forbidden), in their private chat, and one line in the group saying so —
        or that they must open a private chat first. Never the text itself to the group. The row
        is done once all of it went (a crash before: sent again, the labelled window)."""
        markdown = out.format == "markdown"
        markup = _keyboard(out.markup)  # the asker's buttons, wherever they are shown
        if not await self.say(out.chat_id, out.thread_id, out.text, reply_to=out.reply_to, markdown=markdown,
                              receiver=receiver, fallback=False, markup=markup):
            sent = await self.say(receiver, None, fallback["private"], markdown=markdown, markup=markup)
            await self.say(out.chat_id, out.thread_id, fallback["sent" if sent else "unsent"], reply_to=out.reply_to)
        METRICS.telegram_sent.inc()
        await self.store.finish_outgoing(out.id, chunks_sent=1, message_ids=[])
        self._unrecorded.pop(out.id, None)

    async def _send_chunk(
        self, chat_id: int, thread_id: int | None, chunk: Chunk, reply_to: int | None,
        markup: InlineKeyboardMarkup | None = None, *, receiver: int | None = None,
        callback_query_id: str | None = None, fallback: bool = True,
    ) -> tuple[int, int]:
        """One part; with ``receiver`` in a group, ephemeral (S7: that person alone sees it) —
        and where Telegram refuses that, plain (``fallback``) or :class:`EphemeralRefused`."""
        attempt = 0
        ephemeral = None
        if receiver is not None and chat_id < 0:
            ephemeral = EphemeralMessageParameters(receiver_user_id=receiver, callback_query_id=callback_query_id)
        while True:
            try:
                message = await self.bot.send_message(
                    ephemeral_message_parameters=ephemeral,
                    chat_id=chat_id,
                    text=chunk.text,
                    entities=list(chunk.entities) or None,
                    message_thread_id=thread_id,
                    link_preview_options=LinkPreviewOptions(is_disabled=True),
                    reply_parameters=(
                        ReplyParameters(message_id=reply_to, allow_sending_without_reply=True)
                        if reply_to else None
                    ),
                    reply_markup=markup,
                )
                return message.message_id, chat_id
            except ClientDecodeError as exc:
                if (delivered := _delivered_anyway(exc, chat_id)) is not None:
                    return delivered, chat_id
                METRICS.telegram_retries.labels(reason="undecodable").inc()
                delay = backoff.TELEGRAM.delay(attempt)
                attempt += 1
                logger.warning("telegram_answer_undecodable", chat_id=chat_id, error=exc.message, wait=round(delay, 2))
                await asyncio.sleep(delay)
            except TelegramRetryAfter as exc:
                # Q4: never given up, however long. The pacer in front of the bot holds this chat
                # for retry_after (the other chats go on); the part goes again once it is free.
                METRICS.telegram_retries.labels(reason="429").inc()
                logger.warning("telegram_retry_after", chat_id=chat_id, retry_after=exc.retry_after)
                if pacer_of(self.bot) is None:
                    await asyncio.sleep(exc.retry_after)
            except TelegramMigrateToChat as exc:
                logger.info("telegram_chat_migrated", chat_id=chat_id, to=exc.migrate_to_chat_id)
                chat_id = exc.migrate_to_chat_id
            except TelegramForbiddenError as exc:
                raise ChatGone(exc.message) from exc
            except (TelegramBadRequest, TelegramNotFound) as exc:
                text = exc.message.lower()
                if thread_id is not None and topic_gone(text):
                    raise TopicGone(exc.message) from exc
                if any(marker in text for marker in _GONE_MARKERS):
                    raise ChatGone(exc.message) from exc
                if ephemeral is not None:
                    # S7: Telegram would not show it to the asker alone (an old client, a chat
                    # that does not allow it): the group sees it, or the caller chooses.
                    logger.info("telegram_ephemeral_refused", chat_id=chat_id, error=exc.message[:200],
                                fallback=fallback)
                    if not fallback:
                        raise EphemeralRefused(exc.message) from exc
                    ephemeral = None
                    continue
                if chunk.entities and ("entit" in text or "parse" in text):
                    logger.warning("telegram_entities_rejected", chat_id=chat_id, error=exc.message)
                    chunk = chunk.plain()
                    continue
                if reply_to and "repl" in text:
                    reply_to = None
                    continue
                raise
            except (TelegramServerError, TelegramNetworkError) as exc:
                METRICS.telegram_retries.labels(reason="transient").inc()
                delay = backoff.TELEGRAM.delay(attempt)
                attempt += 1
                logger.warning("telegram_send_retry", chat_id=chat_id, error=str(exc), wait=round(delay, 2))
                await asyncio.sleep(delay)

    async def react(self, chat_id: int, message_id: int, emoji: str) -> None:
        """A receipt on the person's message; best effort (groups may forbid reactions)."""
        try:
            await self.bot.set_message_reaction(
                chat_id=chat_id, message_id=message_id, reaction=[ReactionTypeEmoji(emoji=emoji)]
            )
        except Exception as exc:  # a receipt is never worth an error
            logger.info("telegram_reaction_failed", chat_id=chat_id, error=str(exc))

    async def say(self, chat_id: int, thread_id: int | None, text: str, *, reply_to: int | None = None,
                  markdown: bool = True, receiver: int | None = None, callback_query_id: str | None = None,
                  fallback: bool = True, markup: InlineKeyboardMarkup | None = None) -> bool:
        """An immediate, non-durable answer (help, status): one try with the same fallbacks;
        ``markup`` on its last part. False when Telegram would not deliver it (blocked, never
        started, gone), or would not show it to ``receiver`` alone and ``fallback`` is off."""
        try:
            chunks = render(text, markdown=markdown)
            for number, chunk in enumerate(chunks):
                keys = markup if number == len(chunks) - 1 else None
                try:
                    await self._send_chunk(chat_id, thread_id, chunk, reply_to, keys, receiver=receiver,
                                           callback_query_id=callback_query_id, fallback=fallback)
                except TopicGone as exc:  # the topic went: the chat's root has it, once
                    logger.info("telegram_say_topic_gone", chat_id=chat_id, thread_id=thread_id, error=str(exc))
                    thread_id = None
                    await self._send_chunk(chat_id, None, chunk, None, keys, receiver=receiver,
                                           callback_query_id=callback_query_id, fallback=fallback)
                reply_to = None
        except (ChatGone, TelegramBadRequest, EphemeralRefused) as exc:
            logger.info("telegram_say_failed", chat_id=chat_id, error=str(exc))
            return False
        return True


class Typing:
    """The typing indicator of one chat, refreshed while a turn runs (T6, LESSONS #12); the pacer
    sends it only when nothing else needs the budget, and never twice in its 5 s."""

    def __init__(self, bot: Bot, chat_id: int, thread_id: int | None, *, ttl: float) -> None:
        self.bot = bot
        self.chat_id = chat_id
        self.thread_id = thread_id
        self.ttl = ttl
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name=f"typing:{self.chat_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # never swallows a cancellation of the caller

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + self.ttl
        while loop.time() < until:
            try:
                await self.bot.send_chat_action(
                    chat_id=self.chat_id, action="typing", message_thread_id=self.thread_id
                )
                await asyncio.sleep(TYPING_EVERY)
            except Paced as exc:  # lowest of all: skipped while the budget is short or it still shows
                await asyncio.sleep(exc.retry_in)
            except TelegramRetryAfter as exc:
                await asyncio.sleep(exc.retry_after)
            except Exception as exc:
                logger.debug("telegram_typing_failed", chat_id=self.chat_id, error=str(exc))
                await asyncio.sleep(TYPING_EVERY)
