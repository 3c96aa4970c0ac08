"""Topics in private chats (issue 24, P3; Bot API 9.3): each topic its own conversation.

In process (tests/harness.py); the fake Bot API keeps each private chat's topics as Telegram
does — createForumTopic there, a send into a topic that does not exist (or was deleted) answered
400 "message thread not found".
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from bridge.app import notebook_config
from bridge.intake.addressing import Address
from bridge.notebook import Notebook
from bridge.web.listener import Listener
from bridge.web.owner_api import OwnerApi
from bridge.web.push_api import PushApi
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness


@pytest.fixture
async def topical(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    """The bridge with the bot's topic mode on and the notebook on."""
    tg.private_topics_enabled = True
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


async def write(tg: FakeTelegram, text: str, thread: int | None) -> None:
    await tg.message(text, user_id=OWNER, thread_id=thread, is_topic=thread is not None)


def in_topic(tg: FakeTelegram, thread: int | None) -> list[str]:
    return [p["text"] for p in tg.sent(OWNER) if p.get("message_thread_id") == thread]


async def test_two_topics_are_two_conversations_and_new_in_one_leaves_the_other(topical: Harness, tg: FakeTelegram):
    a, b = tg.open_topic(OWNER, "Work"), tg.open_topic(OWNER, "Home")
    await write(tg, "hello work one two three [[chunkdelay=0.15]]", a)
    await write(tg, "hello home", b)
    await topical.settled()
    assert in_topic(tg, a) == ["echo: hello work one two three"] and in_topic(tg, b) == ["echo: hello home"]
    first_a, first_b = await topical.chat(f"{OWNER}/{a}"), await topical.chat(f"{OWNER}/{b}")
    assert first_a.eve_session and first_b.eve_session and first_a.eve_session != first_b.eve_session
    assert topical.maybe_chat(str(OWNER)) is None  # the root was never talked to
    # Drafts stream into the topic they answer.
    drafts = tg.drafts(OWNER)
    assert drafts and {d.get("message_thread_id") for d in drafts} == {a}

    notebook = topical.s.notebook
    assert notebook is not None
    await notebook.save(f"{OWNER}/{a}", "project", "Iva ships on Friday", description="the work project")
    assert OwnerApi._address(f"{OWNER}:{a}") == Address(OWNER, a)  # <chat>:<topic> in the owner API
    await write(tg, "/notes", a)
    await write(tg, "/notes", b)
    await topical.settled()
    assert "project — the work project" in in_topic(tg, a)[-1]
    assert in_topic(tg, b)[-1] == "📓 The notebook of this chat is empty."

    await write(tg, "/status", b)
    await write(tg, "/new", a)
    await topical.settled()
    assert "Conversation: " + first_b.eve_session in in_topic(tg, b)[-1]
    assert in_topic(tg, a)[-1].startswith("New conversation started.")
    await write(tg, "again", a)
    await write(tg, "again", b)
    await topical.settled()
    after_a, after_b = await topical.chat(f"{OWNER}/{a}"), await topical.chat(f"{OWNER}/{b}")
    assert after_a.eve_session != first_a.eve_session  # a new session in the topic of /new
    assert after_b.eve_session == first_b.eve_session  # the other topic kept its conversation
    assert [n.name for n in await notebook.notes(f"{OWNER}/{a}")] == ["project"]  # /new keeps notes
    assert await notebook.notes(f"{OWNER}/{b}") == []


async def test_topic_opens_a_conversation_of_its_own(topical: Harness, tg: FakeTelegram):
    await write(tg, "/topic Trip to Rome", None)
    await topical.settled()
    [made] = tg.calls_of("createForumTopic")
    assert made["chat_id"] == OWNER and made["name"] == "Trip to Rome"
    thread = next(t for t, name in tg.private_topics[OWNER].items() if name == "Trip to Rome")
    assert in_topic(tg, None)[-1] == "Opened the topic “Trip to Rome”: a conversation of its own. Write there."
    assert in_topic(tg, thread) and in_topic(tg, thread)[0].startswith("A new conversation: “Trip to Rome”.")
    await write(tg, "flights?", thread)
    await topical.settled()
    assert in_topic(tg, thread)[-1] == "echo: flights?"
    assert (await topical.chat(f"{OWNER}/{thread}")).eve_session


async def test_topic_when_the_bots_topic_mode_is_off(harness: Harness, tg: FakeTelegram):
    """With topics off nothing changes: /topic says so and asks Telegram nothing."""
    await tg.message("/topic Anything", user_id=OWNER)
    await harness.settled()
    assert tg.texts(OWNER) == ["Topics are off for this bot: its owner can turn on topic mode in @BotFather."]
    assert tg.calls_of("createForumTopic") == []


