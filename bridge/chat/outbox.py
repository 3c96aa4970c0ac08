"""The chat's durable notices and replies on their way out: rows in the outbox, sent by the
:class:`~bridge.telegram.sender.Sender` (T6, T7). A notice written with a transition commits with it, so
it is sent once even across restarts.

Commit, then send, once: whatever writes a row sends it after its commit through this outbox
(:mod:`bridge.storage.outbox`, the database's after-commit hook); no caller sends by hand. A
chat's worker waits for the send (a reply goes before the next draft frame); a writer in
:func:`~bridge.storage.outbox.detached` (ingest, a push, a reminder) hands it to a task."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from aiogram.exceptions import TelegramBadRequest

from .. import log
from ..storage.store import Chat, Store
from ..telegram.sender import ChatGone, Sender, TopicGone
from ..telegram.texts import t
from .transitions import Transitions

__all__ = ["Outbox"]

logger = log.get(__name__)


class Outbox:
    def __init__(self, store: Store, sender: Sender, transitions: Transitions,
                 spawn: Callable[[Coroutine[Any, Any, Any]], object]) -> None:
        self.store = store
        self.sender = sender
        self.transitions = transitions
        self.spawn = spawn
        self._flushing: dict[str, asyncio.Lock] = {}  # one sender per address at a time
        store.on_written = self._written  # the one place a written row is sent from

    async def _written(self, address: str, wait: bool) -> None:
        """After the commit that wrote a row for ``address``: sent now, or in a task of its own."""
        if wait:
            await self.flush(address)
        else:
            self.spawn(self.flush(address))

    async def say(self, chat: Chat, key: str, text: str, *, reply_to: int | None = None) -> None:
        """A plain-text notice to the chat, keyed (in the caller's transaction, if any)."""
        await self.store.put_outgoing(chat.address, key, chat.chat_id, chat.thread_id, text, format="plain",
                                      reply_to=reply_to)

    async def say_to(self, address: str, chat_id: int, thread_id: int | None, key: str, text: str, *,
                     reply_to: int | None = None, markdown: bool = True, receiver: int | None = None) -> None:
        """A keyed answer to an address that may have no chat record yet (a command, a refusal):
        written in the caller's transaction with its dedupe mark, so an update marked handled has
        its answer on disk (sent once, even across a crash). With ``receiver`` in a group, it is
        shown to that person alone where Telegram allows it (S7), else to the group."""
        await self.store.put_outgoing(address, key, chat_id, thread_id, text,
                                      format="markdown" if markdown else "plain", reply_to=reply_to,
                                      receiver=receiver)

    async def resend_left(self, address: str) -> None:
        """Recovery: what an earlier process or a failed send left pending for the address goes
        now (the chat's worker calls it at the start of each look; what a commit writes from then
        on, the commit sends)."""
        await self.flush(address)

    async def flush(self, address: str) -> None:
        """Send what is pending for the address, in order; a chat that is gone is marked blocked.
        Called after a commit that wrote a row (:meth:`_written`), and by the chat's worker for
        what an earlier process or a failed send left pending."""
        lock = self._flushing.setdefault(address, asyncio.Lock())
        async with lock:
            for _ in range(3):  # a row written meanwhile may still name the topic: bounded
                try:
                    await self._flush(address)
                    return
                except TopicGone as exc:
                    # P3: the topic is gone, the chat is not. Remembered; its replies go to
                    # the chat's root from now on (one line says why, once), never into it again.
                    logger.warning("topic_gone", reason=str(exc))
                    chat = await self.store.chat(address)
                    if await self.store.topic_gone(address, str(exc)) and chat is not None:
                        await self.sender.say(chat.chat_id, None, t("topic_gone", chat.lang))
            await self.transitions.mark_blocked(address, "the topic is gone")

    async def _flush(self, address: str) -> None:
        pending = await self.store.pending_outgoing(address)
        if not pending:
            return
        blocked = await self.store.is_blocked(address)
        for out in pending:
            if blocked:
                await self.store.finish_outgoing(out.id, "failed")
                continue
            try:
                await self.sender.deliver(out)
            except TopicGone:
                raise
            except ChatGone as exc:
                logger.warning("chat_gone", reason=str(exc))
                await self.transitions.mark_blocked(address, str(exc))
                return
            except TelegramBadRequest as exc:
                logger.error("telegram_rejected_reply", error=exc.message, outbox_id=out.id)
                await self.store.finish_outgoing(out.id, "failed")
