"""The assistant writes first (issue 21, W1-W6): turns pushed through the owner API and
notifications, in process — the real store, ingest, workers and consumer, the fakes on loopback
(tests/harness.py); the owner API on a real loopback listener where its HTTP is the point."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.app import notebook_config
from bridge.chat.transitions import ChatState, state_of
from bridge.notebook import Notebook
from bridge.push.turns import TOLD_AT_MOST, PushError, notify_keys
from bridge.storage.pushes import PushStore
from bridge.web.listener import Listener
from bridge.web.owner_api import OwnerApi
from bridge.web.push_api import PushApi
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness, open_store

A = str(OWNER)
API_TOKEN = "owner-api-token-0123456789"


def sends(fake: FakeEve) -> list[dict[str, Any]]:
    """Every message body eve took, in order."""
    return [b for s in fake.sessions.values() for b in s.sends if "message" in b]


def pushed_sends(fake: FakeEve) -> list[dict[str, Any]]:
    return [b for b in sends(fake) if "[pushed turn]" in str(b.get("clientContext") or "")]


async def known_chat(h: Harness, tg: FakeTelegram, user: int = OWNER) -> None:
    """Iva knows the chat: it has talked in it."""
    await tg.message("hello", user_id=user)
    await h.settled()


async def test_a_pushed_turn_is_answered_in_the_chat_and_eve_is_told_it_was_pushed(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    await known_chat(harness, tg)
    assert harness.pushes is not None
    state = await harness.pushes.push_turn(A, "morning brief", key="k1")
    assert state.state in ("queued", "running", "answered") and state.id.startswith("t")
    await harness.settled()
    assert tg.texts(OWNER) == ["echo: hello", "echo: morning brief"]
    [body] = pushed_sends(fake_eve)
    assert body["message"] == "morning brief" and body["turnPolicy"] == "queue"
    assert "'k1'" in body["clientContext"] and "owner API" in body["clientContext"]
    # The person's own turns are not marked pushed.
    assert "[pushed turn]" not in str(sends(fake_eve)[0].get("clientContext") or "")
    done = await harness.pushes.turn(A, state.id)
    assert done is not None and done.state == "answered" and done.finished_at is not None
    assert done.started_at is not None and done.queued_at <= done.started_at <= done.finished_at


async def test_a_repeated_key_is_the_same_turn_even_after_a_restart(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """W2: the same key again gives the same id and pushes nothing new, across a restart."""
    await known_chat(harness, tg)
    assert harness.pushes is not None
    first = await harness.pushes.push_turn(A, "brief", key="eve-schedule:2026-12-02T06:00")
    again = await harness.pushes.push_turn(A, "brief, once more", key="eve-schedule:2026-12-02T06:00")
    assert again.id == first.id
    await harness.settled()
    await harness.stop()
    await harness.start()
    assert harness.pushes is not None
    after = await harness.pushes.push_turn(A, "brief", key="eve-schedule:2026-12-02T06:00")
    assert after.id == first.id and after.state == "answered"
    other = await harness.pushes.push_turn(A, "brief", key="eve-schedule:2026-12-02T06:01")
    assert other.id != first.id
    await harness.settled()
    assert tg.texts(OWNER) == ["echo: hello", "echo: brief", "echo: brief"]
    assert len(pushed_sends(fake_eve)) == 2


async def test_a_turn_pushed_into_a_busy_chat_waits_and_is_its_own_turn(tmp_path: Path, tg: FakeTelegram,
                                                                       fake_eve: FakeEve):
    """W1/W3: pushed while a turn runs, under the immediate policy (where a person's message would
    steer into it): the pushed turn waits for the turn's end and goes alone — never steered, never
    batched with the person's messages queued around it."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_TURN_POLICY="immediate")
    await h.start()
    try:
        await known_chat(h, tg)
        assert h.pushes is not None
        await tg.message("slow [[delay=1.5]]", user_id=OWNER)
        await h.until(lambda: _state(h, ChatState.TURN), what="busy")
        await h.pushes.push_turn(A, "pushed one")
        await h.settled()
        texts = tg.texts(OWNER)
        assert texts == ["echo: hello", "echo: slow", "echo: pushed one"], texts
        [body] = pushed_sends(fake_eve)
        assert body["message"] == "pushed one" and body["turnPolicy"] == "queue"
    finally:
        await h.stop()


