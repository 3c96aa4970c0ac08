"""Commit, then send, once (issue 35): the database's after-commit hook, and the outbox sending
what a transaction wrote only after that transaction committed — never before, never after a
rollback, and with no flush called by the writer."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bridge.chat.outbox import Outbox
from bridge.storage import outbox as outbox_rows
from bridge.storage.store import Outgoing, Store
from diskqueue import Database


@pytest.fixture
async def db(tmp_path: Path) -> Any:
    database = await Database(tmp_path / "state.sqlite3").open()
    try:
        yield database
    finally:
        await database.close()


def _committed(path: Path) -> int:
    """Rows of ``t`` another connection sees: what is committed."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])
    finally:
        conn.close()


async def test_a_callback_runs_after_the_outermost_commit_and_sees_it_committed(db: Database) -> None:
    """Registered in a nested block, the callback waits for the outermost COMMIT; when it runs,
    another connection sees the write."""
    await db.execute("CREATE TABLE t (x INTEGER)")
    seen: list[int] = []

    async def look() -> None:
        seen.append(_committed(db.path))

    async with db.transaction():
        await db.execute("INSERT INTO t VALUES (1)")
        async with db.transaction():  # nested: part of the outer one
            await db.after_commit(look)
        assert seen == []  # the nested block's end is no commit
        await db.execute("INSERT INTO t VALUES (2)")
        assert seen == []
    assert seen == [2]


async def test_a_rolled_back_transaction_drops_its_callbacks(db: Database) -> None:
    """Nothing registered in a transaction that rolls back ever runs, nor leaks into the next one."""
    await db.execute("CREATE TABLE t (x INTEGER)")
    ran: list[str] = []

    async def note(name: str) -> None:
        ran.append(name)

    with pytest.raises(RuntimeError):
        async with db.transaction():
            await db.execute("INSERT INTO t VALUES (1)")
            await db.after_commit(lambda: note("rolled back"))
            raise RuntimeError("boom")
    async with db.transaction():
        await db.execute("INSERT INTO t VALUES (2)")
    assert ran == [] and _committed(db.path) == 1


async def test_outside_a_transaction_the_callback_runs_at_once(db: Database) -> None:
    """A write outside a transaction committed by itself: its callback runs right away."""
    await db.execute("CREATE TABLE t (x INTEGER)")
    ran: list[int] = []

    async def look() -> None:
        ran.append(_committed(db.path))

    await db.execute("INSERT INTO t VALUES (1)")
    await db.after_commit(look)
    assert ran == [1]


async def test_one_callback_per_key_in_the_order_first_registered(db: Database) -> None:
    """A key runs once per transaction, at the place it was first registered."""
    ran: list[str] = []

    def note(name: str) -> Any:
        async def run() -> None:
            ran.append(name)
        return run

    async with db.transaction():
        await db.after_commit(note("a1"), key="a")
        await db.after_commit(note("b"), key="b")
        await db.after_commit(note("a2"), key="a")
        await db.after_commit(note("unkeyed"))
    assert ran == ["a1", "b", "unkeyed"]


class _Sender:
    """Records each delivery with how many outbox rows another connection saw committed then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sent: list[tuple[str, int]] = []

    async def deliver(self, out: Outgoing) -> None:
        conn = sqlite3.connect(self.path)
        try:
            committed = int(conn.execute("SELECT count(*) FROM outbox WHERE key = ?", (out.key,)).fetchone()[0])
        finally:
            conn.close()
        self.sent.append((out.text, committed))


async def _outbox(tmp_path: Path) -> tuple[Store, _Sender, list[Any]]:
    db = await Database(tmp_path / "iva.sqlite3").open()
    store = Store(db)
    await store.migrate()
    sender = _Sender(db.path)
    spawned: list[Any] = []
    Outbox(store, sender, transitions=None, spawn=spawned.append)  # type: ignore[arg-type]
    return store, sender, spawned


async def test_a_reply_in_a_rolled_back_transaction_is_never_sent(tmp_path: Path) -> None:
    """The row and its send go together: a rollback leaves neither."""
    store, sender, spawned = await _outbox(tmp_path)
    try:
        with pytest.raises(RuntimeError):
            async with store.db.transaction():
                await store.put_outgoing("1", "k1", 1, None, "never")
                raise RuntimeError("the transition failed")
        async with store.db.transaction():  # the next commit sends nothing of it either
            await store.touch_chat("1", 1, None, "en")
        assert sender.sent == [] and spawned == []
        assert await store.pending_outgoing("1") == []
    finally:
        await store.db.close()


async def test_a_reply_in_a_committed_transaction_is_sent_after_the_commit_without_a_flush(tmp_path: Path) -> None:
    """No flush is called: the commit sends it, and the sender finds it committed when it sends;
    nothing is sent while the transaction is open."""
    store, sender, _ = await _outbox(tmp_path)
    try:
        async with store.db.transaction():
            await store.put_outgoing("1", "k1", 1, None, "hello")
            await store.put_outgoing("1", "k2", 1, None, "again")
            assert sender.sent == []  # not before the commit
        assert sender.sent == [("hello", 1), ("again", 1)]
    finally:
        await store.db.close()


async def test_a_reply_written_outside_a_transaction_is_sent(tmp_path: Path) -> None:
    """Autocommit: the write commits by itself, and is sent then."""
    store, sender, _ = await _outbox(tmp_path)
    try:
        await store.put_outgoing("1", "k1", 1, None, "alone")
        assert sender.sent == [("alone", 1)]
    finally:
        await store.db.close()


async def test_a_detached_writer_hands_the_send_to_a_task_after_the_commit(tmp_path: Path) -> None:
    """Ingest, a push, a reminder: the send is spawned after the commit (never before), and the
    writer does not wait for it."""
    store, sender, spawned = await _outbox(tmp_path)
    try:
        with outbox_rows.detached():
            async with store.db.transaction():
                await store.put_outgoing("1", "k1", 1, None, "later")
                assert spawned == []
        assert len(spawned) == 1 and sender.sent == []
        await spawned[0]
        assert sender.sent == [("later", 1)]
    finally:
        await store.db.close()
