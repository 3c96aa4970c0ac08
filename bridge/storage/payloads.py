"""What the on-disk queue carries, typed: a person's message and an answer to a prompt.

Ingest builds these and commits them as JSON; the chat's worker and consumer read them back with
:func:`decode`. The callback data of a prompt's buttons has one codec here too, so the writer
(the consumer showing a prompt) and the reader (ingest taking a press) cannot drift apart.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Attachment", "InputAnswer", "Kind", "Origin", "PeopleButton", "PromptButton", "PushedTurn", "Queued",
           "QueuedMessage", "Reply", "Spoken", "decode"]


class Kind(enum.StrEnum):
    """What a busy chat is doing."""

    TURN = "turn"
    COMPACT = "compact"


class Origin(enum.StrEnum):
    """Who started a compaction: the parking handler or a person's /compact."""

    AUTO = "auto"
    MANUAL = "manual"


class Spoken(enum.StrEnum):
    """The kinds of spoken input (IVA_VOICE), each with what a transcript of it is marked as."""

    VOICE = "voice"
    AUDIO = "audio"
    VIDEO_NOTE = "video_note"

    @classmethod
    def parse(cls, raw: object) -> Spoken:
        """A kind this version does not know (a newer row) reads as plain audio, never as a
        decode error that would wedge the chat's queue."""
        return next((kind for kind in cls if kind.value == raw), cls.AUDIO)

    @property
    def label(self) -> str:
        return {"voice": "voice message", "audio": "audio", "video_note": "video message"}[self.value]


@dataclass(frozen=True, slots=True)
class Attachment:
    """A photo, document, voice message, audio file or video note, by reference: the worker
    downloads it when it composes the turn. ``transcribe`` (IVA_VOICE=command when it arrived):
    the worker sends its transcript as text instead of the file."""

    file_id: str
    size: int | None
    mime: str
    name: str
    spoken: Spoken | None = None
    transcribe: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Attachment:
        size, spoken = data.get("size"), data.get("spoken")
        return cls(file_id=str(data["file_id"]), size=int(size) if size is not None else None,
                   mime=str(data.get("mime") or "application/octet-stream"), name=str(data.get("name") or "file"),
                   spoken=Spoken.parse(spoken) if spoken is not None else None,
                   transcribe=bool(data.get("transcribe")))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file_id": self.file_id, "size": self.size, "mime": self.mime, "name": self.name}
        if self.spoken is not None:  # rows of photos and documents stay as they were
            out.update(spoken=str(self.spoken), transcribe=self.transcribe)
        return out


@dataclass(frozen=True, slots=True)
class Reply:
    """The message a person replied to, as context for eve: its text (or the part they quoted),
    already capped, with its attachments named; who wrote it; where it was, when elsewhere."""

    text: str
    author: str | None  # None when Telegram does not say (or when it is the assistant's own)
    assistant: bool = False  # the assistant's own earlier answer
    partial: bool = False  # a part the person quoted, not the whole message
    where: str | None = None  # another chat ('"Title"') or "another topic"; None: this conversation

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "author": self.author, "assistant": self.assistant, "partial": self.partial,
                "where": self.where}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reply:
        author, where = data.get("author"), data.get("where")
        return cls(text=str(data.get("text") or ""), author=None if author is None else str(author),
                   assistant=bool(data.get("assistant")), partial=bool(data.get("partial")),
                   where=None if where is None else str(where))


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A person's message, waiting for its turn."""

    text: str
    message_id: int
    user_id: int
    user_name: str
    owner: bool
    private: bool
    date: int | None = None
    attachment: Attachment | None = None
    reply: Reply | None = None  # I1; payloads written before it have none
    album: str | None = None  # Telegram's media_group_id: the parts go to eve as one turn
    correction: bool = False  # an edit of a message eve already has (I2)

    kind = "message"

    def to_payload(self) -> dict[str, Any]:
        a = self.attachment
        out = {"kind": self.kind, "text": self.text, "message_id": self.message_id, "user_id": self.user_id,
               "user_name": self.user_name, "owner": self.owner, "private": self.private, "date": self.date,
               "attachment": None if a is None else a.to_dict(),
               "reply": None if self.reply is None else self.reply.to_dict()}
        if self.album is not None:
            out["album"] = self.album
        if self.correction:
            out["correction"] = True
        return out

    def revision(self) -> tuple[str, str | None]:
        """What an edit can change that eve would see: the words and the file."""
        return self.text, None if self.attachment is None else self.attachment.file_id


