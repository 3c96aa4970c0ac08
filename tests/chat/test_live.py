"""Live replies (issue 13, L*): drafts while the answer is written, the progress line of a tool,
and the stop — the draft's button and /stop — in process on the real store and the fakes.

Frames are timed by the fake Bot API's receipt times: a frame is sent no sooner than the
throttle after the last one was answered, so two receipts are never closer than the throttle.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bridge.chat.live import FRAME_INTERVAL
from bridge.chat.transitions import ChatState, state_of
from tests.fakes.clock import FakeClock
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness
from tests.scenarios import cancels, compacting

GROUP = -100500
OTHER = 3  # allowed to talk, but not the one asking
MENTION = [{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}]
SLOW = "one two three four five six seven eight nine ten [[chunkdelay=0.15]]"
SLOW_TEXT = "echo: one two three four five six seven eight nine ten"


async def test_a_slow_answer_shows_draft_frames_then_one_final_message(harness: Harness, tg: FakeTelegram):
    """L*: from the first delta the text shows as a draft, frame by frame, never two frames
    closer than the throttle; the final message goes once, with the whole text; no frame after it."""
    await tg.message(SLOW, user_id=OWNER)
    await harness.settled()
    assert tg.texts() == [SLOW_TEXT]
    drafts = tg.drafts(OWNER)
    assert len(drafts) >= 2, drafts
    assert len({d["draft_id"] for d in drafts}) == 1 and drafts[0]["draft_id"] != 0
    assert all(SLOW_TEXT.startswith(d["text"]) for d in drafts)  # the text so far, plain
    assert all(str(d.get("can_stop")).lower() == "true" for d in drafts)
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(drafts)]
    assert min(gaps) >= FRAME_INTERVAL, gaps
    final = next(c for c in tg.calls if c.method == "sendMessage")
    assert all(d["at"] < final.at for d in drafts)  # no frame lands after the answer


async def test_streaming_off_sends_no_drafts(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_STREAMING="off")
    await h.start()
    try:
        await tg.message(SLOW, user_id=OWNER)
        await h.settled()
        assert tg.texts() == [SLOW_TEXT] and tg.drafts() == []
    finally:
        await h.stop()


async def test_a_tool_at_work_shows_a_progress_line(harness: Harness, tg: FakeTelegram):
    """L*: while the agent runs a tool, the draft names what it does; text replaces it."""
    await tg.message("save it [[tool=notebook__chat_note_save]] [[delay=0.6]]", user_id=OWNER)
    await harness.settled()
    assert tg.texts() == ["echo: save it"]
    lines = [d["text"] for d in tg.drafts(OWNER)]
    assert "🔧 notebook: saving a note…" in lines, lines


async def test_groups_get_no_drafts(harness: Harness, tg: FakeTelegram):
    """Telegram has drafts in private chats only: a group gets typing, as before."""
    await tg.message(f"@{BOT_USERNAME} {SLOW}", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                     entities=MENTION)
    await harness.settled()
    assert tg.texts(GROUP) == [SLOW_TEXT.replace("echo: ", "echo: Ann: ")]
    assert tg.drafts() == []


async def test_the_draft_stop_button_cancels_the_turn_and_keeps_the_conversation(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: the stop button of the draft cancels the turn in eve by its id; what was written stays
    readable, marked as stopped; the next message is answered in the same session."""
    await tg.message("a b c d e f g h i j k l m n o p q r s t [[chunkdelay=0.3]]", user_id=OWNER)
    await tg.wait_for(lambda: tg.drafts(OWNER), 15, "a draft frame")
    draft = tg.drafts(OWNER)[0]
    session = (await harness.chat()).eve_session
    await tg.stop_generation(OWNER, int(draft["draft_id"]))
    await harness.settled()
    assert [c.get("turnId") for c in cancels(fake_eve)] == ["turn_0"]
    (stopped,) = tg.texts()
    written, mark = stopped.rsplit("\n\n", 1)
    assert mark == "⏹ stopped" and "echo: a b c d e f g h i j k l m n o p q r s t".startswith(written)
    assert not written.endswith(" t")  # cut off: the rest was never written
    chat = await harness.chat()
    assert state_of(chat) is ChatState.IDLE and chat.eve_session == session and not chat.stop_wanted
    await tg.message("next", user_id=OWNER)
    await harness.settled()
    assert tg.texts()[-1] == "echo: next" and (await harness.chat()).eve_session == session


