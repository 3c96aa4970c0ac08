"""What a Telegram message carries besides its words, as short text for eve (I1, I4).

Two uses, one vocabulary:

* :func:`describe` — a location, venue, contact, poll, dice or sticker the person sends goes to
  eve as a line in square brackets (``[location: 55.751244, 37.618423]``) instead of the refusal.
* :func:`quoted` — the message a person replies to (or the part of it they quote), capped, with
  its author and its attachments named (``[photo]``, ``[document: name.pdf]``), never re-sent.
  It is stored with the queued message (:class:`~bridge.storage.payloads.Reply`); compose frames it.

A contact's phone number is named only when the contact is the sender's own; in a quote, never.
"""

from __future__ import annotations

from aiogram.types import (
    Chat,
    Contact,
    Dice,
    ExternalReplyInfo,
    Location,
    Message,
    MessageOriginChannel,
    MessageOriginChat,
    MessageOriginHiddenUser,
    MessageOriginUser,
    Poll,
    Sticker,
    User,
    Venue,
)

from ..storage.payloads import Reply

__all__ = ["QUOTE_LIMIT", "describe", "quoted"]

QUOTE_LIMIT = 1000  # characters of a replied-to message's text, then "…"
FOREVER = 0x7FFFFFFF  # a live location's live_period when it is shared until stopped


def describe(message: Message) -> str | None:
    """A located, shared or playful message as text; None for anything else (text, files, voice)."""
    sender = message.from_user.id if message.from_user is not None else None
    return _shared(message, phone_of=sender)


def quoted(message: Message, me: User) -> Reply | None:
    """The context of a reply: the replied-to message (or the quote, which wins), or None."""
    private = message.chat.type == "private"
    replied = message.reply_to_message
    if replied is not None and message.is_topic_message and replied.message_id == message.message_thread_id:
        replied = None  # in a forum topic every message "replies" to the topic's first message
    quote = message.quote.text if message.quote is not None else None
    if replied is not None:
        mine = replied.from_user is not None and replied.from_user.id == me.id
        author = None if mine else _author_of(replied, private)
        return _reply(quote if quote is not None else replied.text or replied.caption, _label(replied),
                      author=author, assistant=mine, partial=quote is not None, where=None)
    external = message.external_reply
    if external is not None:
        mine, author = _origin(external, me, private)
        where = None
        if external.chat is not None and external.chat.id == message.chat.id:
            where = "another topic"
        elif external.chat is not None and _chat_name(external.chat) not in (None, author):
            where = f'"{_chat_name(external.chat)}"'
        return _reply(quote, _label(external), author=author, assistant=mine, partial=quote is not None, where=where)
    return None


def _reply(text: str | None, label: str | None, *, author: str | None, assistant: bool, partial: bool,
           where: str | None) -> Reply:
    text = text or ""
    if len(text) > QUOTE_LIMIT:
        text = text[:QUOTE_LIMIT] + "…"
    text = " ".join(p for p in (label, text) if p)
    return Reply(text=text, author=author, assistant=assistant, partial=partial, where=where)


def _author_of(replied: Message, private: bool) -> str | None:
    if replied.sender_chat is not None:  # a channel post, or a group's anonymous admin
        return _chat_name(replied.sender_chat)
    if replied.from_user is not None:
        return replied.from_user.first_name if private else replied.from_user.full_name
    return None


def _origin(external: ExternalReplyInfo, me: User, private: bool) -> tuple[bool, str | None]:
    """Whether the replied-to message is the assistant's own, and who wrote it otherwise."""
    origin = external.origin
    if isinstance(origin, MessageOriginUser):
        if origin.sender_user.id == me.id:
            return True, None
        return False, origin.sender_user.first_name if private else origin.sender_user.full_name
    if isinstance(origin, MessageOriginHiddenUser):
        return False, origin.sender_user_name
    if isinstance(origin, MessageOriginChat):
        return False, _chat_name(origin.sender_chat)
    if isinstance(origin, MessageOriginChannel):
        return False, _chat_name(origin.chat)
    return False, None


