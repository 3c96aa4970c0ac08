"""The daemon under tracemalloc, for finding where the memory of busy chats goes (benchmark 4):
``python -m bench.traced`` runs ``bridge run``; SIGUSR1 writes the allocations grouped by line,
the largest first, to ``$TRACED_OUT`` (snapshot N appended), and also their difference from the
previous snapshot. Measuring only: tracemalloc slows the daemon and adds its own memory."""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from typing import Any

tracemalloc.start(int(os.environ.get("TRACED_FRAMES", "8")))
_last: list[Any] = []


def dump(*_: object) -> None:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    with open(os.environ.get("TRACED_OUT", "/tmp/traced.txt"), "a") as out:
        total = sum(s.size for s in snapshot.statistics("filename"))
        out.write(f"=== snapshot {len(_last) + 1}: {total / 1024:.0f} KiB traced\n")
        for stat in snapshot.statistics("lineno")[:40]:
            out.write(f"{stat.size / 1024:9.1f} KiB {stat.count:7d}  {stat.traceback[0]}\n")
        if _last:
            grown = snapshot.compare_to(_last[-1], "traceback")
            out.write("--- grown since the previous snapshot, by the last line of Iva's own on the way\n")
            for where, size, count in by_own_line(grown)[:30]:
                out.write(f"{size / 1024:+9.1f} KiB {count:+7d}  {where}\n")
            out.write("--- grown since the previous snapshot (by traceback)\n")
            for stat in grown[:15]:
                out.write(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d}\n")
                for line in stat.traceback.format()[-8:]:
                    out.write(f"      {line}\n")
        _last[:] = [snapshot]


OWN = ("/bridge/", "/eve_client/", "/diskqueue/")


def by_own_line(grown: list[Any]) -> list[tuple[str, int, int]]:
    """The growth summed by the innermost frame in Iva's own packages (else the allocating line):
    which of Iva's lines a busy chat's memory hangs from, libraries' allocations included."""
    sums: dict[str, list[int]] = {}
    for stat in grown:
        frames = list(stat.traceback)  # the outermost call first, the allocating line last
        own = [f for f in frames if any(part in f.filename for part in OWN)]
        frame = own[-1] if own else frames[-1]
        entry = sums.setdefault(f"{frame.filename}:{frame.lineno}", [0, 0])
        entry[0] += stat.size_diff
        entry[1] += stat.count_diff
    return sorted(((k, v[0], v[1]) for k, v in sums.items()), key=lambda e: -e[1])


signal.signal(signal.SIGUSR1, dump)
sys.argv = ["bridge", "run"]
from bridge.cli import main  # noqa: E402

sys.exit(main())
