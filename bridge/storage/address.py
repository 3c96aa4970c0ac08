"""Where a conversation lives, as a value: a private chat, a group chat, or one forum topic
(``<chat>/<topic>``, the form the state stores). The General topic of a forum never carries
``is_topic_message``, so it is the group's own address, and we never send ``message_thread_id=1``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiogram.types import Message

__all__ = ["Address"]


@dataclass(frozen=True, slots=True)
class Address:
    chat_id: int
    thread_id: int | None = None

    def __str__(self) -> str:
        return f"{self.chat_id}" if self.thread_id is None else f"{self.chat_id}/{self.thread_id}"

    @classmethod
    def parse(cls, text: str) -> Address:
        chat, _, thread = text.partition("/")
        return cls(int(chat), int(thread) if thread else None)

    @classmethod
    def of(cls, message: Message) -> Address:
        thread = message.message_thread_id if message.is_topic_message else None
        return cls(message.chat.id, thread if thread and thread != 1 else None)
