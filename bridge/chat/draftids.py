"""Draft ids (L*): which turn a live draft — and so its stop button — belongs to.

A block's draft id carries its turn's claim (hashed, in the high bits) and the index of the
block's first event (the low bits): the same id when a restart replays the block, a new one for
each block, and a stop button pressed on a draft of a turn that is over names that turn, so it
never stops the turn that came after (a press that crosses the answer's arrival) — but for one
chance in 2 048 that the next turn's claim hashes alike.
"""

from __future__ import annotations

import zlib

__all__ = ["draft_id", "of_turn"]

# 31 bits in all (a positive 32-bit integer: whatever width Telegram parses a draft id in): 11
# for the turn, 20 for the event index (modulo: ids need only differ between the blocks of a turn).
_TURN_BITS = 11
_INDEX_BITS = 20


def _turn(claim: str) -> int:
    return zlib.crc32(claim.encode()) & ((1 << _TURN_BITS) - 1)


def draft_id(claim: str, index: int) -> int:
    """The draft id of the block whose first event is ``index``, in the turn claimed as ``claim``."""
    return (_turn(claim) << _INDEX_BITS) | ((index + 1) & ((1 << _INDEX_BITS) - 1) or 1)


def of_turn(draft: int, claim: str) -> bool:
    """True when ``draft`` is a draft of the turn claimed as ``claim``."""
    return draft >> _INDEX_BITS == _turn(claim)
