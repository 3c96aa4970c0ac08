"""Restarts and crashes (R1-R5, T7): SIGKILL the real daemon at the dangerous points, restart it,
and check that nothing is lost and nothing is answered twice."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import urllib.error
import urllib.request

import pytest

from tests.conftest import OWNER, REAL

pytestmark = pytest.mark.process  # every test here runs the bridge as a process

A = str(OWNER)


def chat_is(d, **want):
    def check():
        c = d.chat(A)
        return c is not None and all(c.get(k) == v for k, v in want.items())
    return check


async def test_kill_after_claim_before_eve_got_it(tg, fake_eve, bridge):
    """Crash point 1: the message is committed and claimed, the send has not reached eve."""
    fake_eve.hold_sends = True
    await tg.message("first words", user_id=OWNER)
    await tg.wait_for(lambda: fake_eve.held == 1, 10, "the send held at eve")
    assert bridge.chat(A)["status"] == "busy"
    await bridge.kill()
    await tg.wait_for(lambda: fake_eve.held_callers_gone() == 1, 10, "eve to see the caller gone")
    fake_eve.release_sends.set()  # the dead caller's send is dropped: eve never took it
    fake_eve.hold_sends = False
    await tg.wait_for(fake_eve.quiet, 10, "the held send dropped")
    assert sum(len(s.sends) for s in fake_eve.sessions.values()) == 0
    await bridge.start()
    assert await tg.wait_texts(1) == ["echo: first words"]
    await bridge.settled()
    assert tg.texts() == ["echo: first words"]
    assert sum(len(s.sends) for s in fake_eve.sessions.values()) == 1


async def test_kill_while_eve_runs_the_turn(tg, fake_eve, bridge):
    """Crash point 2: eve finishes the turn while the bridge is down; the reply arrives once."""
    await tg.message("slow thought [[delay=1.5]]", user_id=OWNER)
    await tg.wait_for(lambda: any(s.running for s in fake_eve.sessions.values()), 10, "eve running")
    await bridge.kill()
    await tg.wait_for(lambda: not any(s.running for s in fake_eve.sessions.values()), 10, "eve done")
    assert tg.texts() == []
    await bridge.start()
    assert await tg.wait_texts(1) == ["echo: slow thought"]
    await bridge.settled()
    assert tg.texts() == ["echo: slow thought"]


async def test_kill_after_message_completed_before_the_send(tg, fake_eve, bridge):
    """Crash point 3: the reply is in the outbox, Telegram has not got it; it is sent once after restart."""
    release = asyncio.Event()

    async def hold(params):
        await release.wait()

    tg.hooks["sendMessage"] = hold
    await tg.message("hold my reply", user_id=OWNER)
    await tg.wait_for(lambda: tg.calls_of("sendMessage"), 10, "the send attempted")
    await bridge.kill()
    await tg.wait_for(lambda: tg.callers_gone("sendMessage") == 1, 10, "Telegram to see the caller gone")
    del tg.hooks["sendMessage"]
    release.set()
    await tg.wait_for(lambda: tg.in_flight("sendMessage") == 0, 10, "the held send answered")
    assert tg.texts() == []
    await bridge.start()
    assert await tg.wait_texts(1) == ["echo: hold my reply"]
    await bridge.settled()
    assert tg.texts() == ["echo: hold my reply"]


async def test_kill_after_the_send_before_it_was_recorded(tg, fake_eve, bridge):
    """Crash point 4: Telegram took the reply, our record had not committed: at most one duplicate.

    The hook takes the database's write lock at the very moment Telegram does the work, so the
    daemon is stuck committing "sent" when it is killed. Only this window repeats a part: the
    crash points before the send (above) and after the commit (below) give exactly one copy.
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
    await tg.message("next", user_id=OWNER)
    await tg.wait_texts(3)

    def recorded() -> bool:
        with bridge.db() as conn:
            row = conn.execute("SELECT state FROM outbox WHERE text = 'echo: next'").fetchone()
        return row is not None and row[0] == "sent"

    await tg.wait_for(recorded, 10, "the send recorded")
    await bridge.kill()  # after the commit: nothing is repeated
    await bridge.start()
    await bridge.settled()
    assert tg.texts() == ["echo: exactly once, almost"] * 2 + ["echo: next"]


