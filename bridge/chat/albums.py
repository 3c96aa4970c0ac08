"""Albums: the decision of which claimed messages go now, kept apart from the machinery (issue 14).

Telegram sends an album (photos or documents sent together) as one message per part, sharing a
``media_group_id``, a few milliseconds apart. Each part is committed on arrival like any message;
the chat waits for the album to settle — :data:`SETTLE` seconds after its last part arrived, and
never before this process has been up that long (a part Telegram redelivers after a restart is
committed within it) — and then claims every part of it at once, so eve sees one turn with every
file and the captions. A batch limit never splits an album (one that leads the batch is taken
whole, one that does not waits for the next turn); the files budget still may (a huge album).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diskqueue import Message

from ..payloads import Queued, QueuedMessage

__all__ = ["LARGEST", "SETTLE", "Cut", "cut"]

SETTLE = 1.0  # seconds after an album's last part before it is claimed
LARGEST = 10  # parts in an album, at most (Telegram's limit): a claim looks this far past its limit


@dataclass(frozen=True, slots=True)
class Cut:
    """Take ``take`` of the claimed messages; ``wait_until`` (a ``time.time()``) when none can go
    yet because the first is part of an album still arriving."""

    take: int
    wait_until: float | None = None


def _album(item: Queued) -> str | None:
    return item.album if isinstance(item, QueuedMessage) else None


def cut(claimed: Sequence[Message], items: Sequence[Queued], waiting: Sequence[Message], *, limit: int,
        now: float, started: float, settle: float = SETTLE) -> Cut:
    """``claimed`` (decoded as ``items``), oldest first, were taken for a turn of at most
    ``limit`` messages; ``waiting`` are the address's queued messages behind them."""
    last: dict[str, float] = {}
    for row in [*claimed, *waiting]:
        album = row.payload.get("album")
        if isinstance(album, str):
            last[album] = max(last.get(album, 0.0), row.enqueued_at)
    take = min(limit, len(claimed))
    for i, item in enumerate(items[:take]):
        album = _album(item)
        if album is not None and max(last[album], started) + settle > now:
            if i == 0:
                return Cut(0, max(last[album], started) + settle)
            take = i
            break
    if 0 < take < len(items) and (album := _album(items[take - 1])) is not None and _album(items[take]) == album:
        first = next(i for i, item in enumerate(items) if _album(item) == album)
        if first == 0:
            take = max(i for i, item in enumerate(items) if _album(item) == album) + 1
        else:
            take = first
    return Cut(take)
