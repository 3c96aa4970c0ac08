"""Albums: the decision of which claimed messages go now, kept apart from the machinery (I3).

Telegram sends an album (photos or documents sent together) as one message per part, sharing a
``media_group_id``, a few milliseconds apart. Each part is committed on arrival like any message;
the chat waits for the album to settle — :data:`SETTLE` seconds after its last part arrived, and
never sooner than that after ingest caught up with what Telegram held at this start (a part
redelivered after a restart is committed by then) — and then claims every part of it at once, so
eve sees one turn with every file and the captions. A batch limit never splits an album (one that
leads the batch is taken whole, one that does not waits for the next turn), the claim looks
:data:`LOOKAHEAD` messages past the limit to see whole albums, even two interleaved; only more
interleaving than that, or the files budget (a huge album), may split one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diskqueue import Message

from ..storage.payloads import Queued, QueuedMessage

__all__ = ["LARGEST", "LOOKAHEAD", "SETTLE", "Cut", "cut"]

SETTLE = 1.0  # seconds after an album's last part before it is claimed
LARGEST = 10  # parts in an album, at most (Telegram's limit)
LOOKAHEAD = 2 * LARGEST  # a claim looks this far past its limit: two albums sent at once, interleaved


@dataclass(frozen=True, slots=True)
class Cut:
    """Take ``take`` of the claimed messages; ``wait_until`` (on ``now``'s clock) when none can go
    yet because the first is part of an album still arriving."""

    take: int
    wait_until: float | None = None


def _album(item: Queued) -> str | None:
    return item.album if isinstance(item, QueuedMessage) else None


def cut(claimed: Sequence[Message], items: Sequence[Queued], waiting: Sequence[Message], *, limit: int,
        now: float, started: float, settle: float = SETTLE,
        arrived: Callable[[Message], float] | None = None) -> Cut:
    """``claimed`` (decoded as ``items``), oldest first, were taken for a turn of at most
    ``limit`` messages; ``waiting`` are the address's queued messages behind them.

    The turn is a prefix of ``claimed``. No album is split by it, even one whose parts other
    messages interleave (a group): the album that leads is taken whole, past the limit if need
    be, with whatever lies between its parts; any other album the prefix would split is left,
    from its first part on, for the next turn. An album still settling is never taken."""
    last: dict[str, float] = {}
    for row in [*claimed, *waiting]:
        album = row.payload.get("album")
        if isinstance(album, str):
            last[album] = max(last.get(album, 0.0), row.enqueued_at if arrived is None else arrived(row))
    where: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if (album := _album(item)) is not None:
            where.setdefault(album, []).append(i)
    beyond = {row.payload.get("album") for row in waiting}  # albums with parts not even claimed

    def settles(album: str) -> float:
        return max(last[album], started) + settle

    lead = _album(items[0]) if items else None
    if lead is not None and settles(lead) > now:
        return Cut(0, settles(lead))
    must = where[lead][-1] + 1 if lead is not None else 0  # the leading album, whole
    take = max(min(limit, len(items)), must)
    while True:
        inside = {a for a, at in where.items() if at[0] < take}
        split = sorted((where[a][0], a) for a in inside
                       if where[a][-1] >= take or settles(a) > now or (a in beyond and where[a][0] >= must))
        if not split:
            return Cut(take)
        first, album = split[0]
        if first >= must:
            take = first  # leave it, from its first part on, for the next turn
        elif settles(album) > now:
            return Cut(0, settles(album))  # interleaved with the leading album, still arriving
        else:
            must = max(must, where[album][-1] + 1)  # interleaved with the leading album: whole too
            take = max(take, must)
