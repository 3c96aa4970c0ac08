"""V6: every pause a person can act on is shown — eve's budget prompt (``limits.sessionUsage``) to
an owner with Continue / Stop and a bounded wait, a sign-in with its link, a kind Iva does not
know said in one line and the turn stopped — never a silent hang. In process, on the fake eve's
version 27 (the same scenarios on the real eve 1.0.1: tests/contract/test_contract_pauses.py)."""

from __future__ import annotations

from pathlib import Path

from bridge.chat.transitions import ChatState, state_of
from bridge.telegram.texts import t
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

GROUP = -100500
BUDGET = "[[ask=over budget]] [[askkind=session-limit]]"


def _buttons(sent: dict) -> list[str]:
    rows = (sent.get("reply_markup") or {}).get("inline_keyboard") or []
    return [b["text"] for row in rows for b in row]


async def test_a_budget_prompt_in_the_owners_chat_is_continued_by_a_button(tmp_path: Path, tg: FakeTelegram,
                                                                          fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        await tg.message(f"long job {BUDGET}", user_id=OWNER)
        await tg.wait_texts(1, OWNER)
        prompt = tg.sent(OWNER)[0]
        assert prompt["text"] == t("budget_prompt", "en") and _buttons(prompt) == ["Continue", "Stop"]
        await tg.press(prompt, "Continue", user_id=OWNER)
        await h.settled()
        assert tg.texts(OWNER)[1:] == ["answered: approve"]
        assert state_of(await h.chat()) is ChatState.IDLE
    finally:
        await h.stop()


async def test_the_owners_stop_ends_the_turn_with_one_line(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        await tg.message(f"long job {BUDGET}", user_id=OWNER)
        await tg.wait_texts(1, OWNER)
        session = (await h.chat()).eve_session
        await tg.press(tg.sent(OWNER)[0], "Stop", user_id=OWNER)
        await h.settled()
        assert tg.texts(OWNER)[1:] == [t("budget_stopped", "en")]
        chat = await h.chat()
        assert state_of(chat) is ChatState.IDLE and chat.eve_session == session  # the session stays
        await tg.message("and now?", user_id=OWNER)
        await h.settled()
        assert tg.texts(OWNER)[-1] == "echo: and now?"
    finally:
        await h.stop()


async def test_a_groups_budget_prompt_goes_to_the_owner_and_waits_for_them(tmp_path: Path, tg: FakeTelegram,
                                                                           fake_eve: FakeEve):
    """In a group nobody but an owner may let the assistant spend more: the group hears that the
    owner was asked, the owner gets the buttons in their private chat; a member's press is
    refused and a member's "Approve" written meanwhile is not an answer (it waits its turn)."""
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    where = dict(chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    try:
        await tg.message(f"group job {BUDGET}", user_id=FRIEND, **where)
        await tg.wait_texts(1, GROUP)
        await tg.wait_texts(1, OWNER)
        assert tg.texts(GROUP) == [t("budget_waiting_owner", "en")]
        prompt = tg.sent(OWNER)[0]
        assert _buttons(prompt) == ["Continue", "Stop"] and str(GROUP) in prompt["text"]
        await tg.press(prompt, "Continue", user_id=FRIEND)  # a member who got hold of the button
        await tg.message("Approve", user_id=FRIEND, **where)
        await tg.wait_for(lambda: tg.calls_of("answerCallbackQuery"), 10, "the press answered")
        assert [c.get("text") for c in tg.calls_of("answerCallbackQuery")] == [t("input_not_yours", "en")]
        await tg.press(prompt, "Continue", user_id=OWNER)
        await h.settled()
        answered, later = tg.texts(GROUP)[1:]
        assert answered == "answered: approve"
        assert later.startswith("echo: ") and later.endswith("Ann: Approve")  # its own turn, after
        assert tg.texts(OWNER) == [prompt["text"]]
    finally:
        await h.stop()


async def test_an_unanswered_budget_prompt_is_given_up_after_the_busy_timeout(tmp_path: Path, tg: FakeTelegram,
                                                                              fake_eve: FakeEve):
    """A budget prompt never holds a chat for ever: after IVA_BUSY_TIMEOUT the turn is stopped with
    one line, the session kept (eve keeps it over budget: the next message meets the prompt)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="1")
    await h.start()
    where = dict(chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    try:
        await tg.message(f"group job {BUDGET}", user_id=FRIEND, **where)
        await tg.wait_texts(2, GROUP, timeout=20)
        assert tg.texts(GROUP) == [t("budget_waiting_owner", "en"), t("budget_given_up", "en")]
        await h.settled()
        chat = await h.chat(str(GROUP))
        assert state_of(chat) is ChatState.IDLE and chat.eve_session and not chat.reset_mark
        await tg.message(f"again {BUDGET}", user_id=FRIEND, **where)
        await tg.wait_texts(4, GROUP, timeout=20)
        assert tg.texts(GROUP)[2:] == [t("budget_waiting_owner", "en"), t("budget_given_up", "en")]
    finally:
        await h.stop()


async def test_a_budget_prompt_survives_a_restart_as_a_bounded_wait(tmp_path: Path, tg: FakeTelegram,
                                                                    fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="1")
    await h.start()
    await tg.message(f"long job {BUDGET}", user_id=OWNER)
    await tg.wait_texts(1, OWNER)
    await h.until(lambda: h.maybe_chat() and h.maybe_chat().waiting_input, what="waiting on the owner")
    await h.stop()
    await h.start()
    try:
        await tg.wait_texts(2, OWNER, timeout=20)
        assert tg.texts(OWNER)[1] == t("budget_given_up", "en")
        await h.settled()
        assert state_of(await h.chat()) is ChatState.IDLE
    finally:
        await h.stop()


async def test_a_sign_in_is_shown_with_its_link(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        await tg.message("[[ask=Sign in to Example]] [[askkind=sign-in]] [[signin=https://example.test/auth?x=1]]",
                         user_id=OWNER)
        await tg.wait_texts(1, OWNER)
        sent = tg.sent(OWNER)[0]
        assert "Example" in sent["text"] and "https://example.test/auth?x=1" in sent["text"]
        rows = sent["reply_markup"]["inline_keyboard"]
        assert rows == [[{"text": "Sign in", "url": "https://example.test/auth?x=1"}]]
        await tg.message("/stop", user_id=OWNER)
        await h.settled()
    finally:
        await h.stop()


async def test_a_kind_iva_does_not_know_is_said_and_the_turn_stopped(tmp_path: Path, tg: FakeTelegram,
                                                                    fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        await tg.message("[[ask=Pay 5 EUR?|pay]] [[askkind=payment]]", user_id=OWNER)
        await h.settled()
        assert tg.texts(OWNER) == [t("input_unknown_kind", "en", kind="payment")]
        assert state_of(await h.chat()) is ChatState.IDLE
        await tg.message("next", user_id=OWNER)
        await h.settled()
        assert tg.texts(OWNER)[-1] == "echo: next"
    finally:
        await h.stop()


async def test_the_owners_continue_goes_past_a_busy_groups_queue(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """V6: the owner's press is claimed wherever it is in the queue — behind more of the group's
    messages than one steer takes (IVA_BATCH) — and the messages stay queued, in order."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BATCH="3")
    await h.start()
    where = dict(chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    try:
        await tg.message(f"group job {BUDGET}", user_id=FRIEND, **where)
        await tg.wait_texts(1, OWNER)
        for n in range(6):
            await tg.message(f"meanwhile {n}", user_id=FRIEND, **where)
        await h.until(lambda: len(h.observe("SELECT id FROM diskqueue_messages WHERE state = 0")) >= 6, 10,
                      "the group's messages queued")
        await tg.press(tg.sent(OWNER)[0], "Continue", user_id=OWNER)
        await tg.wait_for(lambda: "answered: approve" in tg.texts(GROUP), 20, "the turn continued")
        await h.settled()
        later = [t for t in tg.texts(GROUP) if "meanwhile" in t]
        assert later and all(f"meanwhile {n}" in " ".join(later) for n in range(6))
        assert tg.texts(GROUP).index("answered: approve") < tg.texts(GROUP).index(later[0])
    finally:
        await h.stop()
