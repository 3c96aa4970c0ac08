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
from pathlib import Path

from bench.common import stack, teardown
from tests.fakes.telegram import UNPACED


async def run(chats: int, out: str) -> dict[str, float]:
    tg, eve, daemon, _, users = await stack(chats, **UNPACED, IVA_MAX_TURNS=str(chats))
    daemon.env["TRACED_OUT"] = out
    # Under tracemalloc aiogram's import (pydantic's schemas of the whole Bot API) takes minutes.
    await daemon.start([sys.executable, "-m", "bench.traced"], timeout=600)
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
        busy_at = time.monotonic()  # the busy snapshot is compared by traceback: minutes under tracemalloc
        while "=== snapshot 2" not in (Path(out).read_text() if Path(out).exists() else "") \
                and time.monotonic() - busy_at < 900:
            await asyncio.sleep(2)
        busy = sum(1 for s in eve.sessions.values() if s.running)
    finally:
        try:
            await teardown(daemon, tg, eve)
        except TimeoutError:  # under tracemalloc the stop can outlast the bench's minute
            await daemon.kill()
            await teardown(daemon, tg, eve)  # the daemon gone, the fakes still to stop
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