async def test_kill_during_auto_compaction_that_finishes(tg, fake_eve, bridge):
    """R2/C11: the compaction finishes while the bridge is down: recovery finishes it, silently."""
    fake_eve.summary_delay = 1.5
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await tg.wait_for(chat_is(bridge, status="busy", kind="compact"), 20, "compacting")
    await tg.wait_for(lambda: fake_eve.routes("compact"), 10, "the compact request at eve")
    await bridge.kill()
    await tg.wait_for(lambda: any(s.compactions_done for s in fake_eve.sessions.values()), 10, "done in eve")
    await bridge.start()
    await tg.wait_for(chat_is(bridge, status="idle", compactions=1, after_pending=1), 15, "finished as if live")
    assert tg.texts() == ["echo: big"]
    await tg.message("after", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts() == ["echo: big", "echo: after"]


async def test_kill_during_auto_compaction_that_is_lost(tg, fake_eve, daemon_factory):
    """R2/R3: eve lost the compaction (stuck): the chat is freed silently with the reset mark."""
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_BUSY_TIMEOUT="3")
    await d.start()
    fake_eve.summary_delay = 600
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await tg.wait_for(chat_is(d, status="busy", kind="compact"), 20, "compacting")
    # Killed once eve has the request (before it, the compaction never started: see R3's other path).
    await tg.wait_for(lambda: fake_eve.routes("compact"), 10, "the compact request at eve")
    await d.kill()
    await d.start()
    await tg.wait_for(chat_is(d, status="idle", reset_mark=1), 20, "freed")
    assert tg.texts() == ["echo: big"]
    fake_eve.summary_delay = 0
    await tg.message("hello again", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts()[1] == "echo: hello again" and len(fake_eve.sessions) == 2


async def test_kill_during_manual_compaction(tg, fake_eve, daemon_factory):
    """R2/R3: a /compact that finishes while down is confirmed; one that is lost asks for /compact again."""
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_BUSY_TIMEOUT="3")
    await d.start()
    await tg.message("long [[tokens=50000]]", user_id=OWNER)
    await tg.wait_texts(1)
    await tg.wait_for(chat_is(d, status="idle"), 10, "idle")
    fake_eve.summary_delay = 1.5
    await tg.message("/compact", user_id=OWNER)
    await tg.wait_for(chat_is(d, status="busy", kind="compact"), 10, "compacting")
    await tg.wait_for(lambda: fake_eve.routes("compact"), 10, "compact sent")
    await d.kill()
    await tg.wait_for(lambda: any(s.compactions_done for s in fake_eve.sessions.values()), 10, "done in eve")
    await d.start()
    await tg.wait_for(lambda: any(x.startswith("Done: the conversation") for x in tg.texts()), 15, "confirmed")
    await tg.wait_for(chat_is(d, status="idle"), 10, "idle")
    # Lost: the summary never comes back.
    await tg.message("more [[tokens=50000]]", user_id=OWNER)
    await tg.wait_for(lambda: "echo: more" in tg.texts(), 10, "answer")
    await tg.wait_for(chat_is(d, status="idle"), 10, "idle")
    fake_eve.summary_delay = 600
    await tg.message("/compact", user_id=OWNER)
    await tg.wait_for(chat_is(d, status="busy", kind="compact"), 10, "compacting")
    await d.kill()
    await d.start()
    await tg.wait_for(lambda: "The compaction was interrupted. Please send /compact again." in tg.texts(), 20,
                      "asked to repeat")


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
    conn.executemany("INSERT INTO outbox (address, key, chat_id, text, created_at, state) VALUES (?, ?, 1, ?, 0, 'sent')",
                     [("x", f"k{i}", "y" * 500) for i in range(200)])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    _corrupt_page(d.state / "iva.sqlite3")
    await d.start()
    await tg.wait_for(lambda: len(list(d.state.glob("iva.sqlite3.quarantined-*"))) == 2, 15, "second quarantine")
    await tg.message("and now?", user_id=OWNER)
    await tg.wait_for(lambda: "echo: and now?" in tg.texts(), 15, "answered")


async def test_healthz_and_metrics(tg, fake_eve, bridge):
    """/healthz says whether it polls and the database answers; /metrics is Prometheus text with
    the counts of what happened: one turn, one message sent, one (parking) compaction."""
    await tg.message("count me [[tokens=120000]]", user_id=OWNER)
    await tg.wait_texts(1)
    await tg.wait_for(chat_is(bridge, status="idle", compactions=1), 20, "compacted and idle")
    await bridge.settled()

    def get(path):
        with urllib.request.urlopen(bridge.api_url + path, timeout=5) as response:
            return response.status, response.read().decode()

    status, body = await asyncio.to_thread(get, "/healthz")
    health = json.loads(body)
    assert status == 200 and health["ok"] and health["database"] == "ok" and health["busy_chats"] == 0
    status, text = await asyncio.to_thread(get, "/metrics")
    assert status == 200
    assert 'iva_turns_total{outcome="completed"} 1.0' in text
    assert "iva_queue_depth 0.0" in text and "iva_telegram_messages_sent_total 1.0" in text
    assert 'iva_compactions_total{origin="auto",outcome="completed"} 1.0' in text
    assert "iva_compacting_chats 0.0" in text and "iva_busy_chats 0.0" in text


