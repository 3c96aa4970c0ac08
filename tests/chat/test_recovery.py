"""Restarts and crashes (R1-R5, T7) in process: the bridge is "SIGKILLed" at the dangerous points
(tests/harness.py's ``crash()``: every task stops where it is, nothing uncommitted survives),
started again on the same files, and nothing is lost and nothing answered twice; /healthz and
/metrics on the listener. What needs a real process (a kill blocked inside a commit, SIGTERM,
the quarantine on the daemon's start path, the real eve) stays in tests/process/test_recovery.py."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from typing import Any

from prometheus_client import generate_latest

from bridge.metrics import METRICS
from tests.conftest import OWNER

A = str(OWNER)


def chat_is(d: Any, **want: Any) -> Any:
    def check() -> bool:
        c = d.chat(A)
        return c is not None and all(c.get(k) == v for k, v in want.items())
    return check


async def test_kill_after_claim_before_eve_got_it(tg, fake_eve, in_process):
    """Crash point 1: the message is committed and claimed, the send has not reached eve."""
    bridge = in_process
    fake_eve.hold_sends = True
    await tg.message("first words", user_id=OWNER)
    await tg.wait_for(lambda: fake_eve.held == 1, 10, "the send held at eve")
    assert bridge.chat(A)["status"] == "busy"
    await bridge.crash()
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


async def test_kill_while_eve_runs_the_turn(tg, fake_eve, in_process):
    """Crash point 2: eve finishes the turn while the bridge is down; the reply arrives once."""
    bridge = in_process
    await tg.message("slow thought [[delay=1.5]]", user_id=OWNER)
    await tg.wait_for(lambda: any(s.running for s in fake_eve.sessions.values()), 10, "eve running")
    await bridge.crash()
    await tg.wait_for(lambda: not any(s.running for s in fake_eve.sessions.values()), 10, "eve done")
    assert tg.texts() == []
    await bridge.start()
    assert await tg.wait_texts(1) == ["echo: slow thought"]
    await bridge.settled()
    assert tg.texts() == ["echo: slow thought"]


async def test_kill_after_message_completed_before_the_send(tg, fake_eve, in_process):
    """Crash point 3: the reply is in the outbox, Telegram has not got it; it is sent once after restart."""
    bridge = in_process
    release = asyncio.Event()

    async def hold(params):
        await release.wait()

    tg.hooks["sendMessage"] = hold
    await tg.message("hold my reply", user_id=OWNER)
    await tg.wait_for(lambda: tg.calls_of("sendMessage"), 10, "the send attempted")
    await bridge.crash()
    await tg.wait_for(lambda: tg.callers_gone("sendMessage") == 1, 10, "Telegram to see the caller gone")
    del tg.hooks["sendMessage"]
    release.set()
    await tg.wait_for(lambda: tg.in_flight("sendMessage") == 0, 10, "the held send answered")
    assert tg.texts() == []
    await bridge.start()
    assert await tg.wait_texts(1) == ["echo: hold my reply"]
    await bridge.settled()
    assert tg.texts() == ["echo: hold my reply"]


async def test_kill_after_the_send_recorded_repeats_nothing(tg, fake_eve, in_process):
    """Crash point 4's other side: killed once the "sent" record committed, nothing is repeated
    (the kill blocked inside that commit, with its one duplicate, is tests/process/test_recovery.py's)."""
    bridge = in_process
    await tg.message("next", user_id=OWNER)
    await tg.wait_texts(1)

    def recorded() -> bool:
        with bridge.db() as conn:
            row = conn.execute("SELECT state FROM outbox WHERE text = 'echo: next'").fetchone()
        return row is not None and row[0] == "sent"

    await tg.wait_for(recorded, 10, "the send recorded")
    await bridge.crash()
    await bridge.start()
    await bridge.settled()
    assert tg.texts() == ["echo: next"]


async def test_kill_during_auto_compaction_that_finishes(tg, fake_eve, in_process):
    """R2/C11: the compaction finishes while the bridge is down: recovery finishes it, silently."""
    bridge = in_process
    fake_eve.summary_delay = 1.5
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await tg.wait_for(chat_is(bridge, status="busy", kind="compact"), 20, "compacting")
    await tg.wait_for(lambda: fake_eve.routes("compact"), 10, "the compact request at eve")
    await bridge.crash()
    await tg.wait_for(lambda: any(s.compactions_done for s in fake_eve.sessions.values()), 10, "done in eve")
    await bridge.start()
    await tg.wait_for(chat_is(bridge, status="idle", compactions=1, after_pending=1), 15, "finished as if live")
    assert tg.texts() == ["echo: big"]
    await tg.message("after", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts() == ["echo: big", "echo: after"]


async def test_kill_during_auto_compaction_that_is_lost(tg, fake_eve, in_process_factory):
    """R2/R3: eve lost the compaction (stuck): the chat is freed silently with the reset mark."""
    d = in_process_factory(IVA_BUSY_TIMEOUT="3")
    await d.start()
    fake_eve.summary_delay = 600
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await tg.wait_for(chat_is(d, status="busy", kind="compact"), 20, "compacting")
    # Killed once eve has the request (before it, the compaction never started: see R3's other path).
    await tg.wait_for(lambda: fake_eve.routes("compact"), 10, "the compact request at eve")
    await d.crash()
    await d.start()
    await tg.wait_for(chat_is(d, status="idle", reset_mark=1), 20, "freed")
    assert tg.texts() == ["echo: big"]
    fake_eve.summary_delay = 0
    await tg.message("hello again", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts()[1] == "echo: hello again" and len(fake_eve.sessions) == 2


async def test_kill_during_manual_compaction(tg, fake_eve, in_process_factory):
    """R2/R3: a /compact that finishes while down is confirmed; one that is lost asks for /compact again."""
    d = in_process_factory(IVA_BUSY_TIMEOUT="3")
    await d.start()
    await tg.message("long [[tokens=50000]]", user_id=OWNER)
    await tg.wait_texts(1)
    await tg.wait_for(chat_is(d, status="idle"), 10, "idle")
    fake_eve.summary_delay = 1.5
    await tg.message("/compact", user_id=OWNER)
    await tg.wait_for(chat_is(d, status="busy", kind="compact"), 10, "compacting")
    await tg.wait_for(lambda: fake_eve.routes("compact"), 10, "compact sent")
    await d.crash()
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
    await d.crash()
    await d.start()
    await tg.wait_for(lambda: "The compaction was interrupted. Please send /compact again." in tg.texts(), 20,
                      "asked to repeat")


def _getter(d):
    """GET a path of the bridge's listener: (status, body), an HTTP error's too."""

    def get(path):
        try:
            with urllib.request.urlopen(d.api_url + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return get


def _sample(text: str, series: str) -> float:
    """The value of one series of a /metrics text (0 when the series is not there yet)."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


COUNTED = ('iva_turns_total{outcome="completed"}', "iva_telegram_messages_sent_total",
           'iva_compactions_total{origin="auto",outcome="completed"}')


async def test_healthz_and_metrics(tg, fake_eve, in_process_factory):
    """/healthz says whether it polls and the database answers; /metrics is Prometheus text with
    the counts of what happened: one turn, one message sent, one (parking) compaction. (In process
    the counters are the test process's: what this scenario added is counted.)"""
    bridge = in_process_factory(listen=True)
    before = generate_latest(METRICS.registry).decode()
    await bridge.start()
    await tg.message("count me [[tokens=120000]]", user_id=OWNER)
    await tg.wait_texts(1)
    await tg.wait_for(chat_is(bridge, status="idle", compactions=1), 20, "compacted and idle")
    await bridge.settled()
    get = _getter(bridge)

    status, body = await asyncio.to_thread(get, "/healthz")
    health = json.loads(body)
    assert status == 200 and health["ok"] and health["database"] == "ok" and health["busy_chats"] == 0
    status, text = await asyncio.to_thread(get, "/metrics")
    assert status == 200
    assert {s: _sample(text, s) - _sample(before, s) for s in COUNTED} == dict.fromkeys(COUNTED, 1.0)
    assert "iva_queue_depth 0.0" in text
    assert "iva_compacting_chats 0.0" in text and "iva_busy_chats 0.0" in text


async def test_healthz_tells_when_replies_are_failing(tg, fake_eve, in_process_factory):
    """Issue 11: a reply that keeps failing to go out makes /healthz say so (503, the oldest
    pending reply's age) and /metrics carry it — /healthz said ok while one reply was resent for
    minutes."""
    d = in_process_factory(listen=True, IVA_HEALTH_REPLY_SECONDS="1")
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


async def test_healthz_tells_of_a_chat_busy_without_progress(tg, fake_eve, in_process_factory):
    """Issue 11: a busy chat that makes no progress for 1.5 × IVA_BUSY_TIMEOUT (here eve answers
    every request of the turn with 500, so the busy timeout never gets to free it) makes /healthz
    503 with overdue_chats and sets iva_overdue_chats; once the turn goes on, it is ok again."""
    d = in_process_factory(listen=True, IVA_BUSY_TIMEOUT="1")
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
