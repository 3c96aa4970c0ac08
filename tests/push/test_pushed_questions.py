"""F11: a question a pushed turn or a reminder asks belongs to the people of its chat — in a
private chat its person, in a group anyone who may talk there — and a question nobody present
may answer keeps the busy timeout (bridge/chat/askers.py). In process, the fakes on loopback."""

from __future__ import annotations

from pathlib import Path

from bridge.chat.transitions import ChatState, state_of
from tests.fakes.clock import HandClock
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

STRANGER = 3  # nobody let them talk to the bot
GROUP = -1007
QUESTION = "[[ask=Tea or coffee?|tea|coffee]]"


def _answers(tg: FakeTelegram) -> list[str | None]:
    return [c.get("text") for c in tg.calls_of("answerCallbackQuery")]


async def _asked(h: Harness, tg: FakeTelegram, address: str, chat_id: int) -> dict:
    """The pushed turn's question, shown in the chat and waited on."""
    assert h.pushes is not None
    await h.pushes.push_turn(address, f"ask what they drink {QUESTION}")
    await h.until(lambda: (c := h.maybe_chat(address)) is not None and c.waiting_input, what="waiting on input")
    return next(m for m in tg.sent(chat_id) if m["text"] == "Tea or coffee?")


async def test_a_pushed_turns_question_in_a_persons_private_chat_is_theirs_to_press_and_to_answer_in_text(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """The person of the chat (an allowed user, not an owner) presses the button of a pushed
    turn's question (before: "this question is for the one who asked", and the chat stuck); with
    the notebook on (a pushed turn is an owner turn, N1) a second one's answer typed in text joins
    the turn (before: it waited behind it for ever)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    await h.start()
    try:
        friend = str(FRIEND)
        await tg.message("hello", user_id=FRIEND)
        await h.settled()
        prompt = await _asked(h, tg, friend, FRIEND)
        await tg.press(prompt, "Tea", user_id=FRIEND)
        await h.settled()
        assert _answers(tg) == ["✓"]
        assert tg.texts(FRIEND)[-1] == "answered: tea"
        await _asked(h, tg, friend, FRIEND)
        await tg.message("coffee, please", user_id=FRIEND)
        await h.settled()
        assert tg.texts(FRIEND)[-1] == "answered: coffee, please"
        assert state_of(await h.chat(friend)) is ChatState.IDLE
    finally:
        await h.stop()


async def test_a_pushed_turns_question_in_a_group_is_for_anyone_who_may_talk_there(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """In a group, an allowed member who wrote nothing of the turn may press (and /stop it); a
    stranger's press answers nothing."""
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        group = str(GROUP)
        mention = [{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}]
        await tg.message(f"@{BOT_USERNAME} hi", user_id=OWNER, chat_id=GROUP, chat_type="supergroup", entities=mention)
        await h.settled()
        prompt = await _asked(h, tg, group, GROUP)
        await tg.press(prompt, "Tea", user_id=STRANGER)
        await tg.wait_for(lambda: len(_answers(tg)) == 1, 10, "the stranger's press answered")
        assert (await h.chat(group)).waiting_input
        await tg.press(prompt, "Coffee", user_id=FRIEND)
        await h.settled()
        assert _answers(tg)[-1] == "✓" and tg.texts(GROUP)[-1] == "answered: coffee"
        await _asked(h, tg, group, GROUP)
        await tg.message("/stop", user_id=FRIEND, chat_id=GROUP, chat_type="supergroup")
        await h.settled()
        assert state_of(await h.chat(group)) is ChatState.IDLE
        assert "Stopped" in " ".join(tg.texts(GROUP)), tg.texts(GROUP)
    finally:
        await h.stop()


async def test_a_pushed_turns_question_nobody_present_may_answer_keeps_the_busy_timeout(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """A private chat whose person may no longer talk (no longer allowed) gets a pushed turn that
    asks: nobody there may answer, so the turn is not waited on for a week — the busy timeout
    (on the injected clock) frees the chat, in one line."""
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    await tg.message("hello", user_id=FRIEND)
    await h.settled()
    await h.stop()
    clock = HandClock()
    h = Harness(tmp_path / "state", tg, fake_eve, busy_clock=clock, IVA_ALLOWED_USER_IDS="", IVA_BUSY_TIMEOUT="600")
    await h.start()
    try:
        friend = str(FRIEND)
        await _asked(h, tg, friend, FRIEND)
        await h.until(lambda: clock.waiting == 1, what="the consumer waiting on its deadline")
        await clock.advance(601)
        await h.settled(eve_quiet=False)
        assert state_of(await h.chat(friend)) is ChatState.IDLE
        assert "could not carry out" in tg.texts(FRIEND)[-1], tg.texts(FRIEND)
    finally:
        await h.stop()
