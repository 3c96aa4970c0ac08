"""Benchmarks 1 and 3: the bridge's added latency per turn, and the same at scale.

1. ``python -m bench.latency`` — sequential turns on a few chats against an instant fake eve and
   fake Bot API: (a) Bot API hands over the update → eve receives the send, (b) eve emits
   message.completed → the Bot API receives sendMessage. Baseline in the same run: one fsync'd
   SQLite WAL commit (synchronous=FULL) on the same disk.
2. ``python -m bench.latency --scale 1000`` — that many chats write at once: peak RSS, CPU per turn,
   p99 of (a)+(b), and fairness (each chat's wait vs the median).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from bench.common import (
    Daemon,
    FakeEve,
    FakeTelegram,
    dist_ms,
    fsync_commit_baseline,
    save,
    stack,
    table,
    teardown,
    tmpdir,
)


async def measure(tg: FakeTelegram, eve: FakeEve) -> tuple[list[float], list[float]]:
    """(a) and (b) for every answered message, matched by its text."""
    handed_by_text: dict[str, float] = {}
    for update in tg.updates:
        text = (update.get("message") or {}).get("text")
        if text and update["update_id"] in tg.handed_at:
            handed_by_text[text] = tg.handed_at[update["update_id"]]
    ingest = [eve.send_at[t] - handed_by_text[t] for t in handed_by_text if t in eve.send_at]
    sends = tg.sent_texts
    deliver = [sends[r] - at for r, at in eve.completed_at.items() if r in sends]
    return ingest, deliver


def profiled(path: str | None) -> list[str] | None:
    """The daemon under py-spy (benchmark 6): collapsed stacks, sampled at 1 kHz, idle excluded."""
    if not path:
        return None
    import sys
    from pathlib import Path

    spy = Path(sys.executable).with_name("py-spy")
    return [str(spy), "record", "-r", "1000", "-f", "raw", "-o", path, "--nonblocking", "--",
            sys.executable, "-m", "bridge", "run"]


def straced(path: str | None) -> list[str] | None:
    """The daemon under strace counting fsync/fdatasync calls: one per SQLite commit (WAL,
    synchronous=FULL). Slows only those calls (seccomp-bpf); CPU and latency of such a run are
    not comparable with a plain run, so ``--commits`` reports only commits per turn."""
    if not path:
        return None
    import sys

    return ["strace", "-f", "-qq", "--seccomp-bpf", "-c", "-e", "trace=fsync,fdatasync", "-o", path,
            sys.executable, "-m", "bridge", "run"]


def strace_calls(path: str) -> int:
    """The fsync + fdatasync call count from ``strace -c`` output."""
    from pathlib import Path

    total = 0
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if parts and parts[-1] in ("fsync", "fdatasync"):
            total += int(parts[3])
    return total


FORWARDER = [sys.executable, "-m", "bench.forwarder"]  # the baseline: aiogram + httpx, no durability


async def sequential(turns: int, chats: int, profile: str | None = None, commits: str | None = None,
                     argv: list[str] | None = None, **env: str) -> dict:
    tg, eve = FakeTelegram(), FakeEve()
    await tg.start()
    await eve.start()
    state = tmpdir()
    daemon = Daemon(tg, eve, state, IVA_ALLOWED_USER_IDS=",".join(str(100 + c) for c in range(chats)), **env)
    await daemon.start(argv or profiled(profile) or straced(commits))
    try:
        per_chat = turns // chats if turns else 0

        async def chat(c: int) -> None:
            user = 100 + c
            for n in range(per_chat):
                text = f"c{c} n{n}"
                await tg.message(text, user_id=user)
                await tg.wait_sent(lambda: f"echo: {text}" in tg.sent_texts, 30)

        # warm-up turn per chat (session creation) excluded
        for c in range(chats):
            await tg.message(f"warm {c}", user_id=100 + c)
        await tg.wait_sent(lambda: tg.sent_count >= chats, 60)
        for c in range(chats):
            eve.send_at.pop(f"warm {c}", None)
            eve.completed_at.pop(f"echo: warm {c}", None)
        cpu0 = daemon.cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(chat(c) for c in range(chats)))
        wall = time.perf_counter() - started
        cpu = daemon.cpu_seconds() - cpu0
        ingest, deliver = await measure(tg, eve)
        rss = daemon.rss_peak_kb()
    finally:
        await teardown(daemon, tg, eve)
    baseline = fsync_commit_baseline(state)
    return {"turns": per_chat * chats, "chats": chats, "wall_s": round(wall, 2),
            "cpu_ms_per_turn": round(cpu * 1000 / max(1, per_chat * chats), 3), "rss_peak_mb": round(rss / 1024, 1),
            "ingest_to_eve": dist_ms(ingest), "completed_to_telegram": dist_ms(deliver),
            "fsync_commit_baseline": dist_ms(baseline)}


async def scale(chats: int, rounds: int, profile: str | None = None) -> dict:
    tg, eve, daemon, _, users = await stack(chats, IVA_MAX_TURNS="64")
    await daemon.start(profiled(profile))
    waits: dict[int, list[float]] = {u: [] for u in users}
    try:
        cpu0 = daemon.cpu_seconds()
        for r in range(rounds):
            t0 = {}
            for u in users:
                await tg.message(f"u{u} r{r}", user_id=u)
                t0[u] = time.monotonic()
            await tg.wait_sent(lambda: tg.sent_count >= chats * (r + 1), 600)
            sends = tg.sent_texts
            for u in users:
                waits[u].append(sends[f"echo: u{u} r{r}"] - t0[u])
        cpu = daemon.cpu_seconds() - cpu0
        rss = daemon.rss_peak_kb()
        ingest, deliver = await measure(tg, eve)
    finally:
        await teardown(daemon, tg, eve)
    all_waits = [w for ws in waits.values() for w in ws]
    median = statistics.median(all_waits)
    worst = max(statistics.fmean(ws) for ws in waits.values())
    added = [a + b for a, b in zip(sorted(ingest), sorted(deliver), strict=False)]
    return {"chats": chats, "rounds": rounds, "turns": chats * rounds, "rss_peak_mb": round(rss / 1024, 1),
            "cpu_ms_per_turn": round(cpu * 1000 / (chats * rounds), 3),
            "ingest_to_eve": dist_ms(ingest), "completed_to_telegram": dist_ms(deliver),
            "added_latency_sum_p99_ms": dist_ms(added)["p99"],
            "wait_median_s": round(median, 3), "worst_chat_mean_wait_s": round(worst, 3),
            "fairness_worst_over_median": round(worst / median, 2) if median else None}


async def active(chats: int, spread: float, eve_delay: float, rounds: int, profile: str | None = None,
                 argv: list[str] | None = None, **env: str) -> dict:
    """Benchmark 3 as "active at once": every chat writes once per round at a random moment of
    ``spread`` seconds and eve takes ``eve_delay`` seconds per turn, so with eve_delay ≥ spread all
    chats have a turn in flight at the same time. The added latency is the bridge's own, measured
    while it holds ``chats`` busy chats (open streams, typing, records)."""
    import random

    tg, eve, daemon, _, users = await stack(chats, **{"IVA_MAX_TURNS": str(chats), **env})
    await daemon.start(argv or profiled(profile))
    idle_rss = daemon.rss_peak_kb()
    rng = random.Random(7)
    peak_busy = 0
    try:
        cpu0 = daemon.cpu_seconds()
        t_start = time.monotonic()
        for r in range(rounds):
            schedule = sorted((rng.uniform(0, spread), u) for u in users)
            t0 = time.monotonic()
            for at, u in schedule:
                delay = t0 + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await tg.message(f"u{u} r{r} [[delay={eve_delay}]]", user_id=u)
            peak_busy = max(peak_busy, sum(1 for s in eve.sessions.values() if s.running))
            await tg.wait_sent(lambda: tg.sent_count >= chats * (r + 1), 600)
        wall = time.monotonic() - t_start
        cpu = daemon.cpu_seconds() - cpu0
        rss = daemon.rss_peak_kb()
        ingest, deliver = await measure(tg, eve)
    finally:
        await teardown(daemon, tg, eve)
    added = [a + b for a, b in zip(sorted(ingest), sorted(deliver), strict=False)]
    return {"mode": "active", "chats": chats, "rounds": rounds, "spread_s": spread, "eve_delay_s": eve_delay,
            "turns": chats * rounds, "turns_in_flight_at_peak": peak_busy, "wall_s": round(wall, 1),
            "rss_peak_mb": round(rss / 1024, 1), "rss_started_mb": round(idle_rss / 1024, 1),
            "rss_per_busy_chat_kb": round((rss - idle_rss) / max(1, peak_busy), 1),
            "cpu_ms_per_turn": round(cpu * 1000 / (chats * rounds), 3),
            "ingest_to_eve": dist_ms(ingest), "completed_to_telegram": dist_ms(deliver),
            "added_latency": dist_ms(added), "added_latency_sum_p99_ms": dist_ms(added)["p99"]}


async def versus(runs: int, job: str, args: argparse.Namespace) -> dict:
    """Iva and the forwarder (bench/forwarder.py) alternately, ``runs`` times each, in one run.
    Iva's pacer budgets are opened (``UNPACED``): the forwarder has none, and the fake Bot API
    here has no flood limits — the pacer's waits are Telegram's limits, measured by bench.pacing,
    not the bridge's own cost."""
    from tests.fakes.telegram import UNPACED

    out: dict[str, list[dict]] = {"iva": [], "forwarder": []}
    for _ in range(runs):
        for name, argv in (("iva", None), ("forwarder", FORWARDER)):
            env = {**UNPACED, **({"IVA_STREAMING": args.streaming} if args.streaming else {})}
            if job == "active":
                r = await active(args.active, args.spread, args.eve_delay, args.rounds, argv=argv, **env)
            else:
                r = await sequential(args.turns, args.chats, argv=argv, **env)
            out[name].append(r)
            print(name, json.dumps(r), flush=True)
    return out


