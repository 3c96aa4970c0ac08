"""Time that a clock step cannot move (F9).

NTP stepping the wall clock (a VM restored from a snapshot: an hour back; a host that booted with
a wrong clock: days forward) must not hold a chat or declare one stuck. So deadlines inside the
process run on the monotonic clock, and the wall time the bridge writes is *steady*: the wall
clock read once, at start, plus the monotonic time since — a step while the process runs does not
move it. What must survive a restart is compared through an *anchor* (the boot id and the steady
clock's offset from the monotonic one, kept by the previous process): within the same boot the
monotonic clock is shared, so an elapsed time across a restart is exact; across a reboot it is
the wall difference, clamped to ``[0, limit]`` so a step cannot hold anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["CLOCK", "Clock", "boot_id"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This boot's id (Linux), or None where the system does not say."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


class Clock:
    def __init__(self, *, wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic,
                 boot: str | None = None) -> None:
        self.wall = wall
        self.mono = mono
        self.boot = boot if boot is not None else boot_id()
        self.offset = wall() - mono()  # steady wall = monotonic + offset

    def now(self) -> float:
        """The steady wall time: the wall clock at start plus the monotonic time since."""
        return self.mono() + self.offset

    def bounded(self) -> float:
        """The earlier of the wall clock and the steady one: a cutoff that a forward step cannot
        move ahead (retention never prunes what is younger than it is)."""
        return min(self.wall(), self.now())

    def anchor(self) -> str:
        """What the next process needs to measure from this one's stamps (see :meth:`since`)."""
        return json.dumps({"boot": self.boot, "offset": self.offset})

    def since(self, stamp: float, *, limit: float, anchor: str | None = None) -> float:
        """Seconds since ``stamp`` (a steady wall time, maybe of the previous process, whose
        :meth:`anchor` is ``anchor``), in ``[0, limit]``."""
        offset = self.offset
        if anchor is not None:
            try:
                previous = json.loads(anchor)
                if previous.get("boot") is not None and previous.get("boot") == self.boot:
                    offset = float(previous["offset"])  # the same boot: its monotonic clock is ours
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        elapsed = self.mono() - (stamp - offset)
        return max(0.0, min(limit, elapsed))


CLOCK = Clock()  # the process's clock (tests build their own)
