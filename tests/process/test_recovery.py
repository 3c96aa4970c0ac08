"""Restarts and crashes (R1-R5, T7) that need the real daemon: a SIGKILL while it is blocked inside a
commit, SIGTERM, the corrupt-database quarantine on the daemon's own start path, and the real eve
restarted mid-turn. The other crash points (killed before eve got the message, while eve runs the
turn, before the reply went, during a compaction) and /healthz, /metrics run in process:
tests/chat/test_recovery.py."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3

import pytest

from tests.conftest import OWNER, REAL

pytestmark = pytest.mark.process  # every test here runs the bridge as a process

A = str(OWNER)


def chat_is(d, **want):
    def check():
        c = d.chat(A)
        return c is not None and all(c.get(k) == v for k, v in want.items())
    return check


async def test_kill_after_the_send_before_it_was_recorded(tg, fake_eve, bridge):
    """Crash point 4: Telegram took the reply, our record had not committed: at most one duplicate.

    The hook takes the database's write lock at the very moment Telegram does the work, so the
    daemon is stuck committing "sent" when it is killed. Only this window repeats a part: the
    crash points before the send and after the commit give exactly one copy
    (tests/chat/test_recovery.py, in process).
    """
    holder: dict[str, sqlite3.Connection] = {}

    async def lock_db(params):
        conn = sqlite3.connect(bridge.state / "iva.sqlite3", isolation_level=None, timeout=1)
        conn.execute("BEGIN IMMEDIATE")
        holder["conn"] = conn

    tg.hooks["sendMessage"] = lock_db
    await tg.message("exactly once, almost", user_id=OWNER)
    await tg.wait_texts(1)
    # Kept: pacing, so the kill most likely finds the daemon blocked on our lock while recording
    # the send (nothing outside shows that moment); a kill before it leaves the same duplicate.
    await asyncio.sleep(0.5)
    await bridge.kill()
    del tg.hooks["sendMessage"]
    holder["conn"].execute("ROLLBACK")
    holder["conn"].close()
    await bridge.start()
    await tg.wait_texts(2)
    await bridge.settled()
    assert tg.texts() == ["echo: exactly once, almost"] * 2  # one duplicate, no more
    # After the commit nothing is repeated: tests/chat/test_recovery.py, in process.


async def test_sigterm_leaves_the_busy_record_like_a_crash(tg, fake_eve, bridge):
    """R4/R7: SIGTERM during a turn exits promptly and leaves the record for recovery; the reply comes once."""
    await tg.message("graceful [[delay=2]]", user_id=OWNER)
    await tg.wait_for(chat_is(bridge, status="busy", kind="turn"), 10, "busy")
    code = await bridge.terminate(timeout=10)
    assert code == 0
    assert bridge.chat(A)["status"] == "busy"  # left for recovery, exactly like a crash
    await bridge.start()
    assert await tg.wait_texts(1, timeout=15) == ["echo: graceful"]
    await bridge.settled()
    assert tg.texts() == ["echo: graceful"]


def _corrupt_page(path):
    """Keep the header page, scribble over every b-tree page after it."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * (size - 4096))


async def test_corrupt_database_is_quarantined(tg, fake_eve, daemon_factory):
    """R5: a database that fails the check is moved aside (not deleted), a fresh one made, owners told."""
    d = daemon_factory(fake_eve.url, fake_eve.token)
    (d.state / "iva.sqlite3").write_bytes(b"this is not a database at all" * 100)
    await d.start()
    await tg.wait_texts(1)
    assert tg.texts()[0].startswith("Iva: the state database failed its check")
    moved = list(d.state.glob("iva.sqlite3.quarantined-*"))
    assert len(moved) == 1 and moved[0].read_bytes().startswith(b"this is not a database")
    await tg.message("still here?", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts()[1] == "echo: still here?"
    await d.terminate()
    # A real database with a damaged page fails quick_check the same way.
    shutil.copy(d.state / "iva.sqlite3", d.state / "copy.sqlite3")
    conn = sqlite3.connect(d.state / "iva.sqlite3", isolation_level=None)
    conn.executemany("INSERT INTO outbox (address, key, chat_id, text, created_at, state) "
                     "VALUES (?, ?, 1, ?, 0, 'sent')",
                     [("x", f"k{i}", "y" * 500) for i in range(200)])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    _corrupt_page(d.state / "iva.sqlite3")
    await d.start()
    await tg.wait_for(lambda: len(list(d.state.glob("iva.sqlite3.quarantined-*"))) == 2, 15, "second quarantine")
    await tg.message("and now?", user_id=OWNER)
    await tg.wait_for(lambda: "echo: and now?" in tg.texts(), 15, "answered")


@REAL
async def test_real_eve_restarted_mid_turn(tg, real_eve, daemon_factory):
    """Killed mid-turn and restarted with its state. eve 0.80 (PROTOCOL.md §9): the session is
    stuck; the person is told to repeat and the next message is answered in a new session. eve
    1.x (PROTOCOL-27.md §10): the run is redone and the turn completes: answered once, in the same
    session, and the next message goes on in it."""
    d = daemon_factory(real_eve.url, real_eve.token, IVA_BUSY_TIMEOUT="8")
    await d.start()
    await tg.message("warm up", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    first = d.chat(A)["eve_session"]
    await tg.message("long one [[delay=6]]", user_id=OWNER)
    await tg.wait_for(lambda: any("long one" in str(r.get("latest_user") or r.get("preview"))
                                  for r in real_eve.llm_requests()), 20, "the model call in flight")
    await asyncio.to_thread(real_eve.restart_eve, kill=True)
    await tg.wait_texts(2, timeout=60)
    if real_eve.wire == 26:
        assert "repeat your last request" in tg.texts()[1]
    else:
        assert tg.texts()[1] == "echo: long one"
    await tg.message("new start", user_id=OWNER)
    await tg.wait_texts(3, timeout=40)
    assert tg.texts()[2] == "echo: new start"
    assert tg.texts().count("echo: long one") <= 1
    assert (d.chat(A)["eve_session"] != first) is (real_eve.wire == 26)


async def test_sigterm_while_telegram_is_unreachable_at_start_exits_cleanly(tg, fake_eve, daemon_factory):
    """R7: a stop during start-up (Telegram down, getMe retrying) ends promptly with exit code 0."""
    import os
    import signal
    import sys

    from tests.conftest import ROOT

    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_TELEGRAM_API_URL="http://127.0.0.1:9")
    env = {**os.environ, **d.env}
    with open(d.log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bridge", "run", cwd=ROOT, env=env,
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=out,
                                                    stderr=asyncio.subprocess.STDOUT)
    try:
        # Stopped while retrying getMe (imports done, signal handlers installed): not before. The
        # timeouts bound a failure only (a loaded machine starts Python slowly).
        await tg.wait_for(lambda: "telegram_unreachable_at_start" in d.logs(), 120, "the getMe retry loop")
        assert proc.returncode is None  # still trying, not crashed
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:  # failed: nothing of it may outlive the test
            proc.kill()
        await proc.wait()