async def test_stop_command_cancels_the_turn_and_answers(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: /stop does the same in any chat, never reaching eve as text; waiting messages stay
    queued and go next; /stop with nothing running says so."""
    await tg.message("a b c d e f g h i j k l m n o p q r s t [[chunkdelay=0.3]]", user_id=OWNER)
    await tg.wait_for(lambda: tg.drafts(OWNER), 15, "a draft frame")
    await tg.message("waiting one", user_id=OWNER)
    await tg.message("/stop", user_id=OWNER)
    await harness.settled()
    texts = tg.texts()
    assert "Stopped. Send your next message when you are ready." in texts
    assert any(t.endswith("⏹ stopped") for t in texts)
    assert texts[-1] == "echo: waiting one"
    assert not any("/stop" in str(body.get("message")) for s in fake_eve.sessions.values() for body in s.sends)
    assert len(cancels(fake_eve)) == 1
    await tg.message("/stop", user_id=OWNER)
    await harness.settled()
    assert tg.texts()[-1] == "Nothing is running right now."


async def test_in_a_group_only_the_asker_or_an_owner_may_stop(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: a group member whose message the turn does not answer cannot stop it."""
    harness = Harness(tmp_path / "state", tg, fake_eve, IVA_ALLOWED_USER_IDS=f"{FRIEND},{OTHER}")
    await harness.start()
    try:
        await _group_stop_refused(harness, tg, fake_eve)
    finally:
        await harness.stop()


async def _group_stop_refused(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve) -> None:
    await tg.message(f"@{BOT_USERNAME} a b c d e f g h [[chunkdelay=0.3]]", user_id=FRIEND, chat_id=GROUP,
                     chat_type="supergroup", entities=MENTION)
    await harness.until(lambda: (harness.maybe_chat(str(GROUP)) or None) is not None
                        and harness.maybe_chat(str(GROUP)).busy, what="the group's turn")
    await tg.message("/stop@iva_test_bot", user_id=OTHER, chat_id=GROUP, chat_type="supergroup")
    await harness.settled()
    texts = tg.texts(GROUP)
    assert "Only the person I'm answering (or an owner) can stop this." in texts
    assert texts[-1] == "echo: Ann: a b c d e f g h"
    assert cancels(fake_eve) == []


async def test_a_stop_survives_a_restart(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L*: a stop is durable: the cancel did not get through (eve answered 500) and the bridge
    died; the restart cancels the turn instead of resuming its output."""
    await tg.message("a b c d e f g h i j k l m n o p q r s t [[chunkdelay=0.3]]", user_id=OWNER)
    await tg.wait_for(lambda: tg.drafts(OWNER), 15, "a draft frame")
    fake_eve.cancel_errors = 10  # the client retries a cancel (idempotent): every try fails
    await tg.message("/stop", user_id=OWNER)
    await harness.until(lambda: len(cancels(fake_eve)) >= 1 and fake_eve.cancel_errors < 10, what="a failed cancel")
    await harness.crash()
    fake_eve.cancel_errors = 0
    await harness.start()
    await harness.settled()
    texts = tg.texts()
    assert "echo: a b c d e f g h i j k l m n o p q r s t" not in texts
    assert any(t.endswith("⏹ stopped") for t in texts)
    assert not (await harness.chat()).stop_wanted


async def test_a_429_on_drafts_slows_the_frames_and_the_final_still_goes(tmp_path: Path, tg: FakeTelegram,
                                                                         fake_eve: FakeEve):
    """L*: a 429 on a frame holds the chat for retry_after (on the pacer's injected clock): no
    frame goes meanwhile (skipped, never queued), and the final message waits the hold out, then
    is sent once, whole (before: a wall-time gap between two frames was asserted)."""
    clock = FakeClock()
    h = Harness(tmp_path / "state", tg, fake_eve, clock=clock)
    await h.start()
    try:
        tg.fail("sendMessageDraft", 429, retry_after=1, times=1)
        await tg.message(SLOW, user_id=OWNER)
        await tg.wait_for(lambda: clock.sleepers, 20, "the final waiting out the hold")
        assert len(tg.calls_of("sendMessageDraft")) == 1 and tg.texts() == []  # the refused frame alone
        await clock.advance(1)
        await h.settled()
        assert tg.texts() == [SLOW_TEXT]
        assert len(tg.calls_of("sendMessageDraft")) == 1  # nothing after the hold either: the answer was done
    finally:
        await h.stop()


async def test_a_message_stopped_before_eve_had_it_is_never_sent(harness: Harness, tg: FakeTelegram,
                                                                 fake_eve: FakeEve):
    """L*: /stop while the message is still on its way to eve, and the bridge dies before eve
    takes it: after the restart the stopped message is not sent at all; the chat is free."""
    fake_eve.hold_sends = True
    await tg.message("never mind", user_id=OWNER)
    await harness.until(lambda: fake_eve.held == 1, what="the send at eve")
    await tg.message("/stop", user_id=OWNER)
    await harness.until(lambda: harness.maybe_chat() is not None and harness.maybe_chat().stop_wanted,
                        what="the stop recorded")
    # The answer to /stop out and recorded first (a crash between its send and its record would
    # send it again: the documented window, not what this test is about).
    await harness.until(lambda: tg.texts() and not harness.observe(
        "SELECT count(*) FROM outbox WHERE state = 'pending'")[0][0], what="the answer to /stop recorded")
    await harness.crash()
    # eve drops a send whose caller is gone; wait until it sees the connection closed (a loaded
    # machine can release it first, which is a send eve took: not this test's case).
    await harness.until(lambda: fake_eve.held_callers_gone() == 1, what="eve to see the caller gone")
    fake_eve.hold_sends = False
    fake_eve.release_sends.set()
    await harness.start()
    await harness.settled()
    assert tg.texts() == ["Stopped. Send your next message when you are ready."]
    assert not [b for s in fake_eve.sessions.values() for b in s.sends if "never mind" in str(b.get("message"))]
    assert state_of(await harness.chat()) is ChatState.IDLE


async def test_stop_lets_a_compaction_finish_on_eve_1x(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L* on eve 1.x: eve ignores a cancel during a compaction (PROTOCOL-27.md §6), so /stop says
    it cannot be stopped midway; the compaction completes, and the message sent meanwhile is
    answered right after, once."""
    fake_eve.summary_delay = 3
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await harness.until(lambda: compacting(harness, fake_eve), what="eve compacting")
    await tg.message("/stop", user_id=OWNER)
    await tg.message("and then?", user_id=OWNER)
    await harness.settled(30)
    texts = tg.texts()
    assert any("cannot be stopped midway" in x for x in texts)
    assert "Stopped the compaction; the conversation stays as it was." not in texts
    assert texts.count("echo: and then?") == 1
    chat = await harness.chat()
    assert state_of(chat) is ChatState.IDLE and chat.compactions == 1 and not chat.stop_wanted


# eve 0.80 only: a compaction can be cancelled (1.x: test_stop_lets_a_compaction_finish_on_eve_1x)
@pytest.mark.eve_wire(26)
async def test_stop_stops_a_running_compaction(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """L* (like C4): /stop during a compaction cancels it in eve; the conversation stays as it
    was, the chat is free, and /stop says what it stopped."""
    fake_eve.summary_delay = 30
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await harness.until(lambda: compacting(harness, fake_eve), what="eve compacting")
    await tg.message("/stop", user_id=OWNER)
    await harness.settled()
    assert "Stopped the compaction; the conversation stays as it was." in tg.texts()
    assert len(cancels(fake_eve)) == 1
    chat = await harness.chat()
    assert state_of(chat) is ChatState.IDLE and chat.compactions == 0 and not chat.stop_wanted
