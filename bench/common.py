"""Shared pieces of the benchmarks: the fakes on loopback, the real daemon, statistics."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.eve import FakeEve  # noqa: E402
from tests.fakes.telegram import TOKEN, FakeTelegram  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def dist_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": round(pct(ms, 50), 3), "p99": round(pct(ms, 99), 3),
            "max": round(max(ms), 3) if ms else float("nan"), "mean": round(statistics.fmean(ms), 3) if ms else 0}


def fsync_commit_baseline(directory: Path, n: int = 2000) -> list[float]:
    """The physical floor of a durable hand-off: one single-row WAL commit with synchronous=FULL."""
    import sqlite3

    path = directory / "baseline.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t0)
    conn.close()
    return times


class Daemon:
    def __init__(self, tg: FakeTelegram, eve: FakeEve, state: Path, **env: str) -> None:
        self.env = {
            **os.environ,
            "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": eve.url,
            "IVA_EVE_TOKEN": eve.token, "IVA_STATE_DIR": str(state), "IVA_OWNER_IDS": "1",
            "IVA_LANG": "en", "IVA_LOG_LEVEL": "warning", "IVA_API_LISTEN": f"127.0.0.1:{free_port()}", **env,
        }
        self.env.pop("NOTIFY_SOCKET", None)
        self.tg = tg
        self.proc: asyncio.subprocess.Process | None = None
        self.log = state / "daemon.log"

    async def start(self, argv: list[str] | None = None, *, timeout: float = 60) -> None:
        polls = len(self.tg.calls_of("getUpdates"))
        with open(self.log, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *(argv or [sys.executable, "-m", "bridge", "run"]), cwd=ROOT, env=self.env,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
            )
        await self.tg.wait_for(lambda: len(self.tg.calls_of("getUpdates")) > polls, timeout, "the daemon to poll")

    def rss_peak_kb(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return 0

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            # Under py-spy the daemon is its child: stop the daemon, and py-spy writes its profile.
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            kids = [int(p) for p in children.read_text().split()] if children.exists() else []
            for pid in kids or [self.proc.pid]:
                os.kill(pid, signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 60)


async def stack(chats: int, **env: str) -> tuple[FakeTelegram, FakeEve, Daemon, Path, list[int]]:
    """The fakes on loopback and a daemon (not started) that lets ``chats`` users (ids 100…) talk."""
    tg, eve = FakeTelegram(), FakeEve()
    await tg.start()
    await eve.start()
    state = tmpdir()
    users = [100 + c for c in range(chats)]
    daemon = Daemon(tg, eve, state, IVA_ALLOWED_USER_IDS=",".join(map(str, users)), **env)
    return tg, eve, daemon, state, users


async def teardown(daemon: Daemon, tg: FakeTelegram, eve: FakeEve) -> None:
    await daemon.stop()
    await tg.stop()
    await eve.stop()


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def save(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2))
    return path


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def tmpdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="iva-bench-"))
