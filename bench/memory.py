"""Where a busy chat's memory goes (benchmark 4): the daemon under tracemalloc (bench/traced.py),
a snapshot idle and one with ``--chats`` turns in flight (eve holds each for minutes); the grown
allocations by traceback go to ``--out``. ``nice python -m bench.memory --chats 1000``."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

from bench.common import stack, teardown
from tests.fakes.telegram import UNPACED


async def run(chats: int, out: str) -> dict[str, float]:
    tg, eve, daemon, _, users = await stack(chats, **UNPACED, IVA_MAX_TURNS=str(chats))
    daemon.env["TRACED_OUT"] = out
    await daemon.start([sys.executable, "-m", "bench.traced"])
    try:
        assert daemon.proc is not None
        await asyncio.sleep(2)
        rss0 = daemon.rss_peak_kb()
        os.kill(daemon.proc.pid, signal.SIGUSR1)
        await asyncio.sleep(2)
        for u in users:
            await tg.message(f"u{u} [[delay=600]]", user_id=u)
        deadline = time.monotonic() + 300
        while sum(1 for s in eve.sessions.values() if s.running) < chats and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await asyncio.sleep(5)
        rss1 = daemon.rss_peak_kb()
        os.kill(daemon.proc.pid, signal.SIGUSR1)
        await asyncio.sleep(5)
        busy = sum(1 for s in eve.sessions.values() if s.running)
    finally:
        await teardown(daemon, tg, eve)
    return {"busy": busy, "rss_idle_mb": round(rss0 / 1024, 1), "rss_busy_mb": round(rss1 / 1024, 1),
            "kb_per_busy_chat": round((rss1 - rss0) / max(1, busy), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chats", type=int, default=1000)
    parser.add_argument("--out", default="/tmp/traced.txt")
    args = parser.parse_args()
    print(asyncio.run(run(args.chats, args.out)))


if __name__ == "__main__":
    main()
