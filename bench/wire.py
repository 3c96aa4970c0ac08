"""eve 1.x's stream (version 27) beside eve 0.80's (26): CPU per turn and commits per turn, measured
side by side (docs/benchmarks.md, "eve 1.x's stream"). Each run is its own process with the fake eve
speaking one version (``IVA_FAKE_EVE_VERSION``); the runs alternate, so load drifts hit both.

    python -m bench.wire --pairs 3 --turns 600 --chats 10      # CPU per turn
    python -m bench.wire --commits --turns 300 --chats 10      # commits per turn (strace)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys

from bench.common import save

_ONE = """
import asyncio, json, sys
from bench.latency import commits_per_turn, sequential
turns, chats, commits = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
result = asyncio.run(commits_per_turn(turns, chats) if commits else sequential(turns, chats))
print("RESULT " + json.dumps(result))
"""


def run(version: int, turns: int, chats: int, commits: bool) -> dict:
    env = {**os.environ, "IVA_FAKE_EVE_VERSION": str(version)}
    done = subprocess.run([sys.executable, "-c", _ONE, str(turns), str(chats), "1" if commits else "0"],
                          env=env, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return dict(json.loads(line[7:]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--commits", action="store_true")
    args = parser.parse_args()
    pairs = []
    for n in range(1 if args.commits else args.pairs):
        pair = {str(v): run(v, args.turns, args.chats, args.commits) for v in ((26, 27) if n % 2 == 0 else (27, 26))}
        key = "commits_per_turn" if args.commits else "cpu_ms_per_turn"
        print(f"pair {n + 1}: 26 → {pair['26'][key]}, 27 → {pair['27'][key]}", flush=True)
        pairs.append(pair)
    path = save("wire-commits" if args.commits else "wire-cpu", {"turns": args.turns, "chats": args.chats,
                                                                   "pairs": pairs})
    print(f"written to {path}")


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
