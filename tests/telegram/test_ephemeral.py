"""S7 in a group (Bot API 10.2): what only the asker needs is shown to them alone — an
ephemeral message (``ephemeral_message_parameters.receiver_user_id``) — and, where Telegram
refuses one, a plain message (a button's refusal: only the press's own answer). In process on the
fakes (tests/harness.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

GROUP = -1007
OTHER = 3
REFUSED = "Bad Request: ephemeral messages are not allowed in this chat"


@pytest.fixture
async def group_bot(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_ALLOWED_USER_IDS=f"{FRIEND},{OTHER}", IVA_NOTES_ENABLED="1")
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


async def say(tg: FakeTelegram, text: str, user: int) -> None:
    await tg.message(text, user_id=user, chat_id=GROUP, chat_type="supergroup")


def to(tg: FakeTelegram, user: int | None) -> list[str]:
    """The group's messages shown to ``user`` alone (None: to everyone)."""
    out = []
    for p in tg.sent(GROUP):
        receiver = (p.get("ephemeral_message_parameters") or {}).get("receiver_user_id")
        if receiver == user:
            out.append(p["text"])
    return out


async def test_status_stop_and_notes_go_to_the_asker_alone(group_bot: Harness, tg: FakeTelegram):
    await say(tg, "/status", FRIEND)
    await say(tg, "/notes", FRIEND)
    await group_bot.settled()
    status, notes = to(tg, FRIEND)
    assert status.startswith("Conversation: ") and notes == "Only the bot's owner can look into the notebook."
    assert to(tg, None) == []  # the group saw nothing

    await tg.message(f"@{BOT_USERNAME} slow one [[delay=3]]", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await group_bot.until(lambda: (c := group_bot.maybe_chat(str(GROUP))) is not None and c.busy, what="busy")
    await say(tg, "/stop", OTHER)  # not their turn
    await tg.wait_for(lambda: to(tg, OTHER), 10, "the refusal")
    assert to(tg, OTHER) == ["Only the person I'm answering (or an owner) can stop this."]
    await group_bot.settled()
    assert to(tg, None) == ["echo: Ann: slow one"]  # the turn went on, for everyone

    await say(tg, "/status", OWNER)  # an owner's too — and no eve session id in a group
    await say(tg, "/notes", OWNER)
    await group_bot.settled()
    chat = await group_bot.chat(str(GROUP))
    status, notebook = to(tg, OWNER)
    assert chat.eve_session and chat.eve_session not in status
    assert notebook == "📓 The notebook of this chat is empty."
    assert tg.texts(OWNER) == []  # not in private: shown in the group to the owner alone


async def test_where_telegram_refuses_ephemeral_plain_messages(group_bot: Harness, tg: FakeTelegram):
    tg.refuse_ephemeral = REFUSED
    await say(tg, "/status", FRIEND)
    await group_bot.settled()
    tried = [p for p in tg.calls_of("sendMessage") if p.get("ephemeral_message_parameters")]
    assert len(tried) == 1 and not tried[0].get("_ok")  # asked for once, refused
    [plain] = to(tg, None)
    assert plain.startswith("Conversation: ") and "wrun_" not in plain  # no internals for the group

    await say(tg, "/notes", OWNER)  # the notebook is never shown to the group: the owner's private chat has it
    await group_bot.settled()
    assert to(tg, None) == [plain, "I've sent you this chat's notebook in private."]
    assert tg.texts(OWNER)[0].startswith("Group\n📓")


async def _question(tg: FakeTelegram, h: Harness) -> dict[str, Any]:
    text = f"@{BOT_USERNAME} deploy? [[ask=Deploy to prod?|approve|cancel]]"
    await tg.message(text, user_id=FRIEND, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await tg.wait_texts(1, GROUP)
    await h.until(lambda: (c := h.maybe_chat(str(GROUP))) is not None and c.waiting_input, what="waiting on input")
    return tg.sent(GROUP)[0]


@pytest.mark.parametrize("refused", [False, True])
async def test_a_refused_press_is_shown_to_the_presser_alone(group_bot: Harness, tg: FakeTelegram, refused: bool):
    prompt = await _question(tg, group_bot)
    tg.refuse_ephemeral = REFUSED if refused else None
    query = await tg.press(prompt, "Approve", user_id=OTHER)
    await tg.wait_for(lambda: tg.calls_of("answerCallbackQuery"), 10, "the press's answer")
    await tg.wait_for(lambda: [p for p in tg.calls_of("sendMessage") if p.get("ephemeral_message_parameters")],
                      10, "the ephemeral try")
    assert [c.get("text") for c in tg.calls_of("answerCallbackQuery")] == ["This question is for the person who asked."]
    ephemeral = [p for p in tg.calls_of("sendMessage") if p.get("ephemeral_message_parameters")]
    assert ephemeral[0]["ephemeral_message_parameters"] == {"receiver_user_id": OTHER, "callback_query_id": query["id"]}
    assert to(tg, OTHER) == ([] if refused else ["This question is for the person who asked."])
    await tg.press(prompt, "Cancel", user_id=FRIEND)
    await group_bot.settled()
    assert to(tg, None)[-1].endswith("answered: cancel")
    assert len(to(tg, None)) == 2  # the question and its answer: nothing of the refusal for the group


async def test_new_in_a_group_follows_stops_rule(group_bot: Harness, tg: FakeTelegram):
    """/new cancels the running turn and drops everyone's waiting messages: in a group only an
    owner or a person the running turn answers may while it runs; anyone while the chat is idle."""
    await tg.message(f"@{BOT_USERNAME} slow one [[delay=3]]", user_id=FRIEND, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await group_bot.until(lambda: (c := group_bot.maybe_chat(str(GROUP))) is not None and c.busy, what="busy")
    await say(tg, "/new", OTHER)  # not their turn
    await tg.wait_for(lambda: to(tg, OTHER), 10, "the refusal")
    assert to(tg, OTHER) == ["Only the person I'm answering (or an owner) can start a new conversation now."]
    await group_bot.settled()
    assert to(tg, None) == ["echo: Ann: slow one"]  # the turn went on, for everyone
    chat = await group_bot.chat(str(GROUP))
    assert not chat.reset_requested and chat.eve_session

    await say(tg, "/new", OTHER)  # idle now: anyone may
    await group_bot.settled()
    assert to(tg, None)[-1] == "New conversation started."


async def _crash_while_answering(h: Harness, tg: FakeTelegram, text: str, chat_id: int, chat_type: str) -> None:
    """``text`` from the owner; Telegram holds the answer until the bridge is dead; then the restart."""
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(params: dict[str, Any]) -> None:
        held.set()
        await release.wait()  # Telegram answers only once the process is dead: nothing was sent

    tg.hooks["sendMessage"] = hold
    await tg.message(text, user_id=OWNER, chat_id=chat_id, chat_type=chat_type)
    await asyncio.wait_for(held.wait(), 15)
    await h.crash()
    del tg.hooks["sendMessage"]
    release.set()
    await tg.wait_for(lambda: not tg.in_flight("sendMessage"), 15, "the held call to end")
    await h.start()
    await h.settled()


async def test_the_notes_answer_is_durable_in_private_and_in_a_group(group_bot: Harness, tg: FakeTelegram):
    """/notes's answer commits with its dedupe mark: a crash before Telegram took it answers at
    the restart, once — in private, and in a group to the owner alone."""
    await _crash_while_answering(group_bot, tg, "/notes", OWNER, "private")
    assert tg.texts(OWNER) == ["📓 The notebook of this chat is empty."]
    await _crash_while_answering(group_bot, tg, "/notes", GROUP, "supergroup")
    assert to(tg, OWNER) == ["📓 The notebook of this chat is empty."] and to(tg, None) == []
    assert tg.texts(OWNER) == ["📓 The notebook of this chat is empty."]  # nothing more in private


@pytest.mark.parametrize("refused", [False, True])
async def test_reminders_in_a_group_go_to_the_asker_alone(group_bot: Harness, tg: FakeTelegram, refused: bool):
    """/reminders in a group (S7): the owner's list of that group's reminders is shown to the
    owner alone — ephemeral, or where Telegram will not, in the owner's private chat, whose
    button cancels the group's reminder — and a member's refusal to that member alone."""
    await tg.message("hi", user_id=OWNER)  # the owner's private chat, with a reminder of its own
    await tg.message(f"@{BOT_USERNAME} hi", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await group_bot.settled()
    rm = group_bot.reminders
    assert rm is not None
    await rm.set(str(GROUP), "water the plants", cron="0 8 * * *")
    await rm.set(str(OWNER), "private plan", cron="0 9 * * *")
    before, in_private = to(tg, None), len(tg.sent(OWNER))
    tg.refuse_ephemeral = REFUSED if refused else None
    await say(tg, "/reminders", FRIEND)
    await group_bot.settled()
    await say(tg, "/reminders", OWNER)
    await group_bot.settled()

    refusal = "Only the owner can see the reminders."
    if not refused:
        assert to(tg, FRIEND) == [refusal]
        [listing] = [p for p in tg.sent(GROUP)
                     if (p.get("ephemeral_message_parameters") or {}).get("receiver_user_id") == OWNER]
        assert to(tg, None) == before  # the group saw nothing
        assert len(tg.sent(OWNER)) == in_private  # and nothing went to private
    else:
        assert to(tg, None) == [*before, refusal, "I've sent you this chat's reminders in private."]
        [listing] = tg.sent(OWNER)[in_private:]
        assert listing["text"].startswith("Group\nReminders in this chat (1)")
    assert "water the plants" in listing["text"] and "private plan" not in listing["text"]
    assert all("water" not in text for text in to(tg, None))
    await tg.press(listing, "✖ water the plants", user_id=OWNER)
    await group_bot.settled()
    assert await rm.active(str(GROUP)) == []  # the button cancelled the group's reminder
    assert [r.text for r in await rm.active(str(OWNER))] == ["private plan"]
