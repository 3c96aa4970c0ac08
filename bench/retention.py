"""Benchmark 7: the state database's size per 1 000 messages, and what retention (F7) does to it.

The real daemon against the fakes: ``--chats`` people write ``--messages`` messages in all (each
waits for its answer, so every message is one turn and one reply), each ``--chars`` characters,
eve answering ``--reply-chars`` characters. Then, with the daemon stopped, the file is measured
(main file + WAL after ``wal_checkpoint(TRUNCATE)``; the pages in use; per table via ``dbstat``)
and:

1. retention runs as it would ``IVA_RETENTION_DAYS`` + 1 days later (``bridge.storage.retention.prune``,
   500 rows per transaction), timed, and the file is measured again;
2. the daemon writes the same number of messages again on the pruned file (steady state: the
   freed pages are reused); for comparison, a fresh stack writes both batches with no retention
   in between.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from bench.common import Daemon, FakeEve, FakeTelegram, save, stack, table, teardown

DAY = 86_400.0
WORDS = ("the quick brown fox jumps over a lazy dog while eve keeps the whole conversation in mind "
         "and the bridge writes every message to disk before it says it has it ").split()


def text_of(n: int, chars: int, tag: str) -> str:
    out = f"{tag} {n}:"
    i = n
    while len(out) < chars:
        out += " " + WORDS[i % len(WORDS)]
        i += 7
    return out[:chars]


def reply(text: str, chars: int = 800) -> str:
    """What the fake eve answers (set in :func:`bench`): the message's start, then words."""
    return f"re {text[:40]} " + text_of(len(text), chars, "answer")


def measure(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        by_table: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
            by_table[name] = int(size)
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("diskqueue_messages", "outbox", "prompts", "chats")}
    finally:
        conn.close()
    wal = Path(f"{path}-wal")
    return {"file_bytes": path.stat().st_size + (wal.stat().st_size if wal.exists() else 0),
            "used_bytes": (pages - free) * page, "free_pages": free, "page_size": page,
            "by_table": dict(sorted(by_table.items(), key=lambda kv: -kv[1])), "rows": rows}


async def write(tg: FakeTelegram, users: list[int], messages: int, chars: int, reply_chars: int,
                first: int) -> float:
    """``messages`` messages spread over the users, each waiting for its answer; returns seconds."""
    per_user = messages // len(users)

    async def person(u: int) -> None:
        for k in range(per_user):
            text = text_of(first + k, chars, f"u{u}")
            await tg.message(text, user_id=u)
            await tg.wait_sent(lambda text=text: reply(text, reply_chars) in tg.sent_texts, 120)

    started = time.perf_counter()
    await asyncio.gather(*(person(u) for u in users))
    return time.perf_counter() - started


async def run_daemon(tg: FakeTelegram, eve: FakeEve, state: Path, users: list[int], messages: int, chars: int,
                     reply_chars: int, first: int) -> float:
    daemon = Daemon(tg, eve, state, IVA_ALLOWED_USER_IDS=",".join(map(str, users)))
    await daemon.start()
    try:
        return await write(tg, users, messages, chars, reply_chars, first)
    finally:
        await daemon.stop()


async def prune(path: Path, days: int) -> dict[str, Any]:
    from bridge.storage import retention
    from bridge.storage.store import Store
    from diskqueue import Database, DiskQueue

    db = await Database(path).open()
    queue, store = DiskQueue(db), Store(db)
    statements: list[float] = []

    def timed(fn: Any) -> Any:
        async def call(**kwargs: Any) -> int:
            t0 = time.perf_counter()
            try:
                return int(await fn(**kwargs))
            finally:
                statements.append(time.perf_counter() - t0)
        return call

    queue.prune = timed(queue.prune)  # type: ignore[method-assign]
    store.prune_outbox = timed(store.prune_outbox)  # type: ignore[method-assign]
    store.prune_prompts = timed(store.prune_prompts)  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        pruned = await retention.prune(queue, store, days=days, now=time.time() + (days + 1) * DAY)
        seconds = time.perf_counter() - t0
    finally:
        await db.close()
    return {"queue_rows": pruned.queue, "outbox_rows": pruned.outbox, "prompts": pruned.prompts,
            "transactions": len(statements), "seconds": round(seconds, 3),
            "longest_delete_ms": round(max(statements) * 1000, 2)}


async def bench(messages: int, chats: int, chars: int, reply_chars: int, days: int) -> dict[str, Any]:
    tg, eve, daemon, state, users = await stack(chats)
    eve.reply_for = lambda text: reply(text, reply_chars)
    path = state / "iva.sqlite3"
    try:
        await daemon.start()  # the schema only
        await daemon.stop()
        empty = measure(path)
        first = await run_daemon(tg, eve, state, users, messages, chars, reply_chars, 0)
        before = measure(path)
        pruned = await prune(path, days)
        after = measure(path)
        await run_daemon(tg, eve, state, users, messages, chars, reply_chars, messages)
        steady = measure(path)
    finally:
        await teardown(daemon, tg, eve)
    # The same two batches on a fresh stack, without retention in between.
    tg, eve, daemon, state, users = await stack(chats)
    eve.reply_for = lambda text: reply(text, reply_chars)
    try:
        await run_daemon(tg, eve, state, users, messages, chars, reply_chars, 0)
        await run_daemon(tg, eve, state, users, messages, chars, reply_chars, messages)
        kept = measure(state / "iva.sqlite3")
    finally:
        await teardown(daemon, tg, eve)
    per_1000 = 1000 / messages
    grown = before["file_bytes"] - empty["file_bytes"]
    return {"messages": messages, "chats": chats, "chars": chars, "reply_chars": reply_chars, "days": days,
            "write_seconds": round(first, 1), "empty": empty, "before_prune": before, "prune": pruned,
            "after_prune": after, "second_batch_on_pruned": steady, "second_batch_without_retention": kept,
            "growth_bytes_per_1000": round(grown * per_1000),
            "used_bytes_per_1000": round((before["used_bytes"] - empty["used_bytes"]) * per_1000)}


def mb(n: int) -> str:
    return f"{n / 1_000_000:.2f} MB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--chars", type=int, default=200, help="characters per message")
    parser.add_argument("--reply-chars", type=int, default=800, help="characters per answer")
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--name", default="retention")
    args = parser.parse_args()
    r = asyncio.run(bench(args.messages, args.chats, args.chars, args.reply_chars, args.days))
    rows = [("state", "file (main + WAL)", "pages in use", "queue rows", "outbox rows")]
    for label, key in (("empty (schema)", "empty"), (f"after {args.messages} messages", "before_prune"),
                       ("after retention", "after_prune"),
                       (f"+{args.messages} more, pruned file", "second_batch_on_pruned"),
                       (f"{2 * args.messages} messages, no retention", "second_batch_without_retention")):
        m = r[key]
        rows.append((label, mb(m["file_bytes"]), mb(m["used_bytes"]), str(m["rows"]["diskqueue_messages"]),
                     str(m["rows"]["outbox"])))
    print(table(rows))
    print(f"growth per 1 000 messages: {mb(r['growth_bytes_per_1000'])} (file), "
          f"{mb(r['used_bytes_per_1000'])} (pages in use)")
    print(f"prune: {r['prune']}")
    print("by table after the first batch:", {k: mb(v) for k, v in r["before_prune"]["by_table"].items()})
    path = save(args.name, r)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