async def commits_per_turn(turns: int, chats: int) -> dict:
    """fsync'd commits per one-reply turn: a run with only the warm-up turns, then one with
    ``turns`` more; the difference over ``turns``."""
    import tempfile
    from pathlib import Path

    counts = []
    for n in (0, turns):
        out = Path(tempfile.mkdtemp(prefix="iva-strace-")) / "strace.txt"
        await sequential(n, chats, commits=str(out))
        counts.append(strace_calls(str(out)))
    return {"turns": turns, "chats": chats, "fsyncs_baseline": counts[0], "fsyncs_with_turns": counts[1],
            "commits_per_turn": round((counts[1] - counts[0]) / turns, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--scale", type=int, default=0, help="chats writing at once (benchmark 3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="run the daemon under py-spy; collapsed stacks to this file")
    parser.add_argument("--active", type=int, default=0, help="chats with a turn in flight at once (benchmark 3)")
    parser.add_argument("--spread", type=float, default=30.0)
    parser.add_argument("--eve-delay", type=float, default=30.0)
    parser.add_argument("--commits", action="store_true",
                        help="count fsync'd commits per turn (strace; two runs: start-up only, then --turns)")
    parser.add_argument("--versus", type=int, default=0,
                        help="this many runs each of Iva and the forwarder baseline (bench/forwarder.py), alternately")
    parser.add_argument("--streaming", help="IVA_STREAMING for --versus sequential runs (off, draft, …)")
    args = parser.parse_args()
    if args.versus:
        result = asyncio.run(versus(args.versus, "active" if args.active else "sequential", args))
        print(f"written to {save('versus-active' if args.active else 'versus-latency', result)}")
        return
    if args.commits:
        result = asyncio.run(commits_per_turn(args.turns, args.chats))
        path = save("commits", result)
        rows = [("metric", "value"), ("turns", str(result["turns"])),
                ("fsyncs: start-up + warm-up run", str(result["fsyncs_baseline"])),
                ("fsyncs: the same + turns", str(result["fsyncs_with_turns"])),
                ("commits per one-reply turn", str(result["commits_per_turn"]))]
    elif args.active:
        result = asyncio.run(active(args.active, args.spread, args.eve_delay, args.rounds, args.profile))
        path = save("scale-active", result)
        a, b = result["ingest_to_eve"], result["completed_to_telegram"]
        rows = [("metric", "value", "goal"),
                ("turns in flight at the peak", str(result["turns_in_flight_at_peak"]), f"{args.active}"),
                ("peak RSS", f"{result['rss_peak_mb']} MB", "≤ 150 MB"),
                ("CPU per turn", f"{result['cpu_ms_per_turn']} ms", ""),
                ("update → eve send p50 / p99", f"{a['p50']} / {a['p99']} ms", ""),
                ("completed → sendMessage p50 / p99", f"{b['p50']} / {b['p99']} ms", ""),
                ("p99 added latency (a+b)", f"{result['added_latency_sum_p99_ms']} ms", "≤ 50 ms")]
    elif args.scale:
        result = asyncio.run(scale(args.scale, args.rounds, args.profile))
        path = save("scale", result)
        rows = [("metric", "value", "goal"),
                ("peak RSS", f"{result['rss_peak_mb']} MB", "≤ 150 MB"),
                ("CPU per turn", f"{result['cpu_ms_per_turn']} ms", ""),
                ("p99 added latency (a+b)", f"{result['added_latency_sum_p99_ms']} ms", "≤ 50 ms"),
                ("ingest→eve p99", f"{result['ingest_to_eve']['p99']} ms", ""),
                ("completed→telegram p99", f"{result['completed_to_telegram']['p99']} ms", ""),
                ("fairness worst/median", f"{result['fairness_worst_over_median']}", "≤ 2")]
    else:
        result = asyncio.run(sequential(args.turns, args.chats, args.profile))
        path = save(f"latency-{args.chats}chats", result)
        a, b, base = result["ingest_to_eve"], result["completed_to_telegram"], result["fsync_commit_baseline"]
        rows = [("path", "p50 ms", "p99 ms", "max ms", "goal"),
                ("update → eve send", str(a["p50"]), str(a["p99"]), str(a["max"]), "p50 ≤ 2, p99 ≤ 10"),
                ("completed → sendMessage", str(b["p50"]), str(b["p99"]), str(b["max"]), "p50 ≤ 2, p99 ≤ 10"),
                ("baseline: 1 fsync'd commit", str(base["p50"]), str(base["p99"]), str(base["max"]), "")]
    print(table(rows))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
