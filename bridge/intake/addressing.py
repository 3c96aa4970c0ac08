"""Who may talk, and where a conversation lives (T2).

An address is a private chat, a group chat, or one forum topic of a group. The General topic
of a forum never carries ``is_topic_message``, so it is the group's own address, and we never
send ``message_thread_id=1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiogram.types import Message, MessageEntity, User

from ..storage.address import Address

__all__ = ["Address", "Inbound", "classify"]


@dataclass(frozen=True, slots=True)
class Inbound:
    """What a Telegram message means to us."""

    address: Address
    text: str | None
    command: str | None
    command_args: str
    addressed: bool  # in a group: a command for us, a mention, or a reply to the bot
    private: bool


def _extract(entity: MessageEntity, text: str) -> str:
    """An entity's text, or "" when its offsets do not fit the text (never raise on input)."""
    try:
        return entity.extract_from(text)
    except Exception:
        return ""


def _mentions_bot(message: Message, me: User) -> bool:
    text = message.text or message.caption or ""
    for entity in message.entities or message.caption_entities or []:
        if entity.type == "mention" and me.username:
            mention = _extract(entity, text)
            if mention.lower() == f"@{me.username.lower()}":
                return True
        if entity.type == "text_mention" and entity.user and entity.user.id == me.id:
            return True
    return False


def _strip_mention(text: str, me: User) -> str:
    if me.username:
        handle = f"@{me.username}"
        lowered = text.lower()
        at = lowered.find(handle.lower())
        while at >= 0:
            text = (text[:at] + text[at + len(handle):]).strip()
            lowered = text.lower()
            at = lowered.find(handle.lower())
    return text


def classify(message: Message, me: User) -> Inbound:
    private = message.chat.type == "private"
    text = message.text if message.text is not None else message.caption
    command: str | None = None
    args = ""
    addressed = private
    if message.text and message.text.startswith("/") and message.entities:
        first = message.entities[0]
        if first.type == "bot_command" and first.offset == 0:
            raw = _extract(first, message.text)[1:]
            name, _, target = raw.partition("@")
            if not target or (me.username and target.lower() == me.username.lower()):
                command = name.lower()
                args = message.text[first.length:].strip()
                addressed = True
    if not addressed:
        replied = message.reply_to_message
        if replied is not None and message.is_topic_message and replied.message_id == message.message_thread_id:
            replied = None  # in a forum topic every message "replies" to the topic's first message
        if replied is not None and replied.from_user is not None and replied.from_user.id == me.id:
            addressed = True
        elif _mentions_bot(message, me):
            addressed = True
    if text is not None and not private:
        text = _strip_mention(text, me)
    return Inbound(
        address=Address.of(message),
        text=text,
        command=command,
        command_args=args,
        addressed=addressed,
        private=private,
    )
