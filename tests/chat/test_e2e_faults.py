"""Fault scenarios against the fake eve and the fake Bot API (T1, T2, T6, T7, R6)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from tests.conftest import FRIEND, OWNER, STRANGER
from tests.fakes.clock import FakeClock, HandClock
from tests.fakes.telegram import BOT_USERNAME
from tests.harness import Harness


async def test_stranger_gets_nothing(tg, fake_eve, in_process):
    """T2: someone not in the owner/allowed lists is ignored: no reply, nothing sent to eve."""
    await tg.message("let me in", user_id=STRANGER)
    await tg.message("hi from a friend", user_id=FRIEND)
    await tg.wait_texts(1)
    await in_process.settled()  # both updates handled to the end: the stranger's did nothing
    assert tg.texts() == ["echo: hi from a friend"]
    assert [b["message"] for b in fake_eve.sends()] == ["hi from a friend"]


async def test_group_answers_mentions_and_replies_only(tg, fake_eve, in_process):
    """T2: in a group the bot reacts to a mention or a reply to it, not to other chatter."""
    group = -1001
    await tg.message("just chatting", user_id=OWNER, chat_id=group, chat_type="supergroup")
    mention = f"@{BOT_USERNAME} what time is it"
    await tg.message(mention, user_id=OWNER, chat_id=group, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await tg.wait_texts(1)
    await tg.message("and a follow-up", user_id=FRIEND, chat_id=group, chat_type="supergroup", reply_to_bot=True)
    await tg.wait_texts(2)
    await in_process.settled()
    assert tg.texts()[0] == "echo: Ann: what time is it" and tg.texts()[1].endswith("Ann: and a follow-up")
    # The reply carries the answer it replies to (issue 14).
    assert fake_eve.sends()[-1]["message"] == "> (replying to you) earlier answer\nAnn: and a follow-up"
    assert all(p["chat_id"] == group for p in tg.sent())


async def test_forum_topic_is_its_own_address(tg, fake_eve, in_process):
    """T2: a forum topic is an address; the General topic never gets message_thread_id."""
    group = -1002
    await tg.message("/status", user_id=OWNER, chat_id=group, chat_type="supergroup", thread_id=7, is_topic=True)
    await tg.message(f"@{BOT_USERNAME} in topic", user_id=OWNER, chat_id=group, chat_type="supergroup",
                     thread_id=7, is_topic=True,
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await tg.message(f"@{BOT_USERNAME} in general", user_id=OWNER, chat_id=group, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await tg.wait_texts(3)
    by_text = {p["text"]: p for p in tg.sent()}
    assert by_text["echo: Ann: in topic"]["message_thread_id"] == 7
    assert "message_thread_id" not in by_text["echo: Ann: in general"]
    assert len(fake_eve.sessions) == 2
    assert in_process.chat(f"{group}/7") and in_process.chat(f"{group}")


async def test_long_reply_is_split(tg, fake_eve, in_process):
    """T6: a reply over 4096 characters arrives as several messages, none over the limit."""
    long = " ".join(f"word{n}" for n in range(1500))  # ~10 000 characters
    await tg.message(f"tell me [[reply={long}]]", user_id=OWNER)
    await tg.wait_for(lambda: len(tg.texts()) >= 3, 15, "three parts")

    def delivered() -> bool:
        with in_process.db() as conn:
            return conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()[0] == 0

    await tg.wait_for(delivered, 15, "every part sent")
    parts = tg.texts()
    assert all(len(p) <= 4096 for p in parts)
    assert " ".join(parts).split() == long.split()


async def test_markdown_becomes_entities(tg, fake_eve, in_process):
    """T6: Markdown is rendered as entities, so Telegram has nothing to parse."""
    await tg.message("fmt [[reply=**bold** and `code`]]", user_id=OWNER)
    await tg.wait_texts(1)
    sent = tg.sent()[0]
    assert sent["text"] == "bold and code"
    assert {e["type"] for e in sent["entities"]} == {"bold", "code"}
    assert "parse_mode" not in sent


async def test_429_waits_retry_after(tmp_path, tg, fake_eve):
    """T6: a 429 is honoured: the send is retried after retry_after (on the pacer's injected
    clock: nothing goes again until it has moved the 25 s), and succeeds once."""
    clock = FakeClock()
    h = Harness(tmp_path / "state", tg, fake_eve, clock=clock)
    await h.start()
    try:
        tg.fail("sendMessage", 429, retry_after=25)
        await tg.message("hurry", user_id=OWNER)
        await tg.wait_for(lambda: clock.sleepers, 15, "the chat held")
        await clock.advance(24)
        assert len(tg.calls_of("sendMessage")) == 1 and clock.sleepers == 1  # not before the 25 s
        await clock.advance(1)
        await tg.wait_texts(1)
        await h.settled()
        assert len(tg.calls_of("sendMessage")) == 2
        assert tg.texts() == ["echo: hurry"]
    finally:
        await h.stop()


async def test_transient_telegram_errors_retry(tg, fake_eve, in_process):
    """T6: 5xx answers and a dropped connection are retried with backoff; nothing is lost."""
    tg.fail("sendMessage", 502, times=2)
    tg.fail("sendMessage", 500, drop=True)
    await tg.message("flaky", user_id=OWNER)
    await tg.wait_texts(1, timeout=20)
    assert tg.texts() == ["echo: flaky"]


async def test_blocked_bot_is_recorded_and_stops_sends(tg, fake_eve, in_process):
    """T6: a blocked bot is recorded; later replies for that chat are not attempted; nothing crashes."""
    tg.blocked_chats.add(OWNER)
    await tg.message("you will not see this", user_id=OWNER)
    await tg.wait_for(lambda: (in_process.chat(str(OWNER)) or {}).get("blocked") == 1, 15, "blocked mark")
    await tg.message("other chat works", user_id=FRIEND)
    await tg.wait_texts(1)
    assert tg.texts() == ["echo: other chat works"]


async def test_cut_stream_and_garbage_lines_do_not_duplicate(tg, fake_eve, in_process):
    """T7/R6: a stream cut mid-line resumes from the cursor, garbage lines are skipped, one reply."""
    fake_eve.cut_streams = 2
    fake_eve.cut_after = 2
    fake_eve.garbage_every = 3
    await tg.message("resilient", user_id=OWNER)
    await tg.wait_texts(1)
    await tg.wait_for(lambda: in_process.chat(str(OWNER))["status"] == "idle", 10, "idle")
    await tg.message("again", user_id=OWNER)
    await tg.wait_texts(2)
    await in_process.settled()
    assert tg.texts() == ["echo: resilient", "echo: again"]


async def test_session_not_ready_is_retried(tg, fake_eve, in_process):
    """R6: eve's 409 session_not_ready after a message-free create is retried with backoff."""
    fake_eve.not_ready_sends = 3
    await tg.message("patience", user_id=OWNER)
    assert await tg.wait_texts(1) == ["echo: patience"]
    assert fake_eve.not_ready_sends == 0


