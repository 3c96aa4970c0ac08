"""Benchmark 2: durable ingest rate — messages per second committed by one writer.

Same run, same disk, all with WAL and synchronous=FULL, one row per committed transaction:
raw sqlite3; diskqueue.enqueue; the bridge's real ingest transaction (chat row + enqueue +
chat read); persist-queue's SQLiteAckQueue (auto_commit). Rounds are interleaved so a noisy
neighbour hits every contender alike; the median round counts.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import time
from pathlib import Path

from bench.common import save, table, tmpdir


def raw(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS q (id INTEGER PRIMARY KEY, address TEXT, k TEXT UNIQUE, payload TEXT)")
    t0 = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO q (address, k, payload) VALUES (?, ?, ?)", ("1", f"{path.name}:{i}", '{"text":"hello"}'))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return n / elapsed


async def diskqueue_rate(path: Path, n: int) -> float:
    from diskqueue import Database, DiskQueue

    db = await Database(path).open()
    q = DiskQueue(db)
    await q.migrate()
    t0 = time.perf_counter()
    for i in range(n):
        await q.enqueue("1", {"text": "hello"}, dedupe_key=f"tg:1:{i}")
    elapsed = time.perf_counter() - t0
    await db.close()
    return n / elapsed


async def bridge_rate(path: Path, n: int) -> float:
    from bridge.storage.store import Store
    from diskqueue import Database, DiskQueue

    db = await Database(path).open()
    q, store = DiskQueue(db), Store(db)
    await q.migrate()
    await store.migrate()
    t0 = time.perf_counter()
    for i in range(n):
        async with db.transaction():
            await store.touch_chat("1", 1, None, "en")
            await q.enqueue("1", {"text": "hello", "message_id": i}, dedupe_key=f"tg:1:{i}")
            await store.chat("1")
    elapsed = time.perf_counter() - t0
    await db.close()
    return n / elapsed


def persist_queue_rate(path: Path, n: int) -> float:
    from persistqueue import SQLiteAckQueue

    q = SQLiteAckQueue(str(path), auto_commit=True, multithreading=False)
    q._putter.execute("PRAGMA synchronous=FULL")
    t0 = time.perf_counter()
    for _ in range(n):
        q.put({"text": "hello"})
    elapsed = time.perf_counter() - t0
    q.close()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = tmpdir()
    rates: dict[str, list[float]] = {"raw sqlite3": [], "diskqueue.enqueue": [], "bridge ingest transaction": [],
                                     "persist-queue SQLiteAckQueue": []}
    for r in range(args.rounds):
        rates["raw sqlite3"].append(raw(base / f"raw{r}.db", args.n))
        rates["diskqueue.enqueue"].append(asyncio.run(diskqueue_rate(base / f"dq{r}.db", args.n)))
        rates["bridge ingest transaction"].append(asyncio.run(bridge_rate(base / f"br{r}.db", args.n)))
        pq = base / f"pq{r}"
        pq.mkdir()
        rates["persist-queue SQLiteAckQueue"].append(persist_queue_rate(pq, args.n))
    med = {k: statistics.median(v) for k, v in rates.items()}
    raw_rate, pq_rate = med["raw sqlite3"], med["persist-queue SQLiteAckQueue"]
    rows = [("writer", "msgs/s (median)", "vs raw", "vs persist-queue")]
    for k, v in med.items():
        rows.append((k, f"{v:,.0f}", f"{v / raw_rate:.0%}", f"{v / pq_rate:.2f}×"))
    print(table(rows))
    print("goal: diskqueue ≥ 60% of raw and ≥ 1× persist-queue")
    path = save("ingest", {"n": args.n, "rounds": args.rounds, "rates": rates, "median": med,
                           "diskqueue_vs_raw": med["diskqueue.enqueue"] / raw_rate,
                           "diskqueue_vs_persist_queue": med["diskqueue.enqueue"] / pq_rate})
    print(f"written to {path}")


if __name__ == "__main__":
    main()