async def test_a_pushed_turn_is_never_batched_with_the_messages_around_it(tmp_path: Path, tg: FakeTelegram,
                                                                          fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        await known_chat(h, tg)
        assert h.pushes is not None
        await tg.message("slow [[delay=1.5]]", user_id=OWNER)
        await h.until(lambda: _state(h, ChatState.TURN), what="busy")
        await tg.message("before", user_id=OWNER)
        await h.until(lambda: _queued(h) == 1, what="queued")
        await h.pushes.push_turn(A, "pushed")
        await tg.message("after", user_id=OWNER)
        await h.until(lambda: _queued(h) == 3, what="queued")
        await h.settled()
        messages = [b["message"] for b in sends(fake_eve)]
        assert messages == ["hello", "slow [[delay=1.5]]", "before", "pushed", "after"], messages
        assert [b["message"] for b in pushed_sends(fake_eve)] == ["pushed"]
    finally:
        await h.stop()


async def test_a_turn_pushed_into_a_compacting_chat_waits_for_the_compaction(tmp_path: Path, tg: FakeTelegram,
                                                                            fake_eve: FakeEve):
    """W3: pushed while the chat compacts (the immediate policy, where a message would cancel the
    compaction, C4): it waits, the compaction completes, then the pushed turn is answered."""
    fake_eve.summary_delay = 1.0
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_TURN_POLICY="immediate")
    await h.start()
    try:
        await tg.message("big [[tokens=120000]]", user_id=OWNER)
        await h.until(lambda: _state(h, ChatState.COMPACTING), what="compacting")
        assert h.pushes is not None
        await h.pushes.push_turn(A, "after the summary")
        await h.settled()
        chat = await h.chat()
        assert chat.compactions == 1, "the pushed turn cancelled the compaction"
        assert tg.texts(OWNER) == ["echo: big", "echo: after the summary"]
        assert not any(m == "POST" and p.endswith("/cancel") for m, p, _ in fake_eve.requests)
    finally:
        await h.stop()


async def test_a_pushed_turn_eve_keeps_failing_on_tells_the_chat_in_one_line(tmp_path: Path, tg: FakeTelegram,
                                                                             fake_eve: FakeEve):
    """W4: eve answers the pushed turn's send with a server error every time: after the bounded
    attempts the chat hears one line naming it, never "please repeat", and the turn reads failed."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_EVE_SEND_ATTEMPTS="2")
    await h.start()
    try:
        await known_chat(h, tg)
        assert h.pushes is not None
        fake_eve.failing_texts = ["doomed"]
        state = await h.pushes.push_turn(A, "doomed report")
        await h.settled(30)
        texts = tg.texts(OWNER)[1:]
        assert len(texts) == 1 and "doomed report" in texts[0], texts
        assert "repeat" not in texts[0].lower() and "try again" not in texts[0].lower()
        done = await h.pushes.turn(A, state.id)
        assert done is not None and done.state == "failed" and done.failed
        fake_eve.failing_texts = []
        await tg.message("still here", user_id=OWNER)
        await h.settled()
        assert tg.texts(OWNER)[-1] == "echo: still here"
    finally:
        await h.stop()


async def test_a_pushed_turn_whose_session_is_lost_says_so_without_asking_to_repeat(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """W4 for a session lost mid-turn (no progress within the busy timeout)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="1")
    await h.start()
    try:
        await known_chat(h, tg)
        assert h.pushes is not None
        fake_eve.stuck = True
        state = await h.pushes.push_turn(A, "nightly report")
        await h.settled(eve_quiet=False)
        texts = tg.texts(OWNER)[1:]
        assert len(texts) == 1 and "nightly report" in texts[0] and "repeat" not in texts[0].lower(), texts
        done = await h.pushes.turn(A, state.id)
        assert done is not None and done.state == "failed"
    finally:
        await h.stop()


async def test_only_chats_iva_knows_take_a_pushed_turn(harness: Harness, tg: FakeTelegram):
    assert harness.pushes is not None
    with pytest.raises(PushError) as err:
        await harness.pushes.push_turn("424242", "hello?")
    assert err.value.status == 404 and err.value.field == "chat"


# -- notifications -----------------------------------------------------------------------------