def _chat_name(chat: Chat) -> str | None:
    """A group's or channel's title (a private chat's names); None when Telegram gives none."""
    return chat.title or " ".join(p for p in (chat.first_name, chat.last_name) if p) or None


def _label(m: Message | ExternalReplyInfo) -> str | None:
    """What the replied-to message carries besides text, named (never re-sent)."""
    shared = _shared(m, phone_of=None)
    if shared is not None:
        return shared
    if m.photo:
        return "[photo]"
    if m.animation is not None:  # before the document: an animation carries both
        return "[animation]"
    if m.document is not None:
        return f"[document: {m.document.file_name}]" if m.document.file_name else "[document]"
    if m.audio is not None:
        name = " — ".join(p for p in (m.audio.performer, m.audio.title) if p) or m.audio.file_name
        return f"[audio: {name}]" if name else "[audio]"
    for value, label in ((m.voice, "[voice message]"), (m.video_note, "[video message]"), (m.video, "[video]"),
                         (m.live_photo, "[live photo]"), (m.paid_media, "[paid media]"), (m.story, "[story]"),
                         (m.giveaway, "[giveaway]"), (m.invoice, "[invoice]")):
        if value is not None:
            return label
    if m.game is not None:
        return f"[game: {m.game.title}]"
    if m.checklist is not None:
        return f"[checklist: {m.checklist.title}]"
    return None


def _shared(m: Message | ExternalReplyInfo, *, phone_of: int | None) -> str | None:
    """The kinds eve reads as text; a contact's phone only when it is ``phone_of``'s own."""
    if m.venue is not None:  # before the location: a venue carries both
        return _venue(m.venue)
    if m.location is not None:
        return _location(m.location)
    if m.contact is not None:
        return _contact(m.contact, phone_of)
    if m.poll is not None:
        return _poll(m.poll)
    if m.dice is not None:
        return _dice(m.dice)
    if m.sticker is not None:
        return _sticker(m.sticker)
    return None


def _coordinates(location: Location) -> str:
    return f"{location.latitude:.6f}, {location.longitude:.6f}"


def _location(location: Location) -> str:
    notes = []
    if location.horizontal_accuracy:
        notes.append(f"±{round(location.horizontal_accuracy)} m")
    if location.live_period:
        if location.live_period >= FOREVER:
            notes.append("live, until stopped")
        else:
            notes.append(f"live for {_duration(location.live_period)}")
    tail = f" ({', '.join(notes)})" if notes else ""
    return f"[location: {_coordinates(location)}{tail}]"


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _venue(venue: Venue) -> str:
    return f"[venue: {venue.title}, {venue.address} ({_coordinates(venue.location)})]"


def _contact(contact: Contact, phone_of: int | None) -> str:
    name = " ".join(p for p in (contact.first_name, contact.last_name) if p)
    if phone_of is not None and contact.user_id == phone_of:
        return f"[contact: {name}, {contact.phone_number} (their own number)]"
    return f"[contact: {name}]"


def _poll(poll: Poll) -> str:
    kind = "quiz" if poll.type == "quiz" else "poll"
    if poll.allows_multiple_answers:
        kind += ", several answers allowed"
    options = "\n".join(f"{i}. {option.text}" for i, option in enumerate(poll.options, 1))
    return f"[{kind}: {poll.question}\n{options}]"


def _dice(dice: Dice) -> str:
    return f"[dice {dice.emoji}: {dice.value}]"


def _sticker(sticker: Sticker) -> str:
    parts = ["sticker", *([sticker.emoji] if sticker.emoji else [])]
    tail = f' from the set "{sticker.set_name}"' if sticker.set_name else ""
    return f"[{' '.join(parts)}{tail}]"
