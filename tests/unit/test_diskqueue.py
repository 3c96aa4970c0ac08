"""diskqueue: durability, states, dedupe, FIFO claims, guarded acks, recovery."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

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


# -- a slow disk (issue 11 §4): a slow fsync never runs on the event loop -------------------------

class Disk:
    """The writer connection's disk as a test wants it, with no real clock involved: a fake
    ``Database.clock`` that each COMMIT moves on by ``fsync_s``; COMMITs held at their start until
    released (``hold``); and the thread each statement ran on — sqlite3's trace callback runs on
    the thread executing the statement, just before it runs. (A COMMIT held on the event loop's
    thread could never be released: the wait has a deadlock breaker, and the test then fails on
    what the loop did not do meanwhile.)"""

    def __init__(self, db: Database, fsync_s: float = 0.0002) -> None:
        self.now = 0.0
        self.fsync_s = fsync_s
        self.hold = False
        self.seen: list[tuple[str, int]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        db.clock = lambda: self.now
        db.conn.set_trace_callback(self._trace)

    def _trace(self, sql: str) -> None:
        verb = sql.split()[0]
        self.seen.append((verb, threading.get_ident()))
        if verb == "COMMIT":
            self.now += self.fsync_s
            if self.hold:
                self.started.set()
                self.release.wait(10)

    def take(self) -> tuple[list[str], list[str]]:
        """(statements run on this thread — the loop's, statements run on another) since the last take."""
        loop = threading.get_ident()
        seen, self.seen = self.seen, []
        return [v for v, t in seen if t == loop], [v for v, t in seen if t != loop]

    async def wait_held(self) -> None:
        await asyncio.to_thread(self.started.wait, 10)


async def _in_transaction(queue: DiskQueue, n: int) -> None:
    async with queue.db.transaction():
        await queue.enqueue("a", {"n": n})


async def _spin(times: int = 20) -> None:
    """Let every runnable task take a few steps (no clock: a task that can go on, goes on)."""
    for _ in range(times):
        await asyncio.sleep(0)


async def _slow(queue: DiskQueue) -> Disk:
    """A disk whose fsync takes 50 ms, found out by one commit on the loop."""
    disk = Disk(queue.db, fsync_s=0.05)
    async with queue.db.transaction():
        pass
    assert disk.take() == (["BEGIN", "COMMIT"], [])  # on the loop, and found slow
    return disk


async def test_commits_leave_the_loop_while_the_disk_is_slow(queue):
    """On a healthy disk every statement runs on the loop's thread, the COMMIT included (the hop
    costs more than a 0.2 ms fsync: benchmarks 2 and 7). A 50 ms commit and the commits — the
    COMMIT, a write outside a transaction — run on the worker thread, the other statements still
    on the loop; after ``slow_hold_s`` one commit on the loop looks again, and a fast disk keeps
    them there."""
    db = queue.db
    disk = Disk(db)
    await _in_transaction(queue, 1)
    assert disk.take() == (["BEGIN", "INSERT", "COMMIT"], [])
    disk.fsync_s = 0.05
    await _in_transaction(queue, 2)  # on the loop: this one finds the disk slow
    assert disk.take() == (["BEGIN", "INSERT", "COMMIT"], [])
    await _in_transaction(queue, 3)
    await queue.enqueue("a", {"n": 4})  # alone: INSERT … RETURNING commits
    assert await queue.depth("a") == 4
    assert disk.take() == (["BEGIN", "INSERT", "SELECT"], ["COMMIT", "INSERT"])
    disk.fsync_s = 0.0002
    disk.now += db.slow_hold_s
    await _in_transaction(queue, 5)  # the look: on the loop, fast
    await _in_transaction(queue, 6)
    assert disk.take() == (["BEGIN", "INSERT", "COMMIT"] * 2, [])


async def test_a_hiccup_is_not_a_slow_disk_but_a_sustained_8_ms_is(queue):
    """One 10 ms commit among fast ones (a shared disk's hiccup) keeps commits on the loop: the
    thread would cost more for the next ten seconds than the hiccup did. Commits of 8 ms in a row
    move them off it after a few."""
    disk = Disk(queue.db)
    for fsync_s in (0.0002, 0.01, 0.0002, 0.0002):
        disk.fsync_s = fsync_s
        await _in_transaction(queue, 0)
    assert "COMMIT" not in disk.take()[1]
    disk.fsync_s = 0.008
    transactions = 0
    while "COMMIT" not in disk.take()[1]:
        await _in_transaction(queue, 0)
        transactions += 1
        assert transactions <= 10, "eight-millisecond commits stayed on the loop"
    assert transactions > 2  # not the first one off the loop: a mean, not a single sample


async def test_a_slow_commit_blocks_neither_the_loop_nor_committed_reads(queue):
    """While a COMMIT waits for a slow disk, the loop goes on, a read in ``committed()`` answers
    at once with the state before that commit, and other writers wait their turn (transactions
    stay serialized); released, both writes land in order."""
    await queue.enqueue("a", {"n": 0})
    disk = await _slow(queue)
    disk.hold = True
    first = asyncio.create_task(_in_transaction(queue, 1))
    await disk.wait_held()
    second = asyncio.create_task(_in_transaction(queue, 2))
    await _spin()
    assert not first.done() and not second.done()  # the loop ran them; both wait on the one commit
    async with queue.db.committed():
        assert await queue.depth("a") == 1  # the last committed state, without the writer's lock
    disk.release.set()
    await asyncio.gather(first, second)
    assert [m.payload["n"] for m in await queue.queued("a")] == [0, 1, 2]
    assert disk.take()[1] == ["COMMIT", "COMMIT"]


async def test_a_transaction_cancelled_in_its_commit_keeps_the_lock_until_the_thread_is_done(queue):
    """Cancelled while its COMMIT runs on the thread (the thread still uses the connection): the
    lock stays held until the commit is done, the commit stands, and the task ends cancelled."""
    disk = await _slow(queue)
    disk.hold = True
    first = asyncio.create_task(_in_transaction(queue, 1))
    await disk.wait_held()
    first.cancel()
    second = asyncio.create_task(_in_transaction(queue, 2))
    await _spin()
    first.cancel()  # twice: it still waits for the thread
    await _spin()
    assert not first.done() and not second.done()
    disk.release.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert [m.payload["n"] for m in await queue.queued("a")] == [1, 2]


async def test_a_failed_commit_leaves_no_transaction_open(tmp_path):
    """A COMMIT that fails (here a deferred foreign key; a full disk or an I/O error alike) can
    leave SQLite's transaction open: it is rolled back, so the next transaction does not fail
    with "cannot start a transaction within a transaction" (nor run inside the failed one)."""
    db = await Database(tmp_path / "fk.sqlite3").open()
    try:
        await db.executescript(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
            "CREATE TABLE child (id INTEGER PRIMARY KEY,"
            " parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);"
        )
        with pytest.raises(sqlite3.IntegrityError):
            async with db.transaction():
                await db.execute("INSERT INTO child (parent) VALUES (42)")
        async with db.transaction():
            await db.execute("INSERT INTO parent (id) VALUES (1)")
        assert [tuple(r) for r in await db.fetchall("SELECT id FROM parent")] == [(1,)]
        assert await db.fetchall("SELECT * FROM child") == []
    finally:
        await db.close()