async def test_a_notification_is_sent_once_per_key_and_the_next_turn_is_told_of_it(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """W5: sent through the outbox without the model (rendered as an answer), once per key; the
    chat's next turn tells eve what was sent meanwhile, and the one after does not repeat it."""
    await known_chat(harness, tg)
    assert harness.pushes is not None
    first, created = await harness.pushes.notify(A, "Build **broke** on main", key="ci:1234")
    again, created_again = await harness.pushes.notify(A, "Build **broke** on main", key="ci:1234")
    assert created and not created_again and again == first
    await harness.settled()
    assert tg.texts(OWNER) == ["echo: hello", "Build broke on main"]
    assert tg.sent(OWNER)[-1].get("entities") or tg.sent(OWNER)[-1].get("parse_mode")  # rendered as Markdown
    assert len(sends(fake_eve)) == 1  # the model never saw it
    await tg.message("what did that alert say?", user_id=OWNER)
    await harness.settled()
    told = sends(fake_eve)[-1]
    assert "[sent meanwhile]" in told["clientContext"] and "Build **broke** on main" in told["clientContext"]
    await tg.message("thanks", user_id=OWNER)
    await harness.settled()
    assert "[sent meanwhile]" not in str(sends(fake_eve)[-1].get("clientContext") or "")


# -- the owner API over HTTP -------------------------------------------------------------------

@pytest.fixture
async def api(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[tuple[Harness, httpx.AsyncClient]]:
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_API_TOKEN=API_TOKEN)
    await h.start()
    assert h.db is not None and h.pushes is not None and h.reminders is not None
    owner = OwnerApi(API_TOKEN, Notebook(h.db, h.s.store, notebook_config(h.settings)), h.s.store)
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[PushApi(owner.guard, h.pushes, h.reminders).routes])
    await listener.start()
    assert listener._runner is not None
    port = listener._runner.addresses[0][1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"authorization": f"Bearer {API_TOKEN}"}) as client:
            yield h, client
    finally:
        await listener.stop()
        await h.stop()


async def test_the_owner_api_pushes_a_turn_and_reports_its_state(api: tuple[Harness, httpx.AsyncClient],
                                                                tg: FakeTelegram):
    h, client = api
    await known_chat(h, tg)
    r = await client.post(f"/v1/chats/{A}/turns", json={"text": "status report", "key": "k-1"})
    assert r.status_code == 202, r.text
    turn = r.json()
    assert set(turn) >= {"id", "state"} and turn["state"] in ("queued", "running", "answered")
    again = await client.post(f"/v1/chats/{A}/turns", json={"text": "status report", "key": "k-1"})
    assert again.status_code == 202 and again.json()["id"] == turn["id"]
    await h.settled()
    got = await client.get(f"/v1/chats/{A}/turns/{turn['id']}")
    assert got.status_code == 200 and got.json()["state"] == "answered" and got.json()["finished_at"]
    assert tg.texts(OWNER)[-1] == "echo: status report"
    r = await client.post(f"/v1/chats/{A}/messages", json={"text": "plain note", "key": "n-1"})
    assert r.status_code == 202 and r.json()["id"].startswith("m")
    await h.settled()
    assert tg.texts(OWNER)[-1] == "plain note"


BAD_TURNS = [
    ({}, "text"), ({"text": ""}, "text"), ({"text": "   "}, "text"), ({"text": 5}, "text"),
    ({"text": "x" * 16_001}, "text"), ({"text": "ok", "key": ""}, "key"), ({"text": "ok", "key": 7}, "key"),
    ({"text": "ok", "key": "k" * 201}, "key"), ({"text": "ok", "key": "a\nb"}, "key"), ({"text": "ok", "by": ""}, "by"),
    ({"text": "ok", "by": ["x"]}, "by"), ({"text": "ok", "when": "now"}, "when"),
]