@REAL
async def test_real_eve_restarted_mid_turn(tg, real_eve, daemon_factory):
    """PROTOCOL.md §9 on the real eve: killed mid-turn and restarted with its state, the session is stuck;
    the person is told to repeat and the next message is answered in a new session."""
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
    assert "repeat your last request" in tg.texts()[1]
    await tg.message("new start", user_id=OWNER)
    await tg.wait_texts(3, timeout=40)
    assert tg.texts()[2] == "echo: new start"
    assert d.chat(A)["eve_session"] != first


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
    # Stopped while retrying getMe (imports done, signal handlers installed): not before.
    await tg.wait_for(lambda: "telegram_unreachable_at_start" in d.logs(), 30, "the getMe retry loop")
    assert proc.returncode is None  # still trying, not crashed
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == 0


def _getter(d):
    """GET a path of the daemon's API: (status, body), an HTTP error's too."""

    def get(path):
        try:
            with urllib.request.urlopen(d.api_url + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return get


async def test_healthz_tells_when_replies_are_failing(tg, fake_eve, daemon_factory):
    """Issue 11: a reply that keeps failing to go out makes /healthz say so (503, the oldest
    pending reply's age) and /metrics carry it — /healthz said ok while one reply was resent for
    minutes."""
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_HEALTH_REPLY_SECONDS="1")
    await d.start()
    tg.fail("sendMessage", 502, times=10_000)

    get = _getter(d)

    await tg.message("hello", user_id=OWNER)

    health: dict = {}
    for _ in range(100):  # until /healthz reports the reply that does not go out (at most ~20 s)
        status, body = await asyncio.to_thread(get, "/healthz")
        health = json.loads(body)
        if status == 503 and (health.get("oldest_pending_reply_s") or 0) >= 1:
            break
        await asyncio.sleep(0.2)
    assert (health.get("oldest_pending_reply_s") or 0) >= 1, health
    assert not health["ok"] and health["database"] == "ok" and health["telegram_poll_age_s"] is not None
    _, text = await asyncio.to_thread(get, "/metrics")
    assert "iva_oldest_pending_reply_seconds" in text and "iva_oldest_pending_reply_seconds 0.0" not in text
    tg.faults.pop("sendMessage", None)
    await tg.wait_texts(1, timeout=60)
    await d.settled(60)
    status, body = await asyncio.to_thread(get, "/healthz")
    assert status == 200 and json.loads(body)["oldest_pending_reply_s"] is None


async def test_healthz_tells_of_a_chat_busy_without_progress(tg, fake_eve, daemon_factory):
    """Issue 11: a busy chat that makes no progress for 1.5 × IVA_BUSY_TIMEOUT (here eve answers
    every request of the turn with 500, so the busy timeout never gets to free it) makes /healthz
    503 with overdue_chats and sets iva_overdue_chats; once the turn goes on, it is ok again."""
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_BUSY_TIMEOUT="1")
    await d.start()

    get = _getter(d)

    await tg.message("first", user_id=OWNER)
    await tg.wait_texts(1)
    await d.settled()
    fake_eve.server_errors = 10_000
    await tg.message("second", user_id=OWNER)
    health: dict = {}
    for _ in range(100):  # until /healthz reports the chat (at most ~20 s)
        status, body = await asyncio.to_thread(get, "/healthz")
        health = json.loads(body)
        if status == 503 and health.get("overdue_chats"):
            break
        await asyncio.sleep(0.2)
    assert health.get("overdue_chats") == 1 and not health["ok"], health
    _, text = await asyncio.to_thread(get, "/metrics")
    assert "iva_overdue_chats 1.0" in text
    fake_eve.server_errors = 0
    await tg.wait_texts(2, timeout=60)
    assert tg.texts() == ["echo: first", "echo: second"]
    await d.settled(60)
    status, body = await asyncio.to_thread(get, "/healthz")
    assert status == 200 and json.loads(body)["overdue_chats"] == 0
