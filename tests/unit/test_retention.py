"""F7 (issue 11): retention on the real store on a temp file, with a fixed "now".

Old finished rows go (done and dropped queue rows with their texts and dedupe marks, sent and
failed outbox rows, closed prompts); everything else stays byte for byte: young rows, live rows
whatever their age (queued messages, pending replies, open prompts) and whatever a busy period
that is still running may read (the queue rows under its claim, the outbox rows written since it
began, the prompts of its session).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from bridge.chat.transitions import Transitions
from bridge.config import ConfigError, Settings
from bridge.storage import retention
from bridge.storage.payloads import QueuedMessage
from bridge.storage.state import StateCorrupt
from bridge.storage.store import Store
from diskqueue import Database, DiskQueue
from eve_client import Position
from tests.harness import KillingDatabase, open_store

NOW = 1_900_000_000.0
DAY = 86_400.0
DAYS = 14
IDLE, BUSY = "1", "2"


def _msg(n: int, text: str) -> dict[str, Any]:
    return QueuedMessage(text=text, message_id=n, user_id=1, user_name="Ann", owner=True, private=True).to_payload()


async def _age(db: Database, sql: str, days_ago: float, *params: Any) -> None:
    """Backdate rows (the store's methods stamp time.time()): ``sql`` uses ``:t`` for the time."""
    at = NOW - days_ago * DAY
    assert await db.execute(sql.replace(":t", "?"), (*[at] * sql.count(":t"), *params)) >= 1


async def _done(queue: DiskQueue, address: str, n: int, text: str, days_ago: float) -> int:
    row = await queue.enqueue(address, _msg(n, text), dedupe_key=f"tg:{address}:{n}")
    assert row is not None
    claimed = await queue.claim(address, claim=f"c{n}")
    assert [m.id for m in claimed] == [row]
    assert await queue.ack([row], claim=f"c{n}") == 1
    await _age(queue.db, "UPDATE diskqueue_messages SET enqueued_at = :t, claimed_at = :t, finished_at = :t "
               "WHERE id = ?", days_ago, row)
    return row


def _snapshot(path: Path) -> dict[str, dict[int, tuple[Any, ...]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: {r[0]: tuple(r) for r in conn.execute(f"SELECT rowid, * FROM {t}")} for t in tables}
    finally:
        conn.close()


async def _build(queue: DiskQueue, store: Store) -> dict[str, set[int]]:
    """Old, young and live rows of an idle chat and a busy one; returns the ids that must go."""
    gone: dict[str, set[int]] = {"diskqueue_messages": set(), "outbox": set(), "prompts": set()}
    tr = Transitions(store, queue, clock=lambda: NOW)
    db = store.db
    # -- the idle chat ------------------------------------------------------------------------
    await tr.touch(IDLE, 1, None, "en")
    for n in range(1, 8):  # more than one batch of old done messages (the test's batch is 3)
        gone["diskqueue_messages"].add(await _done(queue, IDLE, n, f"old text {n}", 20))
    await _done(queue, IDLE, 20, "young text", 2)  # within the window: kept
    await _done(queue, IDLE, 21, "just inside", DAYS - 0.01)
    gone["diskqueue_messages"].add(await _done(queue, IDLE, 22, "just outside", DAYS + 0.01))
    # dedupe marks of updates handled on the spot (a command, a refusal)
    assert await queue.remember(IDLE, {"kind": "command", "command": "help"}, dedupe_key="tg:1:30")
    assert await queue.remember(IDLE, {"kind": "refused"}, dedupe_key="tg:1:31")
    await _age(db, "UPDATE diskqueue_messages SET enqueued_at = :t, finished_at = :t WHERE dedupe_key = ?",
               30, "tg:1:30")
    gone["diskqueue_messages"] |= {r["id"] for r in await db.fetchall(
        "SELECT id FROM diskqueue_messages WHERE dedupe_key = 'tg:1:30'")}
    await _age(db, "UPDATE diskqueue_messages SET enqueued_at = :t, finished_at = :t WHERE dedupe_key = ?",
               0.5, "tg:1:31")
    # dropped by a /new, long ago
    dropped = await queue.enqueue(IDLE, _msg(40, "dropped text"), dedupe_key="tg:1:40")
    assert dropped is not None and await queue.drop_queued(IDLE) == 1
    await _age(db, "UPDATE diskqueue_messages SET enqueued_at = :t, finished_at = :t WHERE id = ?", 20, dropped)
    gone["diskqueue_messages"].add(dropped)
    # a message that has waited 30 days (eve down a month): not finished, kept
    waiting = await queue.enqueue(IDLE, _msg(41, "still waiting"), dedupe_key="tg:1:41")
    await _age(db, "UPDATE diskqueue_messages SET enqueued_at = :t WHERE id = ?", 30, waiting)
    # outbox: sent and failed long ago go; pending (whatever its age) and young stay
    for key, state, days_ago in (("old-sent", "sent", 20), ("old-failed", "failed", 20),
                                 ("old-pending", None, 20), ("young-sent", "sent", 1)):
        assert await store.put_outgoing(IDLE, key, 1, None, f"reply {key}")
        row = await db.fetchone("SELECT id FROM outbox WHERE key = ?", (key,))
        assert row is not None
        if state is not None:
            await store.finish_outgoing(row["id"], state)
            await _age(db, "UPDATE outbox SET created_at = :t, sent_at = :t WHERE id = ?", days_ago, row["id"])
        else:
            await _age(db, "UPDATE outbox SET created_at = :t WHERE id = ?", days_ago, row["id"])
        if days_ago > DAYS and state is not None:
            gone["outbox"].add(row["id"])
    # prompts: closed long ago goes; open (whatever its age) stays
    closed = await store.add_prompt(IDLE, "sess-old", "r1", ["yes"], chat_id=1, askers=[1])
    await store.close_prompts("sess-old")
    opened = await store.add_prompt(IDLE, "sess-idle", "r2", ["yes"], chat_id=1, askers=[1])
    for prompt in (closed, opened):
        await _age(db, "UPDATE prompts SET created_at = :t WHERE id = ?", 20, prompt)
    gone["prompts"].add(closed)
    # -- the busy chat: a turn waiting on the person for 20 days ------------------------------
    await tr.touch(BUSY, 2, None, "en")
    assert await store.put_outgoing(BUSY, "before-the-turn", 2, None, "an old reply")
    before_turn = await db.fetchone("SELECT id FROM outbox WHERE key = 'before-the-turn'")
    assert before_turn is not None
    await store.finish_outgoing(before_turn["id"])
    await _age(db, "UPDATE outbox SET created_at = :t, sent_at = :t WHERE id = ?", 25, before_turn["id"])
    gone["outbox"].add(before_turn["id"])
    await queue.enqueue(BUSY, _msg(1, "the busy turn's message"), dedupe_key="tg:2:1")
    claim = await tr.claim_turn(BUSY, limit=10)
    assert claim is not None
    await tr.session_opened(BUSY, claim.claim, "sess-busy")
    await tr.delivered(BUSY, claim.claim, "d1")
    await tr.waiting_on_person(BUSY, claim.claim, waiting=True, cursor=Position(3))
    await _age(db, "UPDATE chats SET busy_since = :t, progress_at = :t WHERE address = ?", 20, BUSY)
    await _age(db, "UPDATE diskqueue_messages SET enqueued_at = :t, claimed_at = :t WHERE dedupe_key = ?",
               20, "tg:2:1")
    # a row finished under the running claim (a stale button press acked by the claim)
    stale = await queue.enqueue(BUSY, {"kind": "input", "request_id": "x", "option_id": "y"}, dedupe_key="cb:9")
    assert stale is not None
    await db.execute("UPDATE diskqueue_messages SET state = 2, claim = ?, finished_at = ? WHERE id = ?",
                     (claim.claim, NOW - 19 * DAY, stale))
    assert await store.put_outgoing(BUSY, "in-the-turn", 2, None, "the turn's reply")
    in_turn = await db.fetchone("SELECT id FROM outbox WHERE key = 'in-the-turn'")
    assert in_turn is not None
    await store.finish_outgoing(in_turn["id"])
    await _age(db, "UPDATE outbox SET created_at = :t, sent_at = :t WHERE id = ?", 19, in_turn["id"])
    question = await store.add_prompt(BUSY, "sess-busy", "q0", ["a"], chat_id=2, askers=[1])
    await store.close_prompts("sess-busy", ("q0",))  # answered earlier in the same turn
    await _age(db, "UPDATE prompts SET created_at = :t WHERE id = ?", 19, question)
    return gone


async def test_retention_prunes_exactly_the_old_finished_rows(tmp_path: Path) -> None:
    path = tmp_path / "iva.sqlite3"
    db, queue, store = await open_store(path)
    try:
        gone = await _build(queue, store)
        before = _snapshot(path)
        batches: list[int] = []
        prune_queue = queue.prune

        async def counted(**kwargs: Any) -> int:
            batches.append(await prune_queue(**kwargs))
            return batches[-1]

        queue.prune = counted  # type: ignore[method-assign]
        pruned = await retention.prune(queue, store, days=DAYS, now=NOW, batch=3)
        after = _snapshot(path)
        assert (pruned.queue, pruned.outbox, pruned.prompts) == (
            len(gone["diskqueue_messages"]), len(gone["outbox"]), len(gone["prompts"]))
        assert max(batches) <= 3 and len(batches) > 2  # bounded transactions, several of them
        for table, rows in before.items():
            expected = {rowid: row for rowid, row in rows.items() if rowid not in gone.get(table, set())}
            assert after[table] == expected, table
        assert gone["diskqueue_messages"] <= set(before["diskqueue_messages"])
        # no old text is left anywhere in the file's tables
        assert not any("old text" in str(row) or "dropped text" in str(row)
                       for rows in after.values() for row in rows.values())
        # dedupe: a young update is still refused; an old one's mark is gone with it (past the
        # 24 h Telegram redelivers in, nothing can bring it back)
        assert await queue.enqueue(IDLE, _msg(20, "again"), dedupe_key="tg:1:20") is None
        assert not await queue.remember(IDLE, {"kind": "refused"}, dedupe_key="tg:1:31")
        assert await queue.enqueue(IDLE, _msg(1, "again"), dedupe_key="tg:1:1") is not None
        # a second run finds nothing more
        again = await retention.prune(queue, store, days=DAYS, now=NOW, batch=3)
        assert again.rows == 0
    finally:
        await db.close()


async def test_once_the_busy_period_ends_its_rows_age_out_too(tmp_path: Path) -> None:
    path = tmp_path / "iva.sqlite3"
    db, queue, store = await open_store(path)
    try:
        await _build(queue, store)
        await retention.prune(queue, store, days=DAYS, now=NOW)
        chat = await store.chat(BUSY)
        assert chat is not None and chat.claim is not None
        tr = Transitions(store, queue, clock=lambda: NOW)
        await tr.park(BUSY, chat.claim, cursor=Position(9), measurement=None, threshold=100_000, may_compact=False)
        await db.execute("UPDATE diskqueue_messages SET finished_at = ? WHERE address = ?", (NOW - 19 * DAY, BUSY))
        pruned = await retention.prune(queue, store, days=DAYS, now=NOW)
        assert (pruned.queue, pruned.outbox, pruned.prompts) == (2, 1, 1)
        assert await db.fetchall("SELECT * FROM diskqueue_messages WHERE address = ?", (BUSY,)) == []
    finally:
        await db.close()


async def test_an_incrementally_vacuumed_file_gives_the_pages_back(tmp_path: Path) -> None:
    path = tmp_path / "iva.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table: the file is made so
    conn.close()
    db, queue, store = await open_store(path)
    try:
        for n in range(300):
            assert await queue.remember(IDLE, {"kind": "refused", "pad": "x" * 2000}, dedupe_key=f"tg:1:{n}")
        await db.execute("UPDATE diskqueue_messages SET finished_at = ?", (NOW - 20 * DAY,))
        pages = (await db.fetchone("PRAGMA page_count"))[0]  # type: ignore[index]
        pruned = await retention.prune(queue, store, days=DAYS, now=NOW)
        assert pruned.queue == 300 and pruned.freed_pages > 100
        assert (await db.fetchone("PRAGMA page_count"))[0] < pages - 100  # type: ignore[index]
        assert (await db.fetchone("PRAGMA freelist_count"))[0] == 0  # type: ignore[index]
    finally:
        await db.close()


async def test_retention_below_a_day_is_refused() -> None:
    with pytest.raises(ValueError):
        await retention.prune(None, None, days=0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("raw", "days"), [(None, 14), ("7", 7), ("1", 1), ("0", None), ("off", None),
                                           ("OFF", None), ("365", 365)])
def test_iva_retention_days(raw: str | None, days: int | None) -> None:
    env = {"IVA_TELEGRAM_TOKEN": "123456:" + "a" * 30, "IVA_EVE_URL": "http://127.0.0.1:1", "IVA_OWNER_IDS": "1"}
    if raw is not None:
        env["IVA_RETENTION_DAYS"] = raw
    assert Settings.from_env(env).retention_days == days


@pytest.mark.parametrize("raw", ["0.5", "-1", "a week", "1.5"])
def test_iva_retention_days_refuses_less_than_a_day_or_nonsense(raw: str) -> None:
    env = {"IVA_TELEGRAM_TOKEN": "123456:" + "a" * 30, "IVA_EVE_URL": "http://127.0.0.1:1", "IVA_OWNER_IDS": "1",
           "IVA_RETENTION_DAYS": raw}
    with pytest.raises(ConfigError, match="IVA_RETENTION_DAYS"):
        Settings.from_env(env)


async def test_a_failed_prune_is_retried_and_never_stops_the_bridge(tmp_path: Path) -> None:
    """A lock held for long or a full disk during a prune: logged, tried again next time."""
    db, queue, store = await open_store(tmp_path / "iva.sqlite3")
    try:
        await _done(queue, IDLE, 1, "old text", 20)
        assert isinstance(db, KillingDatabase)
        db.failing["DELETE FROM diskqueue_messages"] = 2  # "database is locked", twice
        task = asyncio.create_task(retention.run(queue, store, days=DAYS, interval=0.01, clock=lambda: NOW))
        for _ in range(500):
            if not await db.fetchall("SELECT id FROM diskqueue_messages"):
                break
            await asyncio.sleep(0.01)
        assert not task.done()
        assert db.failing["DELETE FROM diskqueue_messages"] == 0
        assert await db.fetchall("SELECT id FROM diskqueue_messages") == []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await db.close()


async def test_a_corrupt_file_found_by_a_prune_stops_the_bridge(tmp_path: Path) -> None:
    """F2: corruption is not swallowed as a failed prune: StateCorrupt, as ingest raises it."""
    db, queue, store = await open_store(tmp_path / "iva.sqlite3")
    try:
        async def malformed(**_: Any) -> int:
            raise sqlite3.DatabaseError("database disk image is malformed")

        queue.prune = malformed  # type: ignore[method-assign]
        with pytest.raises(StateCorrupt):
            await asyncio.wait_for(retention.run(queue, store, days=DAYS, interval=0.01, clock=lambda: NOW), 5)
    finally:
        await db.close()
