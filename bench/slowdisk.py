"""Benchmark 7: a slow disk (issue 11 §4) — does the event loop stay responsive when every fsync
takes 50 ms?

``python -m bench.slowdisk --delay-ms 50 --chats 16 --rounds 3 --run NAME=TREE:MODEL ...``

The daemon (``bench/loop_probe.py``: ``bridge.app.run`` plus a 10 ms ticker that records how late
each wake-up is) runs under ``strace -e inject=fsync,fdatasync:delay_exit=50ms``: every fsync of
the daemon returns 50 ms late, on whichever thread made it (ptrace stops only that thread), the
way a slow or saturated disk behaves. ``--delay-ms 0`` runs it without strace (CPU per turn of
each design, nothing injected; with ``--no-poll`` the turns' CPU alone). The fakes run in this process, not traced.

After one warm-up turn per chat (sessions created), ``--chats`` chats each send a message at the
same moment, ``--rounds`` times (each round waits for every answer). Meanwhile this process asks
the daemon's ``/healthz`` and the notebook's ``/mcp`` ``tools/list`` (with a live session's id,
as eve does on every step) one request after another, 50 ms apart, and records each latency.
Reported per run: the loop's longest stall and how many 10 ms ticks came more than 100 ms late
(ticker), ``/healthz`` and ``tools/list`` p50 / max (eve gives ``tools/list`` 10 s), the wall time
of a round, the daemon's CPU per turn, and how many times the bridge found the disk slow (its
``slow_commit`` log line: commits moved off the loop).

``--run NAME=TREE:MODEL`` (repeatable; runs interleave with ``--repeat``): ``TREE`` is a checkout
whose ``bridge``/``diskqueue`` are measured (a ``git worktree`` of an older commit for "before"),
``MODEL`` one of ``bench/loop_probe.py``'s (``as-is``, ``no-snapshot``, ``aiosqlite``);
``--aiosqlite DIR`` is put on the daemon's path for the ``aiosqlite`` model (``pip install
--target DIR aiosqlite``: it is not a dependency of the project).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, Daemon, FakeEve, FakeTelegram, dist_ms, save, table, tmpdir

PROBE = ROOT / "bench" / "loop_probe.py"


def _python_pid(daemon: Daemon) -> int:
    """The bridge's own pid: the process itself, or strace's child."""
    assert daemon.proc is not None
    pid = daemon.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(p) for p in children.read_text().split()] if children.exists() else []
    return kids[0] if kids else pid


def _cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _poll(client: httpx.AsyncClient, ask: Any, stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await ask(client)
        out.append(time.perf_counter() - started)
        await asyncio.sleep(0.05)


async def one(name: str, tree: Path, model: str, *, delay_ms: float, chats: int, rounds: int,
              aiosqlite: str | None, poll: bool = True) -> dict[str, Any]:
    import sys

    tg, eve = FakeTelegram(), FakeEve()
    await tg.start()
    await eve.start()
    state = tmpdir()
    users = [100 + c for c in range(chats)]
    daemon = Daemon(tg, eve, state, IVA_OWNER_IDS=",".join(map(str, users)), IVA_MAX_TURNS=str(max(16, chats)))
    daemon.env["PYTHONPATH"] = ":".join([str(tree), *([aiosqlite] if model == "aiosqlite" and aiosqlite else [])])
    ticks_path = state / "ticks.json"
    argv = [sys.executable, str(PROBE), str(ticks_path), model]
    if delay_ms > 0:
        argv = ["strace", "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null", "-e", "trace=fsync,fdatasync",
                "-e", f"inject=fsync,fdatasync:delay_exit={delay_ms:g}ms", *argv]
    await daemon.start(argv)
    base = f"http://{daemon.env['IVA_API_LISTEN']}"
    health: list[float] = []
    listing: list[float] = []
    statuses: dict[str, int] = {}
    try:
        for u in users:
            await tg.message(f"warm {u}", user_id=u)
        await tg.wait_sent(lambda: tg.sent_count >= chats, 300)
        session = next(iter(eve.sessions))
        pid = _python_pid(daemon)

        async def healthz(client: httpx.AsyncClient) -> None:
            r = await client.get(f"{base}/healthz")
            statuses[f"healthz {r.status_code}"] = statuses.get(f"healthz {r.status_code}", 0) + 1

        async def tools_list(client: httpx.AsyncClient) -> None:
            r = await client.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                  headers={"x-eve-session-id": session, "accept": "application/json"})
            tools = len(r.json().get("result", {}).get("tools", [])) if r.status_code == 200 else -1
            statuses[f"tools/list {r.status_code} {tools} tools"] = statuses.get(
                f"tools/list {r.status_code} {tools} tools", 0) + 1

        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=120) as client:
            pollers = [asyncio.create_task(_poll(client, healthz, stop, health)),
                       asyncio.create_task(_poll(client, tools_list, stop, listing))] if poll else []
            cpu0 = _cpu_seconds(pid)
            t0 = time.monotonic()
            walls = []
            for r in range(rounds):
                started = time.monotonic()
                for u in users:
                    await tg.message(f"u{u} r{r}", user_id=u)
                expected = {f"echo: u{u} r{r}" for u in users}
                await tg.wait_sent(lambda: expected <= set(tg.sent_texts), 600)  # noqa: B023
                walls.append(time.monotonic() - started)
            t1 = time.monotonic()
            cpu = _cpu_seconds(pid) - cpu0
            stop.set()
            await asyncio.gather(*pollers)
    finally:
        await daemon.stop()
        await tg.stop()
        await eve.stop()
    ticks = [lag for at, lag in json.loads(ticks_path.read_text())["ticks"] if t0 <= at <= t1]
    # Times the bridge found the disk slow and moved commits off the loop (its log line).
    slow_found = daemon.log.read_text().count("slow_commit")
    turns = chats * rounds
    return {
        "name": name, "tree": str(tree), "model": model, "delay_ms": delay_ms, "chats": chats, "rounds": rounds,
        "loop_stall": {**dist_ms(ticks), "ticks_late_over_100ms": sum(1 for t in ticks if t > 0.1)},
        "healthz": {**dist_ms(health), "over_1s": sum(1 for t in health if t > 1)},
        "tools_list": {**dist_ms(listing), "over_10s": sum(1 for t in listing if t > 10)},
        "answers": statuses,
        "round_wall_s": [round(w, 2) for w in walls],
        "turns_per_s": round(turns / (t1 - t0), 2),
        "cpu_ms_per_turn": round(cpu * 1000 / turns, 2),
        "slow_disk_found": slow_found,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay-ms", type=float, default=50.0, help="added to every fsync/fdatasync (0: no strace)")
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each --run, interleaved")
    parser.add_argument("--run", action="append", default=[], metavar="NAME=TREE:MODEL")
    parser.add_argument("--aiosqlite", help="a directory holding aiosqlite, for the aiosqlite model")
    parser.add_argument("--poll", action=argparse.BooleanOptionalAction, default=True,
                        help="ask /healthz and tools/list meanwhile (--no-poll: CPU per turn of the turns alone)")
    parser.add_argument("--out", default="slowdisk")
    args = parser.parse_args()
    runs = []
    for spec in args.run or [f"this={ROOT}:as-is"]:
        name, _, rest = spec.partition("=")
        tree, _, model = rest.rpartition(":")
        runs.append((name, Path(tree).resolve(), model or "as-is"))
    results = []
    for _ in range(args.repeat):
        for name, tree, model in runs:
            result = asyncio.run(one(name, tree, model, delay_ms=args.delay_ms, chats=args.chats,
                                     rounds=args.rounds, aiosqlite=args.aiosqlite, poll=args.poll))
            print(json.dumps(result), flush=True)
            results.append(result)
    path = save(args.out, {"delay_ms": args.delay_ms, "runs": results})
    rows = [("run", "loop max stall ms", "ticks >100 ms late", "/healthz p50 / max ms", "tools/list p50 / max ms",
             "round s", "CPU ms/turn", "slow found")]
    for r in results:
        rows.append((r["name"], str(r["loop_stall"]["max"]), str(r["loop_stall"]["ticks_late_over_100ms"]),
                     f"{r['healthz']['p50']} / {r['healthz']['max']}", f"{r['tools_list']['p50']} / {r['tools_list']['max']}",
                     "/".join(map(str, r["round_wall_s"])), str(r["cpu_ms_per_turn"]), str(r["slow_disk_found"])))
    print(table(rows))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
