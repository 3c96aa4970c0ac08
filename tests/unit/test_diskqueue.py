"""diskqueue: durability, states, dedupe, FIFO claims, guarded acks, recovery."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from diskqueue import Database, DiskQueue, State


@pytest.fixture
async def queue(tmp_path):
    db = await Database(tmp_path / "q.sqlite3").open()
    q = DiskQueue(db)
    await q.migrate()
    try:
        yield q
    finally:
        await db.close()


async def test_new_database_is_wal_with_full_sync(queue):
    assert (await queue.db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    assert (await queue.db.fetchone("PRAGMA synchronous"))[0] == 2  # FULL


async def test_enqueue_is_idempotent_on_the_dedupe_key(queue):
    first = await queue.enqueue("a", {"n": 1}, dedupe_key="tg:1:1")
    again = await queue.enqueue("a", {"n": 1}, dedupe_key="tg:1:1")
    assert first is not None and again is None
    assert await queue.depth("a") == 1


async def test_claim_takes_the_address_fifo_in_one_statement(queue):
    for n in range(5):
        await queue.enqueue("a", {"n": n})
        await queue.enqueue("b", {"n": n})
    got = await queue.claim("a", limit=3, claim="c1")
    assert [m.payload["n"] for m in got] == [0, 1, 2]
    assert all(m.state is State.INFLIGHT and m.claim == "c1" and m.attempts == 0 for m in got)
    assert [m.payload["n"] for m in await queue.claim("a", limit=10)] == [3, 4]
    assert await queue.depth("b") == 5


async def test_failures_are_counted_only_when_the_caller_says_so(queue):
    """F6: a claim counts nothing (a message given back while eve was down has not failed);
    count_failure counts for the claim's in-flight messages and answers the highest count."""
    await queue.enqueue("a", {"n": 1})
    await queue.enqueue("a", {"n": 2})
    first = await queue.claim("a", limit=1, claim="c1")
    assert await queue.count_failure([first[0].id], claim="c1") == 1
    assert await queue.count_failure([first[0].id], claim="other") == 0  # another claim's: untouched
    await queue.nack([first[0].id], claim="c1")
    again = await queue.claim("a", limit=2, claim="c2")
    assert [m.attempts for m in again] == [1, 0]
    assert await queue.count_failure([m.id for m in again], claim="c2") == 2


async def test_acks_are_guarded_and_say_whether_they_applied(queue):
    await queue.enqueue("a", {"n": 1})
    queued = await queue.queued("a")
    assert await queue.ack([queued[0].id]) == 0  # not in flight: refused
    claimed = await queue.claim("a", claim="c1")
    assert await queue.ack([claimed[0].id], claim="other") == 0
    assert await queue.ack([claimed[0].id], claim="c1") == 1
    assert await queue.ack([claimed[0].id], claim="c1") == 0
    assert (await queue.get(claimed[0].id)).state is State.DONE


async def test_requeue_inflight_restores_order(queue):
    for n in range(3):
        await queue.enqueue("a", {"n": n})
    await queue.claim("a", limit=2)
    assert await queue.requeue_inflight("a") == 2
    assert [m.payload["n"] for m in await queue.claim("a", limit=5)] == [0, 1, 2]


async def test_drop_and_remember(queue):
    await queue.enqueue("a", {"n": 1})
    await queue.enqueue("a", {"n": 2})
    assert await queue.drop_queued("a") == 2
    assert await queue.depth("a") == 0
    assert await queue.remember("a", {"cmd": "new"}, dedupe_key="tg:1:9") is True
    assert await queue.remember("a", {"cmd": "new"}, dedupe_key="tg:1:9") is False
    assert await queue.claim("a") == []


async def test_transaction_rolls_back_on_error(queue):
    with pytest.raises(RuntimeError):
        async with queue.db.transaction():
            await queue.enqueue("a", {"n": 1})
            raise RuntimeError("boom")
    assert await queue.depth("a") == 0


async def test_unknown_state_is_rejected(queue):
    row_id = await queue.enqueue("a", {"n": 1})
    await queue.db.execute("UPDATE diskqueue_messages SET state = 9 WHERE id = ?", (row_id,))
    with pytest.raises(ValueError):
        await queue.get(row_id)


def test_writer_killed_mid_transaction_leaves_the_queue_intact(tmp_path):
    """A writer SIGKILLed inside an open transaction: committed rows stay, the open one is gone."""
    path = tmp_path / "q.sqlite3"
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from diskqueue import Database, DiskQueue
        async def main():
            db = await Database({str(path)!r}).open()
            q = DiskQueue(db); await q.migrate()
            await q.enqueue("a", {{"n": "committed"}}, dedupe_key="k1")
            async with db.transaction():
                await q.enqueue("a", {{"n": "open"}}, dedupe_key="k2")
                print("inside", flush=True)
                await asyncio.sleep(60)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "inside"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    rows = conn.execute("SELECT dedupe_key, state FROM diskqueue_messages").fetchall()
    assert rows == [("k1", 0)]