async def test_bad_input_of_every_field_is_a_json_error_naming_it(api: tuple[Harness, httpx.AsyncClient],
                                                                 tg: FakeTelegram):
    """W6: each bad field → 400 with that field named; nothing is queued."""
    h, client = api
    await known_chat(h, tg)
    for body, field in BAD_TURNS:
        r = await client.post(f"/v1/chats/{A}/turns", json=body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.status_code, r.text)
    for body, field in [({}, "text"), ({"text": "ok", "key": 3}, "key"), ({"text": "ok", "by": "me"}, "by")]:
        r = await client.post(f"/v1/chats/{A}/messages", json=body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
    r = await client.post(f"/v1/chats/{A}/turns", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["field"] == "body"
    r = await client.post(f"/v1/chats/{A}/turns", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "bad_json"
    r = await client.post(f"/v1/chats/{A}/turns", content=b"text=hi", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = await client.post("/v1/chats/777/turns", json={"text": "hi"})
    assert r.status_code == 404 and r.json()["code"] == "no_chat" and r.json()["field"] == "chat"
    r = await client.post("/v1/chats/seven/turns", json={"text": "hi"})
    assert r.status_code == 400 and r.json()["code"] == "bad_chat" and r.json()["field"] == "chat"
    r = await client.post(f"/v1/chats/{A}:x/messages", json={"text": "hi"})
    assert r.status_code == 400 and r.json()["field"] == "chat"
    r = await client.get(f"/v1/chats/{A}/turns/t999999")
    assert r.status_code == 404 and r.json()["field"] == "id"
    r = await client.get(f"/v1/chats/{A}/turns/nonsense")
    assert r.status_code == 404
    r = await client.post(f"/v1/chats/{A}/turns", json={"text": "hi"}, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = await client.post(f"/v1/chats/{A}/turns", json={"text": "hi"}, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    assert not h.observe("SELECT id FROM diskqueue_messages WHERE payload LIKE '%\"pushed\"%'")


async def test_a_turn_of_another_chat_is_not_found(api: tuple[Harness, httpx.AsyncClient], tg: FakeTelegram):
    h, client = api
    await known_chat(h, tg)
    await known_chat(h, tg, user=2)
    r = await client.post("/v1/chats/2/turns", json={"text": "for two"})
    assert r.status_code == 202
    other = await client.get(f"/v1/chats/{A}/turns/{r.json()['id']}")
    assert other.status_code == 404
    await h.settled()


def _state(h: Harness, state: ChatState) -> bool:
    chat = h.maybe_chat()
    return chat is not None and state_of(chat) is state


def _queued(h: Harness) -> int:
    return int(h.observe("SELECT count(*) FROM diskqueue_messages WHERE state = 0")[0][0])


# -- a SIGKILL at every statement --------------------------------------------------------------

SWEEP_USERS = range(100, 400)


async def test_a_kill_at_every_statement_of_a_pushed_turn(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """W3: "killed" before every database statement from the push's commit to the turn's parking
    (the image a SIGKILL leaves, tests/harness.py), restarted, and the caller pushing again with
    the same key, as a client does whose request failed: answered once — twice only in the
    labelled window (Telegram had the answer, its "sent" record had not committed)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_ALLOWED_USER_IDS=",".join(map(str, SWEEP_USERS)))
    await h.start()
    reply = "echo: the brief"
    try:
        for k, user in enumerate(SWEEP_USERS, start=1):
            await known_chat(h, tg, user)
            assert h.db is not None
            db, image = h.db, tmp_path / f"k{k}-image"
            db.kill_at, db.image = db.statements + k, image

            async def push(user: int = user, k: int = k) -> None:
                assert h.pushes is not None
                try:
                    await h.pushes.push_turn(str(user), "the brief", key=f"sweep-{k}")
                except sqlite3.OperationalError:
                    pass  # killed inside the push: the caller saw no 202 and pushes again

            await push()
            await h.until(lambda db=db: db.killed.is_set() or h.quiet(), timeout=20, what="killed or done")
            if not db.killed.is_set():
                await h.settled()
                assert tg.texts(user).count(reply) == 1
                assert k > 10
                return
            sent_at_kill = tg.texts(user).count(reply)
            pending_at_kill = _pending_in(image, h.settings.db_path.name)
            await h.restart_from(image)
            await push()
            await h.settled(30)
            after = tg.texts(user)
            window = sent_at_kill >= 1 and pending_at_kill
            assert after.count(reply) == (2 if window and after.count(reply) == 2 else 1), (k, after, window)
            assert [t for t in after if t not in (reply, "echo: hello")] == [], (k, after)
            mine = [b for b in pushed_sends(fake_eve)
                    if str(user) in str({k: v for k, v in b.items() if k != "idempotencyKey"})]  # the key names the bot
            assert len(mine) <= 2
        raise AssertionError("the scenario has more statements than the sweep has users")
    finally:
        await h.stop()


def _pending_in(image: Path, name: str) -> bool:
    conn = sqlite3.connect(image / name)
    try:
        return bool(conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()[0])
    finally:
        conn.close()


async def test_a_pushed_turn_eve_fails_itself_tells_the_chat_in_one_line(harness: Harness, tg: FakeTelegram):
    """W4 for eve's own turn.failed (the model call failed): the pushed turn's line, not the
    person's "please try again", and the turn reads failed."""
    await known_chat(harness, tg)
    assert harness.pushes is not None
    state = await harness.pushes.push_turn(A, "weekly digest [[fail=500]]")
    await harness.settled()
    texts = tg.texts(OWNER)[1:]
    assert len(texts) == 1 and "weekly digest" in texts[0] and "try again" not in texts[0].lower(), texts
    done = await harness.pushes.turn(A, state.id)
    assert done is not None and done.state == "failed" and done.failed == "MODEL_CALL_FAILED"


async def test_a_turn_pushed_while_a_question_waits_on_the_person_never_answers_it(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """While a turn waits on the person (an open question, where their next message is the answer
    at once), a pushed turn is not that answer: it waits for the turn's end, then goes alone."""
    h = harness
    await tg.message("name? [[ask=What should I call it?]]", user_id=OWNER)
    await tg.wait_texts(1)
    await h.until(lambda: bool((c := h.maybe_chat()) and c.waiting_input), what="waiting on the person")
    assert h.pushes is not None
    state = await h.pushes.push_turn(A, "nightly digest")
    await h.until(lambda: _queued(h) == 1, what="the pushed turn queued")
    assert (await h.chat()).waiting_input and not pushed_sends(fake_eve)
    await tg.message("Bob", user_id=OWNER)
    await h.settled()
    assert tg.texts(OWNER)[1:] == ["answered: Bob", "echo: nightly digest"], tg.texts(OWNER)
    [body] = pushed_sends(fake_eve)
    assert body["turnPolicy"] == "queue"
    done = await h.pushes.turn(A, state.id)
    assert done is not None and done.state == "answered"


async def test_a_lone_surrogate_in_a_pushed_or_reminder_text_becomes_a_replacement_character(
        api: tuple[Harness, httpx.AsyncClient], tg: FakeTelegram):
    """JSON allows "\\ud83d" alone (a caller's or a model's broken emoji); SQLite cannot store it.
    As in a reply (F6), it becomes U+FFFD: the turn and the reminder go, never a 500."""
    h, client = api
    await known_chat(h, tg)
    json_ = {"content-type": "application/json"}
    r = await client.post(f"/v1/chats/{A}/turns", content=b'{"text": "hi \\ud83d there"}', headers=json_)
    assert r.status_code == 202, r.text
    r = await client.post(f"/v1/chats/{A}/reminders", content=b'{"text": "tea \\ud83d", "cron": "0 9 * * *"}',
                          headers=json_)
    assert r.status_code == 201, r.text
    await h.settled()
    assert tg.texts(OWNER)[-1] == "echo: hi \ufffd there"
    listed = (await client.get(f"/v1/chats/{A}/reminders")).json()["reminders"]
    assert [x["text"] for x in listed] == ["tea \ufffd"]


async def test_the_notifications_since_eve_was_told_are_read_without_walking_the_chats_answers(tmp_path: Path):
    """W5's read before every turn costs the same however many answers the chat was sent: it
    reads the chat's notifications (a range of the outbox's key index), not every sent row that
    retention kept (SQLite's virtual-machine steps, counted, for 50 and for 2 000 answers)."""
    db, _, store = await open_store(tmp_path / "state.db")
    try:
        async def answers(first: int, n: int) -> None:
            for i in range(first, first + n):
                row = await store.put_outgoing(A, f"answer:{i}", OWNER, None, f"answer {i}")
                assert row is not None
            await db.execute("UPDATE outbox SET state = 'sent', sent_at = 1 WHERE state = 'pending'")

        async def steps() -> tuple[int, list[str]]:
            counted = [0]

            def count() -> int:
                counted[0] += 1
                return 0

            db.conn.set_progress_handler(count, 10)
            try:
                rows = await PushStore(db).sent_since_told(A, notify_keys(A), TOLD_AT_MOST)
            finally:
                db.conn.set_progress_handler(None, 10)
            return counted[0], [r["text"] for r in rows]

        await answers(0, 25)
        await store.put_outgoing(A, notify_keys(A) + "n1", OWNER, None, "build broke")
        await store.put_outgoing("other", notify_keys("other") + "n1", OWNER, None, "not this chat's")
        await answers(25, 25)
        few, texts = await steps()
        assert texts == ["build broke"]
        await answers(50, 1950)
        many, texts = await steps()
        assert texts == ["build broke"]
        assert many <= few + 5, (few, many)  # walking 2 000 answers: ~40 times as many steps
    finally:
        await db.close()
