"""What composing a turn fetched and heard, kept until the turn is with eve (I4, T8).

A turn with files or recordings is composed (downloaded, transcribed) before the bridge learns
whether eve can take it; while eve is unreachable the messages go back to the queue and the turn
is composed again at every retry. So each file part and each transcript is kept here, by the
Telegram file it came from, until a send took the turn: an outage costs one download and one
transcription per file, not one per retry. Failures are not kept (the next try may fetch it).
Bounded: at most ``MAX_PART_BYTES`` of parts (the oldest go first) and ``MAX_HEARD`` transcripts —
past that, a part is fetched again, which is what happened before, never a wrong one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ..storage.payloads import Attachment, Queued, QueuedMessage

__all__ = ["MAX_HEARD", "MAX_PART_BYTES", "Media"]

MAX_PART_BYTES = 50 * 1024 * 1024  # encoded file parts kept across retries, at most (one turn's files)
MAX_HEARD = 512  # transcripts kept, at most


def _key(attachment: Attachment, cap: int) -> tuple[str, int]:
    return attachment.file_id, cap


class Media:
    def __init__(self, *, max_part_bytes: int = MAX_PART_BYTES, max_heard: int = MAX_HEARD) -> None:
        self.max_part_bytes = max_part_bytes
        self.max_heard = max_heard
        self._parts: OrderedDict[tuple[str, int], tuple[dict[str, Any], int]] = OrderedDict()
        self._heard: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._bytes = 0

    def part(self, attachment: Attachment, cap: int) -> dict[str, Any] | None:
        kept = self._parts.get(_key(attachment, cap))
        return None if kept is None else kept[0]

    def keep_part(self, attachment: Attachment, cap: int, part: dict[str, Any]) -> None:
        size = len(str(part.get("data", "")))
        if size > self.max_part_bytes:
            return
        key = _key(attachment, cap)
        if key in self._parts:
            self._bytes -= self._parts.pop(key)[1]
        self._parts[key] = (part, size)
        self._bytes += size
        while self._bytes > self.max_part_bytes:
            self._bytes -= self._parts.popitem(last=False)[1][1]

    def heard(self, attachment: Attachment, cap: int) -> str | None:
        return self._heard.get(_key(attachment, cap))

    def keep_heard(self, attachment: Attachment, cap: int, text: str) -> None:
        self._heard[_key(attachment, cap)] = text
        while len(self._heard) > self.max_heard:
            self._heard.popitem(last=False)

    def forget(self, items: Iterable[Queued]) -> None:
        """The turn is with eve: its files and transcripts are not needed again."""
        for item in items:
            if isinstance(item, QueuedMessage) and item.attachment is not None:
                for key in [k for k in (*self._parts, *self._heard) if k[0] == item.attachment.file_id]:
                    if key in self._parts:
                        self._bytes -= self._parts.pop(key)[1]
                    self._heard.pop(key, None)
