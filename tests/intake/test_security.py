"""Who may do what (issue 12, S2, S3, S5) — in process on the fakes (tests/harness.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridge.app import notebook_config
from bridge.notebook import Notebook
from bridge.web.listener import Listener
from bridge.web.owner_api import OwnerApi
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

OTHER = 3  # allowed to talk to the bot, but did not ask
GROUP = -1005


@pytest.fixture
async def harness(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_ALLOWED_USER_IDS=f"{FRIEND},{OTHER}")
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


async def _group_question(tg: FakeTelegram, h: Harness) -> dict:
    text = f"@{BOT_USERNAME} deploy? [[ask=Deploy to prod?|approve|cancel]]"
    await tg.message(text, user_id=FRIEND, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await tg.wait_texts(1, GROUP)
    await h.until(lambda: (c := h.maybe_chat(str(GROUP))) is not None and c.waiting_input, what="waiting on input")
    return tg.sent(GROUP)[0]


def _answers(tg: FakeTelegram) -> list[str | None]:
    return [c.get("text") for c in tg.calls_of("answerCallbackQuery")]


async def test_a_prompt_answers_only_for_the_person_asked_or_an_owner(harness: Harness, tg: FakeTelegram,
                                                                      fake_eve: FakeEve):
    """S3: in a group, someone else's press is refused with a short answer; the asker's (or an
    owner's) goes to eve."""
    prompt = await _group_question(tg, harness)
    await tg.press(prompt, "Approve", user_id=OTHER)
    await tg.wait_for(lambda: len(_answers(tg)) == 1, 10, "the refusal")
    assert _answers(tg) == ["This question is for the person who asked."]
    assert (await harness.chat(str(GROUP))).waiting_input  # nothing reached eve
    await tg.press(prompt, "Cancel", user_id=OWNER)  # owners may always answer
    await harness.settled()
    assert _answers(tg)[-1] == "✓"
    assert tg.texts(GROUP)[-1].endswith("answered: cancel")


async def test_a_forged_button_from_another_chat_answers_nothing(harness: Harness, tg: FakeTelegram):
    """S3: callback data is bound to its chat: the same data pressed elsewhere is refused."""
    prompt = await _group_question(tg, harness)
    button = prompt["reply_markup"]["inline_keyboard"][0][0]
    forged = {"id": "forged-1", "from": {"id": FRIEND, "is_bot": False, "first_name": "Bob"}, "chat_instance": "x",
              "data": button["callback_data"],
              "message": {"message_id": 1, "date": 0, "chat": {"id": FRIEND, "type": "private"}, "text": "x"}}
    await tg.add_update({"callback_query": forged})
    await tg.wait_for(lambda: len(_answers(tg)) == 1, 10, "the refusal")
    assert _answers(tg) == ["This question is closed."]
    assert (await harness.chat(str(GROUP))).waiting_input


async def test_strangers_presses_are_answered_without_holding_the_loop(harness: Harness, tg: FakeTelegram):
    """S3: a stranger's press costs the ingest loop no Bot API round trip: while Telegram holds
    the answer, the next update is handled."""
    prompt = await _group_question(tg, harness)
    gate = asyncio.Event()

    async def hold(_: dict) -> None:
        await gate.wait()

    tg.hooks["answerCallbackQuery"] = hold
    try:
        await tg.press(prompt, "Approve", user_id=666)
        await tg.wait_for(lambda: tg.in_flight("answerCallbackQuery") == 1, 10, "the held answer")
        await tg.message("/help", user_id=OWNER)
        await tg.wait_texts(1, OWNER, timeout=10)
    finally:
        gate.set()
        del tg.hooks["answerCallbackQuery"]


async def test_status_shows_the_session_only_to_owners(harness: Harness, tg: FakeTelegram):
    """S2: the eve session id is an internal; a friend's /status says what they need."""
    for user in (OWNER, FRIEND):
        await tg.message("hi", user_id=user)
    await harness.settled()
    sessions = {u: (await harness.chat(str(u))).eve_session for u in (OWNER, FRIEND)}
    for user in (OWNER, FRIEND):
        await tg.message("/status", user_id=user)
        await tg.wait_texts(2, user)
    assert sessions[OWNER] and sessions[OWNER] in tg.texts(OWNER)[-1]
    assert sessions[FRIEND] and sessions[FRIEND] not in tg.texts(FRIEND)[-1]
    assert "wrun_" not in json.dumps(tg.texts(FRIEND))


async def test_a_failed_download_logs_no_token(tg: FakeTelegram, fake_eve: FakeEve, in_process_factory,
                                              tmp_path: Path) -> None:
    """S5: aiohttp's error text for a failed download holds the file URL, /file/bot<token>/…:
    the log line says what failed, with the token removed. In process the events are caught
    before rendering and rendered as the daemon renders them (InProcess.logs: the redactor with
    the settings' secrets, then JSON); the rendered lines are then checked for every secret as
    daemon_factory checks a daemon's log."""
    from tests.conftest import secret_leaks
    from tests.fakes.telegram import TOKEN

    bridge = in_process_factory(IVA_LOG_LEVEL="debug")
    with bridge.catching_logs():
        await bridge.start()
        tg.files["gone1"] = b"bytes"
        tg.unreadable.add("gone1")
        await tg.message(None, user_id=OWNER, extra={"caption": "look", "document": {
            "file_id": "gone1", "file_unique_id": "gone1", "file_name": "a.txt", "mime_type": "text/plain",
            "file_size": 5}})
        await tg.wait_texts(1)
        await bridge.settled()
    log = tmp_path / "rendered.log"
    log.write_text(bridge.logs())
    logs = log.read_text()
    assert "telegram_download_failed" in logs
    assert TOKEN.partition(":")[2] not in logs and "***" in logs
    assert secret_leaks(log, bridge.env) == []


async def test_files_from_a_local_bot_api_server_are_read_from_its_disk(harness: Harness, tg: FakeTelegram,
                                                                        fake_eve: FakeEve, tmp_path: Path):
    """A local Bot API server (--local) gives an absolute file_path and no download URL for it:
    the file is read from disk (before, every download there failed, logging the token)."""
    local = tmp_path / "served" / "doc.txt"
    local.parent.mkdir()
    local.write_bytes(b"local bytes")
    tg.local_files["loc1"] = local
    await tg.message(None, user_id=OWNER, extra={"caption": "read it", "document": {
        "file_id": "loc1", "file_unique_id": "loc1", "file_name": "doc.txt", "mime_type": "text/plain",
        "file_size": 11}})
    await harness.settled()
    body = fake_eve.sends()[-1]["message"]
    assert isinstance(body, list) and any(p.get("type") == "file" for p in body), body
    assert "could not be fetched" not in json.dumps(body)


async def test_blocking_the_bot_in_a_private_chat_keeps_the_notebook(tmp_path: Path, tg: FakeTelegram,
                                                                      fake_eve: FakeEve):
    """Blocking is not deleting the chat: the notes stay (and come back into use when the person
    writes again)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    await h.start()
    try:
        await tg.message("hello", user_id=OWNER)
        await h.settled()
        assert h.s.notebook is not None
        await h.s.notebook.save(str(OWNER), "fact", "the sky is blue", description="a fact")
        bot = {"id": 42, "is_bot": True, "first_name": "Iva"}
        await tg.add_update({"my_chat_member": {
            "chat": {"id": OWNER, "type": "private", "first_name": "Ann"},
            "from": {"id": OWNER, "is_bot": False, "first_name": "Ann"}, "date": 1,
            "old_chat_member": {"status": "member", "user": bot},
            "new_chat_member": {"status": "kicked", "user": bot, "until_date": 0},
        }})
        await h.settled()
        assert (await h.chat()).blocked
        assert [n.name for n in await h.s.notebook.notes(str(OWNER))] == ["fact"]
    finally:
        await h.stop()


async def test_the_bot_removed_from_a_group_archives_its_notes_before_deleting(tmp_path: Path, tg: FakeTelegram,
                                                                              fake_eve: FakeEve):
    """N8 with S-review: the group's notes go, but to the archive first: the owner can restore."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    await h.start()
    try:
        await tg.message(f"@{BOT_USERNAME} hello", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                         entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
        await h.settled()
        nb = h.s.notebook
        assert nb is not None
        await nb.save(str(GROUP), "plan", "ship friday", description="the plan")
        bot = {"id": 42, "is_bot": True, "first_name": "Iva"}
        await tg.add_update({"my_chat_member": {
            "chat": {"id": GROUP, "type": "supergroup", "title": "Group"},
            "from": {"id": OWNER, "is_bot": False, "first_name": "Ann"}, "date": 1,
            "old_chat_member": {"status": "member", "user": bot},
            "new_chat_member": {"status": "left", "user": bot},
        }})
        await h.settled()
        assert await nb.notes(str(GROUP)) == []
        assert await nb.restore(str(GROUP)) == 1
        assert [n.name for n in await nb.notes(str(GROUP))] == ["plan"]
    finally:
        await h.stop()


async def _raw(port: int, request: bytes) -> bytes:
    """One HTTP request as raw bytes (a client library will not send a header that is not UTF-8)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await reader.readuntil(b"\r\n")
    finally:
        writer.close()


async def test_an_authorization_header_that_is_not_utf8_is_401_not_500(harness: Harness):
    """Bytes that are not UTF-8 in ``Authorization`` are a wrong token (401), never a 500."""
    assert harness.db is not None
    owner = OwnerApi("the-api-token", Notebook(harness.db, harness.s.store, notebook_config(harness.settings)),
                     harness.s.store)
    listener = Listener("127.0.0.1:0", store=harness.s.store, queue=harness.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[owner.routes])
    await listener.start()
    try:
        assert listener._runner is not None
        port = listener._runner.addresses[0][1]
        for token in (b"Bearer \xff\xfe\xfd", b"\xc3(", b"Bearer the-api-token\x80"):
            status = await _raw(port, b"GET /v1/chats/1/spend HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                                + token + b"\r\nConnection: close\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 401"), (token, status)
    finally:
        await listener.stop()
