"""Stopping a turn, at the edges a review of issue 13 found (L*): a cancel eve does not take, a
late press of a finished draft's stop button, a stop during the compaction after a stopped turn,
a question open when the stop comes, a draft frame racing a question, a draft of wide characters.
Each failed on the code before its fix."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from bridge.chat.transitions import ChatState, state_of
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness
from tests.scenarios import cancels, compacting

LONG = " ".join(f"w{i}" for i in range(30))


async def test_a_failed_cancel_is_tried_again_on_the_next_poke(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: every try of eve_client's cancel fails; the person then writes (a poke) and repeats
    /stop: the cancel is tried again, and the turn's whole text never comes out marked "stopped"
    (nothing cancelled it again before the fix)."""
    await tg.message(f"{LONG} [[chunkdelay=0.25]]", user_id=OWNER)
    await tg.wait_for(lambda: tg.drafts(OWNER), 15, "a draft frame")
    fake_eve.cancel_errors = 5  # eve_client's RetryPolicy.attempts
    await tg.message("/stop", user_id=OWNER)
    await harness.until(lambda: fake_eve.cancel_errors == 0, what="every cancel try failed")
    await tg.message("hello?", user_id=OWNER)  # a poke
    await tg.message("/stop", user_id=OWNER)  # and the person asks again
    await harness.settled(timeout=30)
    assert len(cancels(fake_eve)) > 5, "the stop was never tried again"
    assert f"echo: {LONG}\n\n⏹ stopped" not in tg.texts()


