"""Parking-lot compaction: the decisions, kept apart from the machinery (SPEC §4, seed 004).

After a finished turn the parking handler measures (input tokens of the turn's last step that
reported usage) and compares with the threshold. A compaction's "after" is the next turn's first
step that reports usage (seed 004: "«стало» из первого измеренного входа следующего хода"): a
tool-using turn grows from there with its tool output, which the compaction did not fail to fold. It
compacts through eve's own route, holding the chat with the same busy status as a turn. A compaction
that did not bring the next measurement under the threshold disables parking compaction for the rest
of the session (C8); a failed one backs off before the next try, so a broken summarizer never loops
(LESSONS #4).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..notebook.rules import in_turn_threshold  # C9, defined with the [window] wall that needs it
from ..storage.store import Chat

__all__ = ["COOLDOWN", "ParkingDecision", "cooldown", "in_turn_threshold", "parking_decision", "threshold"]

COOLDOWN = (60.0, 300.0, 900.0)  # seconds before the next auto try, by failures in a row


def threshold(window: int | None, percent: int, ceiling: int) -> int:
    """min(percent% × window, ceiling); the ceiling alone when the window is unknown."""
    return min(window * percent // 100, ceiling) if window else ceiling


@dataclass(frozen=True, slots=True)
class ParkingDecision:
    compact: bool
    updates: dict[str, Any]  # chat fields to write with the turn's release
    after: int | None = None  # the "after" size of the previous compaction, now known


def parking_decision(chat: Chat, measurement: int | None, limit: int, *, first: int | None = None,
                     now: float | None = None) -> ParkingDecision:
    """What the parking handler does with this turn's measurement (its last step's input);
    ``first`` is the turn's first measured input, the "after" of a compaction before it."""
    now = time.time() if now is None else now
    updates: dict[str, Any] = {}
    after = None
    if measurement is None:
        return ParkingDecision(False, updates)
    disabled = chat.compaction_disabled
    if chat.after_pending:
        # The first measurement after a compaction: did it bring us under the threshold (C8)?
        after = measurement if first is None else first
        updates.update(after_pending=0, last_after=after)
        if after >= limit:
            updates["compaction_disabled"] = 1
            disabled = True
    if disabled or measurement < limit:
        return ParkingDecision(False, updates, after)
    if chat.compact_retry_at is not None and now < chat.compact_retry_at:
        return ParkingDecision(False, updates, after)
    return ParkingDecision(True, updates, after)


def cooldown(failures: int) -> float:
    return COOLDOWN[min(failures, len(COOLDOWN)) - 1] if failures > 0 else 0.0
