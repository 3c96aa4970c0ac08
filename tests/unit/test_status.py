"""Issue 15: ``iva status`` reads the state database read-only — while another connection holds
the write lock (as the daemon does mid-transaction) — and shows busy chats with their kind and
age, queue depth, pending replies and the last recorded error, as a table or as JSON."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from contextlib import redirect_stdout
from pathlib import Path

from bridge.chat.transitions import Transitions
from bridge.cli import main
from bridge.storage.payloads import QueuedMessage
from bridge.storage.state import open_state

BUSY, WAITING, BLOCKED, QUIET = "101", "202", "303", "404"


async def _build(state_dir: Path) -> Path:
    """Four chats: one busy with a turn and a message waiting behind it, one with a reply pending
    and one given up on, one blocked, one idle with nothing to show."""
    state_dir.mkdir()
    opened = await open_state(state_dir / "iva.sqlite3")
    tr = Transitions(opened.store, opened.queue)
    try:
        for address in (BUSY, WAITING, BLOCKED, QUIET):
            await opened.store.touch_chat(address, int(address), None, "en")
        for n in (1, 2):
            msg = QueuedMessage(text=f"m{n}", message_id=n, user_id=1, user_name="Ann", owner=True, private=True)
            await opened.queue.enqueue(BUSY, msg.to_payload(), dedupe_key=f"tg:{BUSY}:{n}")
        claim = await tr.claim_turn(BUSY, limit=1)
        assert claim is not None
        await opened.store.update_chat(BUSY, busy_since=time.time() - 125, progress_at=time.time() - 5)
        await opened.store.put_outgoing(WAITING, "k0", int(WAITING), None, "lost")
        await opened.store.put_outgoing(WAITING, "k1", int(WAITING), None, "hello")
        lost = next(o for o in await opened.store.pending_outgoing(WAITING) if o.key == "k0")
        await opened.store.finish_outgoing(lost.id, "failed")
        await opened.store.block_chat(int(BLOCKED), "Forbidden: bot was blocked by the user")
    finally:
        await opened.db.close()
    return state_dir / "iva.sqlite3"


def _run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["status", *argv])
    print(out.getvalue())  # shown with -s: what an operator sees
    return code, out.getvalue()


async def test_status_reads_while_another_connection_holds_the_write_lock(tmp_path: Path):
    db = await _build(tmp_path / "state")
    writer = sqlite3.connect(db, isolation_level=None, timeout=0.1)
    writer.execute("BEGIN IMMEDIATE")  # the daemon mid-transaction: nobody else may write now
    writer.execute("UPDATE chats SET lang = 'ru' WHERE address = ?", (QUIET,))
    before = db.stat().st_mtime_ns, sorted(p.name for p in db.parent.iterdir())
    try:
        [(busy_since,)] = writer.execute("SELECT busy_since FROM chats WHERE address = ?", (BUSY,)).fetchall()
        before_run = time.time()
        code, out = _run("--state", str(db.parent), "--json")
        after_run = time.time()
        assert code == 0, out
        code_t, table = _run("--state", str(db.parent))
        assert code_t == 0, table
        assert (db.stat().st_mtime_ns, sorted(p.name for p in db.parent.iterdir())) == before  # wrote nothing
        assert writer.in_transaction  # the lock was held throughout
    finally:
        writer.execute("ROLLBACK")
        writer.close()

    snap = json.loads(out)
    chats = {c["address"]: c for c in snap["chats"]}
    assert set(chats) == {BUSY, WAITING, BLOCKED}  # the quiet chat has nothing to show
    busy = chats[BUSY]
    assert (busy["status"], busy["kind"], busy["queued"], busy["in_flight"]) == ("busy", "turn", 1, 1)
    # The time busy as of the run, read between the clock before and after it (before: a fixed
    # window, 120 ≤ s < 200, which a slow enough run would leave).
    assert before_run - busy_since - 1 <= busy["busy_for_s"] <= after_run - busy_since + 1
    assert busy["overdue"] is False
    assert chats[WAITING]["replies_pending"] == 1 and chats[WAITING]["oldest_pending_reply_s"] is not None
    assert chats[WAITING]["last_error"].startswith("a reply was given up on")
    assert chats[BLOCKED]["last_error"] == "blocked: Forbidden: bot was blocked by the user"
    assert (snap["busy_chats"], snap["queued"], snap["replies_pending"], snap["chats_known"]) == (1, 1, 1, 4)

    lines = table.splitlines()
    assert "4 chats, 1 busy, 1 messages waiting, 1 replies pending" in lines[0]
    row = next(x for x in lines if x.startswith(BUSY))
    assert "turn" in row and "2m" in row and "1 +1 in turn" in row
    assert "blocked: Forbidden" in next(x for x in lines if x.startswith(BLOCKED))


async def test_status_uses_iva_state_dir_and_names_a_missing_database(tmp_path: Path, monkeypatch, capsys):
    db = await _build(tmp_path / "state")
    monkeypatch.setenv("IVA_STATE_DIR", str(db.parent))
    code, out = _run("--json")
    assert code == 0 and json.loads(out)["chats_known"] == 4
    monkeypatch.setenv("IVA_STATE_DIR", str(tmp_path / "nowhere"))
    code, out = _run()
    assert code == 1 and "no state database at" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()  # read-only: nothing created


def test_status_on_a_database_not_migrated_yet_says_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """An operator runs `iva status` after an upgrade, before the daemon's first start migrated
    the database: one line naming the schema and what to do, never a traceback (review)."""
    from bridge.storage.schema import _MIGRATIONS
    from diskqueue._queue import _SCHEMA

    db = tmp_path / "iva.sqlite3"
    conn = sqlite3.connect(db)
    conn.executescript(_SCHEMA)
    conn.executescript(_MIGRATIONS[1])  # an Iva from before compactions and the notebook (schema 1)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO chats (address, chat_id, created_at, updated_at) VALUES ('42', 42, ?, ?)",
                 (time.time(), time.time()))
    conn.commit()
    conn.close()
    assert main(["status", "--state", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "schema 1, older than this Iva's" in err and "start the bridge once" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


async def test_status_lists_due_and_paused_reminders(tmp_path: Path):
    """W7: a reminder due and not fired (the daemon is not running) and one paused by a blocked
    chat are listed, with the count and the next instant; an upcoming one is only counted."""
    from bridge.push.reminders import Reminders
    from bridge.push.turns import Pushes

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    opened = await open_state(state_dir / "iva.sqlite3")
    now = [time.time()]
    try:
        for address in (BUSY, BLOCKED):
            await opened.store.touch_chat(address, int(address), None, "en")
        pushes = Pushes(opened.db, opened.queue, opened.store, wake=lambda _: None)
        reminders = Reminders(opened.db, opened.store, pushes, clock=lambda: now[0])
        due = await reminders.set(BUSY, "water the plants", at=_iso(now[0] + 60))
        await reminders.set(BUSY, "much later", at=_iso(now[0] + 86_400))
        paused = await reminders.set(BLOCKED, "call mum", cron="0 9 * * *")
        await opened.store.block_chat(int(BLOCKED), "Forbidden: bot was blocked by the user")
    finally:
        await opened.db.close()
    _, text = _run("--state", str(state_dir))
    assert "reminders: 3 active" in text and "0 due" in text and "1 paused" in text
    assert f"paused {paused.id}  chat {BLOCKED}" in text and "call mum" in text
    # Later, with the daemon down: the first is due and not fired.
    db = state_dir / "iva.sqlite3"
    conn = sqlite3.connect(db)
    conn.execute("UPDATE reminders SET next_at = ? WHERE id = ?", (time.time() - 300, due.id))
    conn.commit()
    conn.close()
    code, text = _run("--state", str(state_dir))
    assert code == 0 and "1 due" in text and f"due    {due.id}  chat {BUSY}  for 5m" in text
    code, out = _run("--state", str(state_dir), "--json")
    snapshot = json.loads(out)["reminders"]
    assert [r["id"] for r in snapshot["due"]] == [due.id] and [r["id"] for r in snapshot["paused"]] == [paused.id]


def _iso(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).isoformat()