async def test_a_late_stop_button_of_a_finished_draft_does_not_stop_the_next_turn(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: the person presses ■ on turn 1's draft as its answer lands; the update arrives when the
    queued message's turn already runs. It names turn 1's draft: nothing is cancelled and the
    second message is answered (turn 2 was cancelled before the fix)."""
    await tg.message("a b c d [[chunkdelay=0.2]]", user_id=OWNER)
    await tg.wait_for(lambda: tg.drafts(OWNER), 15, "turn 1's draft")
    first = int(tg.drafts(OWNER)[0]["draft_id"])
    await tg.message(f"second {LONG} [[chunkdelay=0.2]]", user_id=OWNER)  # queued behind turn 1
    await tg.wait_for(lambda: any(int(d["draft_id"]) != first for d in tg.drafts(OWNER)), 20, "turn 2's draft")
    await tg.stop_generation(OWNER, first)  # delivered late
    await harness.settled(timeout=30)
    assert cancels(fake_eve) == []
    assert tg.texts()[-1] == f"echo: second {LONG}"


@pytest.mark.eve_wire(26)  # eve 0.80 only: a compaction can be cancelled (1.x ignores the cancel)
async def test_stop_during_the_auto_compaction_after_a_stopped_turn(harness: Harness, tg: FakeTelegram,
                                                                    fake_eve: FakeEve):
    """L*/C4: a stopped turn parks straight into an auto compaction (the same busy period); a
    /stop during that compaction cancels it too (the turn's stop used to count for it: the
    compaction ran to its end)."""
    fake_eve.summary_delay = 8
    await tg.message(f"big [[tool=noop]] [[tokens=120000]] {LONG} [[chunkdelay=0.25]]", user_id=OWNER)
    await tg.wait_for(lambda: [d for d in tg.drafts(OWNER) if d["text"].startswith("echo")], 15, "text draft")
    await tg.message("/stop", user_id=OWNER)
    await harness.until(lambda: compacting(harness, fake_eve), what="eve compacting")
    await tg.message("/stop", user_id=OWNER)
    await harness.until(lambda: "Stopped the compaction; the conversation stays as it was." in tg.texts(),
                        what="the answer")
    await harness.settled(timeout=30)
    assert len(cancels(fake_eve)) == 2, cancels(fake_eve)
    assert (await harness.chat()).compactions == 0


async def test_no_draft_frame_lands_after_a_question(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L* (review): the question tool's progress frame is still on its way when the question
    comes; it must land before the question goes out, never after it (a "🔧 ask_question…" draft,
    with its stop button, under the question). Telegram holds the frame until the question
    arrives or 3 s pass, so the order is the code's, not the scheduler's."""
    fake_eve.ask_as_action = True
    question_arrived = asyncio.Event()
    landed: list[float] = []

    async def frame(params: dict[str, Any]) -> None:
        if "ask_question" in str(params.get("text")):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(question_arrived.wait(), 3)
            landed.append(time.monotonic())

    async def message(params: dict[str, Any]) -> None:
        if "Deploy" in str(params.get("text")):
            question_arrived.set()

    tg.hooks["sendMessageDraft"], tg.hooks["sendMessage"] = frame, message
    await tg.message("deploy? [[ask=Deploy to prod?|approve|cancel]]", user_id=OWNER)
    await tg.wait_for(lambda: any(c.method == "sendMessage" and "Deploy" in str(c.params.get("text"))
                                  and c.params.get("_ok") for c in tg.calls), 15, "the question")
    prompt = next(c for c in tg.calls if c.method == "sendMessage" and "Deploy" in str(c.params.get("text")))
    await tg.press(next(p for p in tg.sent() if "Deploy" in p["text"]), "Approve", user_id=OWNER)
    await harness.settled(timeout=30)
    assert tg.texts()[-1] == "answered: approve"
    assert all(at < prompt.at for at in landed), (landed, prompt.at)  # none at all is fine too


async def test_stop_while_a_question_is_open(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: /stop while the turn waits on the person (turn.waiting on input): eve cancels the
    turn, a later press changes nothing, the chat is free and the session kept."""
    await tg.message("deploy? [[ask=Deploy to prod?|approve|cancel]]", user_id=OWNER)
    await tg.wait_for(lambda: any(c.method == "sendMessage" and "Deploy" in str(c.params.get("text"))
                                  for c in tg.calls), 15, "the question")
    await harness.until(lambda: harness.maybe_chat().waiting_input, what="waiting on the person")
    await tg.message("/stop", user_id=OWNER)
    await harness.until(lambda: len(cancels(fake_eve)) == 1, what="the cancel")
    prompt = next(p for p in tg.sent() if "Deploy" in p["text"])
    await tg.press(prompt, "Approve", user_id=OWNER)
    await harness.settled(timeout=10)
    assert state_of(await harness.chat()) is ChatState.IDLE
    assert len(fake_eve.sessions) == 1  # the conversation stays


async def test_stop_while_a_question_is_open_on_an_eve_that_cannot_cancel_it(tmp_path, tg: FakeTelegram,
                                                                             fake_eve: FakeEve):
    """L*/F5 (review): a stop ends the wait on the person. If eve cannot end a turn waiting on
    input, the busy timeout applies from the stop (the chat is freed, the person told), instead
    of the seven days a question may stay open."""
    fake_eve.cancel_ignored_while_asking = True
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="1")
    await h.start()
    try:
        await tg.message("deploy? [[ask=Deploy to prod?|approve|cancel]]", user_id=OWNER)
        await h.until(lambda: h.maybe_chat() is not None and h.maybe_chat().waiting_input, what="waiting on the person")
        await tg.message("/stop", user_id=OWNER)
        await h.until(lambda: len(cancels(fake_eve)) == 1, what="the cancel")
        await h.settled(timeout=20, eve_quiet=False)
        assert state_of(await h.chat()) is ChatState.IDLE
        assert "repeat" in tg.texts()[-1]
    finally:
        await h.stop()


def test_a_long_draft_fits_telegram_limit_in_utf16_units():
    """L*: a long block of astral characters (emoji: two UTF-16 units each) is cut to Telegram's
    4 096 UTF-16 units (cut in code points it exceeded them: a 400, drafts off)."""
    from bridge.chat.live import DRAFT_CHARS, fit
    shown = fit("😀 " * 3000)
    assert len(shown.encode("utf-16-le")) // 2 <= DRAFT_CHARS


async def test_stop_after_a_question_open_longer_than_the_busy_timeout_keeps_the_session(
        tmp_path, tg: FakeTelegram, fake_eve: FakeEve):
    """L*/F5 (review): a question open longer than the busy timeout (allowed), then /stop on an
    eve that cancels it: the busy timeout counts from the stop, so the cancel lands, the chat is
    free and the session kept (it counted from the question and lost the session at once)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="2")
    await h.start()
    try:
        await tg.message("deploy? [[ask=Deploy to prod?|approve|cancel]]", user_id=OWNER)
        await h.until(lambda: h.maybe_chat() is not None and h.maybe_chat().waiting_input, what="waiting")
        await asyncio.sleep(3)  # the question stays open past the busy timeout: fine under F5
        await tg.message("/stop", user_id=OWNER)
        await h.until(lambda: len(cancels(fake_eve)) == 1, what="the cancel")
        await h.settled(timeout=20)
        assert state_of(await h.chat()) is ChatState.IDLE
        assert not any("repeat" in t for t in tg.texts()), tg.texts()
        await tg.message("still there?", user_id=OWNER)
        await h.settled(timeout=20)
        assert len(fake_eve.sessions) == 1, "the conversation was dropped by the stop"
    finally:
        await h.stop()