async def test_failed_turn_tells_the_user_and_frees_the_chat(tg, fake_eve, in_process):
    """turn.failed: a short clear message, and the chat is free for the next message."""
    await tg.message("break [[fail=500]]", user_id=OWNER)
    texts = await tg.wait_texts(1)
    assert "MODEL_CALL_FAILED" in texts[0] and "try again" in texts[0]
    await tg.message("fine now", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts()[1] == "echo: fine now"


async def test_eve_down_messages_wait_and_go_when_back(tg, fake_eve, in_process_factory):
    """R6: with eve unreachable the message stays queued and is answered once eve is back."""
    import socket

    import structlog

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    d = in_process_factory(IVA_EVE_URL=f"http://127.0.0.1:{port}")
    with structlog.testing.capture_logs() as logs:
        await d.start()
        await tg.message("are you there", user_id=OWNER)
        # The bridge met the outage: it tried eve, failed, and waits to try again.
        await tg.wait_for(lambda: any(e["event"] == "eve_unreachable" for e in logs), 20,
                          "the bridge to find eve unreachable")
    assert tg.texts() == []
    with d.db() as conn:
        # Kept: queued, or claimed while the client retries, never done or dropped.
        assert conn.execute("SELECT count(*) FROM diskqueue_messages WHERE state IN (0, 1)").fetchone()[0] == 1
    # eve comes back on that port: the same fake, served there.
    from aiohttp import web

    site = web.TCPSite(fake_eve.runner, "127.0.0.1", port)
    await site.start()
    try:
        assert await tg.wait_texts(1, timeout=40) == ["echo: are you there"]
    finally:
        await site.stop()


async def test_typing_runs_during_the_turn_and_stops_before_the_reply(tg, fake_eve, in_process):
    """T6: the typing indicator is on while eve works, and never sent after the final reply."""
    await tg.message("think [[delay=1]]", user_id=OWNER)
    await tg.wait_texts(1)
    await in_process.settled()  # the busy period is over: a typing call after the reply would be in by now
    actions = [c for c in tg.calls if c.method == "sendChatAction"]
    reply = next(c for c in tg.calls if c.method == "sendMessage")
    assert actions and all(a.at < reply.at for a in actions)
    assert actions[0].params["action"] == "typing"


async def test_texts_follow_the_users_language(tg, fake_eve, in_process):
    """Texts in ru and en by the user's language_code."""
    await tg.message("/help", user_id=OWNER, language_code="ru")
    await tg.message("/help", user_id=FRIEND, language_code="en")
    await tg.wait_texts(2)
    assert "начать новый разговор" in tg.texts(OWNER)[0]
    assert "start a new conversation" in tg.texts(FRIEND)[0]


async def test_logs_are_json_without_token_or_text(tg, fake_eve, in_process_factory):
    """Logs: JSON lines with the chat bound; never the token; message text only at debug. In
    process the events are caught before rendering (with the bound context merged) and rendered
    as the daemon renders them (bridge/log.py: the redactor, then JSON); that the daemon writes
    such lines to stdout is seen by every process test's log scan (S5, tests/conftest.py)."""
    import json
    import logging

    import structlog

    from bridge.log import Redactor
    from tests.fakes.telegram import TOKEN

    d = in_process_factory(IVA_LOG_LEVEL="info")
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as events:
        await d.start()
        await tg.message("a very private sentence", user_id=OWNER)
        await tg.wait_texts(1)
        await d.settled()
    assert d.h.settings.log_level == "info"
    # What the daemon writes at info: the events at info and above, redacted and JSON-rendered.
    levels = logging.getLevelNamesMapping()
    shown = [e for e in events if levels[e["log_level"].upper()] >= logging.INFO]
    redact = Redactor([TOKEN, fake_eve.token])
    render = structlog.processors.JSONRenderer(ensure_ascii=False)
    lines = [render(None, "", redact(None, "", dict(e))) for e in shown]
    records = [json.loads(line) for line in lines]
    assert any(r.get("event") == "message_queued" and r.get("chat_id") == OWNER for r in records)
    raw = "\n".join(repr(e) for e in shown)  # not even before redaction
    assert TOKEN not in raw and TOKEN.split(":")[1] not in raw
    assert "a very private sentence" not in raw and "a very private sentence" not in "\n".join(lines)


async def test_status_and_help(tg, fake_eve, in_process_factory):
    """M8 (basic): /status shows the session, the state, the queue and the last measurement."""
    bridge = in_process_factory(IVA_NOTES_ENABLED="1")  # the daemon's default: notes on
    await bridge.start()
    await bridge.h.daemon_steps()  # what bridge/app.py's Bridge.run does at start: the menu, eve's window
    await tg.wait_for(lambda: {c.get("language_code") for c in tg.calls_of("setMyCommands")} >= {"en", "ru"},
                      20, "the command menu in both languages")
    await tg.message("/help", user_id=OWNER)
    await tg.wait_texts(1)
    assert "/new" in tg.texts()[0]
    await tg.message("measure me [[tokens=4321]]", user_id=OWNER)
    await tg.wait_texts(2)
    await tg.wait_for(lambda: bridge.chat(str(OWNER))["status"] == "idle", 10, "idle")
    await tg.message("/status", user_id=OWNER)
    await tg.wait_texts(3)
    status = tg.texts()[2]
    # The threshold comes from eve's /info window when IVA_CONTEXT_WINDOW is unset: 60% of 128 000.
    assert "4 321" in status and "76 800" in status and "free" in status
    assert "Notebook: 0 note(s), inline mode" in status
    menu = tg.calls_of("setMyCommands")[0]["commands"]
    assert "stop" in str(menu) and "/stop" in tg.texts()[0]  # L*: the menu and /help name /stop


@pytest.mark.process
async def test_sigkill_before_commit_redelivers_and_answers_once(tg, fake_eve, bridge):
    """T1: killed after Telegram handed over the update but before the commit: redelivered, one answer.

    The test holds the database's write lock, so the daemon is stuck inside its commit when it
    is killed; Telegram must not have seen the update confirmed.
    """
    db = sqlite3.connect(bridge.state / "iva.sqlite3", isolation_level=None, timeout=1)
    db.execute("BEGIN IMMEDIATE")
    handed = len(tg.handed)
    await tg.message("do not lose me", user_id=OWNER)
    update_id = tg.updates[-1]["update_id"]
    await tg.wait_for(lambda: len(tg.handed) > handed, 10, "the update handed over")
    # Kept: pacing, so the kill most likely finds the daemon inside its commit, blocked on our lock
    # (nothing outside shows that moment). The assertions hold for an earlier kill as well.
    await asyncio.sleep(0.5)
    await bridge.kill()
    db.execute("ROLLBACK")
    db.close()
    assert tg.confirmed <= max(tg.handed)  # the offset did not pass it
    await bridge.start()
    assert await tg.wait_texts(1) == ["echo: do not lose me"]
    await bridge.settled()
    assert tg.texts() == ["echo: do not lose me"]
    assert tg.handed.count(update_id) == 2  # redelivered after the restart: handed over twice


async def test_sigkill_loses_and_duplicates_nothing_queued(tg, fake_eve, in_process):
    """Acceptance: messages queued behind a busy chat survive a SIGKILL + restart, answered once each
    (in process: tests/harness.py's crash(), what a SIGKILL leaves)."""
    bridge = in_process
    await tg.message("long [[delay=2]]", user_id=OWNER)
    await tg.wait_for(lambda: (bridge.chat(str(OWNER)) or {}).get("status") == "busy", 10, "busy")
    for n in range(3):
        await tg.message(f"queued {n}", user_id=OWNER)
    await tg.wait_for(lambda: len(tg.calls_of("setMessageReaction")) == 3, 10, "receipts")
    await bridge.crash()
    await bridge.start()
    await tg.wait_texts(2, timeout=30)
    await bridge.settled()
    assert tg.texts() == ["echo: long", "echo: queued 0 queued 1 queued 2"]


async def test_stuck_session_is_freed_after_busy_timeout(tmp_path, tg, fake_eve):
    """R2/R3 with the fake eve's "stuck" mode (eve restarted mid-turn, PROTOCOL.md §9): a session that
    makes no progress frees the chat; the person is asked to repeat; the next message gets a new session."""
    clock = HandClock()  # the busy timeout on the injected clock: freed when it passes, never before
    h = Harness(tmp_path / "state", tg, fake_eve, busy_clock=clock, IVA_BUSY_TIMEOUT="600")
    await h.start()
    try:
        await tg.message("warm up", user_id=OWNER)
        await tg.wait_texts(1)
        fake_eve.stuck = True
        await tg.message("this will hang", user_id=OWNER)
        await h.until(lambda: clock.waiting >= 1, what="the turn waiting on its busy timeout")
        await clock.advance(599)
        await clock.settled()  # the busy timeout has seen the new reading, and did not pass
        assert clock.waiting >= 1 and len(tg.texts()) == 1  # within the timeout: nothing said
        await clock.advance(2)
        await tg.wait_texts(2, timeout=20)
        assert "repeat your last request" in tg.texts()[1]
        fake_eve.stuck = False
        await tg.message("fresh start", user_id=OWNER)
        await tg.wait_texts(3, timeout=20)
        assert tg.texts()[2] == "echo: fresh start"
        assert len(fake_eve.sessions) == 2
    finally:
        await h.stop()


async def test_documents_and_photos_go_to_eve_as_file_parts(tg, fake_eve, in_process):
    """T8: a document and a photo reach eve as file parts; a video or an oversized file gets a clear answer."""
    tg.files["doc1"] = b"quarterly numbers"
    tg.files["ph1"] = b"\xff\xd8\xffJPEGDATA"
    await tg.message(None, user_id=OWNER, extra={"caption": "summarise", "document": {
        "file_id": "doc1", "file_unique_id": "doc1", "file_name": "q3.txt", "mime_type": "text/plain",
        "file_size": 17}})
    await tg.wait_texts(1)
    assert tg.texts()[0] == "echo: summarise [file: q3.txt (text/plain)]"
    session = next(iter(fake_eve.sessions.values()))
    sent = session.sends[0]["message"]
    assert sent[0] == {"type": "text", "text": "summarise"}
    assert sent[1]["mediaType"] == "text/plain" and sent[1]["filename"] == "q3.txt"
    assert sent[1]["data"] == "data:text/plain;base64,cXVhcnRlcmx5IG51bWJlcnM="
    await tg.message(None, user_id=OWNER, extra={"photo": [
        {"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90, "file_size": 10},
        {"file_id": "ph1", "file_unique_id": "p", "width": 800, "height": 800, "file_size": 11}]})
    await tg.wait_texts(2)
    assert tg.texts()[1].startswith("echo: [file: photo-")
    await tg.message(None, user_id=OWNER, extra={"video": {
        "file_id": "vid", "file_unique_id": "vid", "width": 1, "height": 1, "duration": 3}})
    await tg.message(None, user_id=OWNER, extra={"document": {
        "file_id": "huge", "file_unique_id": "h", "file_name": "big.iso", "file_size": 50 * 1024 * 1024}})
    await tg.wait_texts(4)
    assert tg.texts()[2].startswith("I can read text, photos and documents")
    assert tg.texts()[3] == "That file is too big for me (50.0 MB; the limit is 20 MB)."
    assert len(session.sends) == 2


async def test_question_shows_buttons_and_the_answer_resumes_the_turn(tg, fake_eve, in_process):
    """T5: turn.waiting on input → the prompt with its options as buttons; a press answers eve."""
    await tg.message("deploy? [[ask=Deploy to prod?|approve|cancel]]", user_id=OWNER)
    await tg.wait_texts(1)
    prompt = tg.sent()[0]
    assert prompt["text"] == "Deploy to prod?"
    labels = [b["text"] for row in prompt["reply_markup"]["inline_keyboard"] for b in row]
    assert labels == ["Approve", "Cancel"]
    await tg.wait_for(lambda: in_process.chat(str(OWNER))["waiting_input"] == 1, 10, "waiting on input")
    await tg.press(prompt, "Approve", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts()[1] == "answered: approve"
    assert [c["text"] for c in tg.calls_of("answerCallbackQuery")] == ["✓"]
    session = next(iter(fake_eve.sessions.values()))
    assert any(e["type"] == "input.resolved" for e in session.events)
    await tg.wait_for(lambda: in_process.chat(str(OWNER))["status"] == "idle", 10, "idle")
    await tg.press(prompt, "Cancel", user_id=OWNER)  # too late: the question is closed
    await tg.wait_for(lambda: len(tg.calls_of("answerCallbackQuery")) == 2, 10, "second answer")
    assert tg.calls_of("answerCallbackQuery")[1]["text"] == "This question is closed."


async def test_a_message_answers_the_waiting_turn_under_queue_policy(tg, fake_eve, in_process):
    """T5: while the turn waits on the person, their next message goes to eve at once (queue policy too)."""
    await tg.message("name? [[ask=What should I call it?]]", user_id=OWNER)
    await tg.wait_texts(1)
    await tg.wait_for(lambda: in_process.chat(str(OWNER))["waiting_input"] == 1, 10, "waiting on input")
    await tg.message("Bob", user_id=OWNER)
    await tg.wait_texts(2)
    assert tg.texts()[1] == "answered: Bob"
    # It did not wait in the queue (no 👀); it went to the running turn (⚡).
    assert [r["reaction"][0]["emoji"] for r in tg.calls_of("setMessageReaction")] == ["⚡"]