@dataclass(frozen=True, slots=True)
class InputAnswer:
    """A pressed button: the answer to one of eve's prompts (T5)."""

    request_id: str
    option_id: str
    message_id: int
    user_id: int

    kind = "input"

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind, "request_id": self.request_id, "option_id": self.option_id,
                "message_id": self.message_id, "user_id": self.user_id}


@dataclass(frozen=True, slots=True)
class PushedTurn:
    """A turn nobody wrote in the chat (W1): pushed through the owner API or by a reminder
    falling due. It is always a turn of its own, never batched with the person's messages nor
    steered into a running turn; eve is told in ``clientContext`` who pushed it (``source``:
    ``api`` or ``reminder``; ``by``: the caller's own name for itself, if it gave one) and its
    ``key``. ``due`` (a reminder's due instant, UTC seconds) and ``late`` (it fell due while Iva
    was down or the clock jumped) come with a reminder's fire. ``failed``: why it could not run,
    written when it ended so (W4)."""

    text: str
    source: str = "api"
    key: str | None = None
    by: str | None = None
    reminder: str | None = None
    due: float | None = None
    late: bool = False
    failed: str | None = None
    set_by: str | None = None  # a reminder's: "owner" or "assistant" (S9)
    set_in: str | None = None  # the assistant's reminder: the turn it was set in, in words (S9)

    kind = "pushed"
    owner = True  # pushed with the owner's token (or set by the owner): the owner's turn (N1)

    def to_payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "text": self.text, "source": self.source, "key": self.key}
        for name in ("by", "reminder", "due", "failed", "set_by", "set_in"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.late:
            out["late"] = True
        return out

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> PushedTurn:
        def text_or_none(name: str) -> str | None:
            value = payload.get(name)
            return None if value is None else str(value)

        due = payload.get("due")
        return cls(text=str(payload.get("text") or ""), source=str(payload.get("source") or "api"),
                   key=text_or_none("key"), by=text_or_none("by"), reminder=text_or_none("reminder"),
                   due=float(due) if isinstance(due, int | float) else None, late=bool(payload.get("late")),
                   failed=text_or_none("failed"), set_by=text_or_none("set_by"), set_in=text_or_none("set_in"))


Queued = QueuedMessage | InputAnswer | PushedTurn


def decode(payload: Mapping[str, Any]) -> Queued:
    """A queue row's payload as its type (rows written before the types existed read the same)."""
    if payload.get("kind") == PushedTurn.kind:
        return PushedTurn.from_payload(payload)
    if payload.get("kind") == InputAnswer.kind:
        return InputAnswer(request_id=str(payload["request_id"]), option_id=str(payload["option_id"]),
                           message_id=int(payload.get("message_id") or 0), user_id=int(payload.get("user_id") or 0))
    attachment, reply = payload.get("attachment"), payload.get("reply")
    return QueuedMessage(
        text=str(payload.get("text") or ""),
        message_id=int(payload.get("message_id") or 0),
        user_id=int(payload.get("user_id") or 0),
        user_name=str(payload.get("user_name") or ""),
        owner=bool(payload.get("owner")),
        private=bool(payload.get("private", True)),
        date=payload.get("date"),
        attachment=Attachment.from_dict(attachment) if attachment else None,
        reply=Reply.from_dict(reply) if reply else None,
        album=None if payload.get("album") is None else str(payload["album"]),
        correction=bool(payload.get("correction")),
    )


@dataclass(frozen=True, slots=True)
class PromptButton:
    """The callback data of a prompt's option button: ``in:<prompt id>:<option index>``."""

    prompt_id: int
    index: int

    PREFIX = "in"

    def encode(self) -> str:
        return f"{self.PREFIX}:{self.prompt_id}:{self.index}"

    @classmethod
    def parse(cls, data: str | None) -> PromptButton | None:
        """The button, or None for anything that is not one of ours (never raises)."""
        prefix, _, rest = (data or "").partition(":")
        prompt_id, _, index = rest.partition(":")
        if prefix != cls.PREFIX or not prompt_id.isdigit() or not index.isdigit():
            return None
        return cls(int(prompt_id), int(index))


@dataclass(frozen=True, slots=True)
class PeopleButton:
    """The callback data of a /users remove button: ``pp:rm:<user id>`` (P1-P4, S7)."""

    user_id: int

    PREFIX = "pp:rm"

    def encode(self) -> str:
        return f"{self.PREFIX}:{self.user_id}"

    @classmethod
    def parse(cls, data: str | None) -> PeopleButton | None:
        """The button, or None for anything that is not one (never raises)."""
        head, _, user = (data or "").rpartition(":")
        if head != cls.PREFIX or not user.isdigit():
            return None
        return cls(int(user))
