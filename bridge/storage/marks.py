"""Dedupe marks: what an update handled on the spot leaves in the queue (a DONE row under the
update's dedupe key, :meth:`diskqueue.DiskQueue.remember`), typed. A redelivered update finds its
mark and does nothing again; retention forgets marks with the history (storage/retention.py).

Each mark's payload is the JSON the dict marks wrote before, key for key and in the same order,
so marks written by an older Iva read the same."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from diskqueue import DiskQueue

from .address import Address

__all__ = ["AlbumHeld", "AlbumMark", "CommandMark", "EditMark", "Mark", "PairingMark", "PeopleMark", "RefusedMark",
           "StopMark", "remember"]


@dataclass(frozen=True, slots=True)
class CommandMark:
    """A command answered on the spot (``/notes``, ``/new`` …; None: one whose name is not kept)."""

    kind: ClassVar[str] = "command"
    command: str | None = None

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind} if self.command is None else {"kind": self.kind, "command": self.command}


@dataclass(frozen=True, slots=True)
class PairingMark:
    """A pairing or invitation code sent (P1-P3)."""

    kind: ClassVar[str] = "pairing"

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class PeopleMark:
    """A press of /users' remove button (P4): whom it removed."""

    kind: ClassVar[str] = "people"
    remove: int

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind, "remove": self.remove}


@dataclass(frozen=True, slots=True)
class StopMark:
    """A press of the live draft's stop button (L*)."""

    kind: ClassVar[str] = "stop"

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class AlbumMark:
    """A group album that addressed the bot: its later parts need no mention."""

    kind: ClassVar[str] = "album"

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class AlbumHeld:
    """A part of a group album held before anything of it addressed the bot: what it will be once
    the album is ours — the queued message's payload (``item``), or the line refusing it."""

    kind: ClassVar[str] = "album_held"
    message_id: int
    item: Mapping[str, Any] | None = None
    refusal: str | None = None

    def to_payload(self) -> dict[str, Any]:
        held: dict[str, Any] = {"kind": self.kind}
        if self.item is not None:
            held["item"] = dict(self.item)
        else:
            held["refusal"] = self.refusal
        held["message_id"] = self.message_id
        return held

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> AlbumHeld | None:
        """The held part a queue row's payload names; None for any other payload."""
        if payload.get("kind") != cls.kind:
            return None
        item = payload.get("item")
        return cls(message_id=int(payload["message_id"]), item=item if isinstance(item, Mapping) else None,
                   refusal=None if "item" in payload else str(payload.get("refusal")))


@dataclass(frozen=True, slots=True)
class RefusedMark:
    """A message refused with a short answer (T8): it counts as never queued."""

    kind: ClassVar[str] = "refused"

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class EditMark:
    """An edit of a message (I1-I3): the revision it carried (its words and file), and whether it
    was ignored (its message was refused or dropped)."""

    kind: ClassVar[str] = "edit"
    text: str
    file_id: str | None
    ignored: bool = False

    def to_payload(self) -> dict[str, Any]:
        mark: dict[str, Any] = {"kind": self.kind, "text": self.text, "file_id": self.file_id}
        if self.ignored:
            mark["ignored"] = True
        return mark

    @classmethod
    def revision_of(cls, payload: Mapping[str, Any]) -> tuple[str, str | None] | None:
        """The revision an edit mark's payload carried; None for any other payload."""
        if payload.get("kind") != cls.kind:
            return None
        return str(payload.get("text") or ""), payload.get("file_id")


Mark = CommandMark | PairingMark | PeopleMark | StopMark | AlbumMark | AlbumHeld | RefusedMark | EditMark


async def remember(queue: DiskQueue, address: Address | str, mark: Mark, *, dedupe_key: str) -> bool:
    """The mark written under ``dedupe_key`` (in the caller's transaction, if any); False when the
    key was seen before: the caller must not act again."""
    return await queue.remember(str(address), mark.to_payload(), dedupe_key=dedupe_key)
