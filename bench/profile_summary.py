"""Benchmark 6: read a py-spy profile (``--profile out.txt``, raw collapsed stacks) and print
where the daemon's busy samples went, by the costs named in docs/benchmarks.md, and the leaf
functions. ``python -m bench.profile_summary out.txt [--turns N]``."""

from __future__ import annotations

import argparse
import collections

IDLE = ("EpollSelector.select", "aiosqlite/core.py:59", "aiosqlite/core.py:63")
COSTS = {
    "aiogram: getUpdates (parse + request)": "Bot.get_updates",
    "aiogram: other Bot API calls": "BaseSession.__call__",
    "SQLite statements and commits": "Database._run",
    "httpcore pool scan": "_assign_requests_to_connections",
    "httpx: eve calls": "EveClient._call",
    "httpx: stream open": "_StreamContext.__aenter__",
    "eve stream parsing": "EveClient._parse",
    "typing indicator loop": "Typing._loop",
    "rendering (telegramify)": "bridge/telegram/render.py",
    "logging (structlog)": "structlog/",
    "start-up: pydantic schema building": "_schema_gather",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--turns", type=int, default=0, help="turns in the profiled run, for ms per turn")
    args = parser.parse_args()
    busy = 0
    costs: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for line in open(args.path, errors="replace"):
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit() or any(i in stack for i in IDLE):
            continue
        n = int(count)
        busy += n
        leaves[stack.rsplit(";", 1)[-1][:120]] += n
        for name, pattern in COSTS.items():
            if pattern in stack:
                costs[name] += n
    print(f"busy samples: {busy} (1 kHz: {busy / 1000:.1f} s of CPU)")
    for name, n in costs.most_common():
        per_turn = f"  {n / args.turns:.2f} ms/turn" if args.turns else ""
        print(f"  {100 * n / busy:5.1f}%  {name}{per_turn}")
    print("leaf functions:")
    for name, n in leaves.most_common(12):
        print(f"  {100 * n / busy:5.1f}%  {name}")


if __name__ == "__main__":
    main()