async def test_a_deleted_topic_is_answered_at_the_root_and_remembered(topical: Harness, tg: FakeTelegram,
                                                                      fake_eve: FakeEve):
    a = tg.open_topic(OWNER, "Doomed")
    await write(tg, "first", a)
    await topical.settled()

    async def delete_on_send(params: dict[str, object]) -> None:
        if params.get("message_thread_id") == a:
            tg.delete_topic(OWNER, a)  # deleted while its answer was on the way

    tg.hooks["sendMessage"] = delete_on_send
    await write(tg, "second", a)
    await topical.settled()
    root = in_topic(tg, None)
    assert root == ["A topic of ours is gone, so I answer its messages here.", "echo: second"]
    tries = [p for p in tg.calls_of("sendMessage") if p.get("message_thread_id") == a]
    assert len(tries) == 2  # "first" delivered, "second" tried there once
    gone = topical.observe("SELECT address FROM topics_gone")
    assert [r["address"] for r in gone] == [f"{OWNER}/{a}"]
    chat = await topical.chat(f"{OWNER}/{a}")
    assert chat.thread_id is None and not chat.blocked  # remembered: the root from now on

    # Whatever the conversation still has to say goes to the root at once, the note not again.
    async with topical.s.store.db.transaction():
        await topical.s.outbox.say(chat, "late", "a late word")
    await topical.s.outbox.flush(chat.address)
    assert in_topic(tg, None)[-1] == "a late word"
    assert len([p for p in tg.calls_of("sendMessage") if p.get("message_thread_id") == a]) == 2
    assert in_topic(tg, None).count("A topic of ours is gone, so I answer its messages here.") == 1
    # The root chat is its own conversation still.
    await write(tg, "at the root", None)
    await topical.settled()
    assert in_topic(tg, None)[-1] == "echo: at the root"


async def test_pushed_turns_messages_and_reminders_reach_a_private_topic_through_the_owner_api(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """Pushed turns and reminders can target a topic: ``<chat>:<topic>`` on the owner API lands in
    that topic of the private chat, its own conversation, and nowhere else."""
    token = "owner-api-token-0123456789"
    tg.private_topics_enabled = True
    now = [time.time()]
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_API_TOKEN=token)
    h.wall = lambda: now[0]
    await h.start()
    assert h.db is not None and h.pushes is not None and h.reminders is not None
    owner = OwnerApi(token, Notebook(h.db, h.s.store, notebook_config(h.settings)), h.s.store)
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[PushApi(owner.guard, h.pushes, h.reminders).routes])
    await listener.start()
    try:
        assert listener._runner is not None
        port = listener._runner.addresses[0][1]
        a, b = tg.open_topic(OWNER, "Work"), tg.open_topic(OWNER, "Home")
        await write(tg, "hello work", a)
        await write(tg, "hello home", b)
        await h.settled()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"authorization": f"Bearer {token}"}) as client:
            r = await client.post(f"/v1/chats/{OWNER}:{a}/turns", json={"text": "morning brief"})
            assert r.status_code == 202, r.text
            await h.settled()
            assert in_topic(tg, a)[-1] == "echo: morning brief"
            r = await client.post(f"/v1/chats/{OWNER}:{a}/messages", json={"text": "plain note"})
            assert r.status_code == 202, r.text
            await h.settled()
            assert in_topic(tg, a)[-1] == "plain note"
            at = now[0] + 120
            r = await client.post(f"/v1/chats/{OWNER}:{a}/reminders",
                                  json={"text": "stretch", "at": datetime.fromtimestamp(at, UTC).isoformat()})
            assert r.status_code == 201, r.text
            listed = await client.get(f"/v1/chats/{OWNER}:{a}/reminders")
            assert [x["text"] for x in listed.json()["reminders"]] == ["stretch"]
            assert (await client.get(f"/v1/chats/{OWNER}:{b}/reminders")).json()["reminders"] == []
            now[0] = at + 1
            assert await h.reminders.fire_due() == [f"{OWNER}/{a}"]
            await h.settled()
            assert in_topic(tg, a)[-1] == "echo: stretch"
        assert in_topic(tg, b) == ["echo: hello home"]  # the other topic heard none of it
        assert in_topic(tg, None) == []  # nor the chat's root
    finally:
        await listener.stop()
        await h.stop()
