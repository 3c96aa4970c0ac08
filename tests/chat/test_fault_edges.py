"""Fault sequences a review found outside docs/faults.md (F4, F5, C4, R3): an ambiguous steer, a
kill anywhere in a steer (counted), an ambiguous send queued behind a late compaction, a turn
whose session.waiting never comes, a cancel that crosses its compaction's completion. Each
failed on the code before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.chat.transitions import ChatState, state_of
from bridge.telegram.texts import t
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness
from tests.scenarios import behind_a_late_compaction, eve_compacting


def _eve_running(h: Harness, fake_eve: FakeEve, text: str) -> bool:
    chat = h.maybe_chat()
    return chat is not None and any(s.running and text in json.dumps(s.events) for s in fake_eve.sessions.values()
                                    if s.id == chat.eve_session)


async def test_an_ambiguous_steer_is_not_answered_twice(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """F4 for a steer (immediate policy): eve took the steered message into the running turn and
    answered it there, but the send's answer was a 502. It goes to eve once and is answered once
    (it was put back in the queue and sent again as a turn of its own: two answers)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_TURN_POLICY="immediate")
    await h.start()
    try:
        await tg.message("slow one [[delay=1]]", user_id=OWNER)
        await h.until(lambda: _eve_running(h, fake_eve, "slow one"), what="eve running the turn")
        fake_eve.ambiguous_sends = 1
        await tg.message("actually, this", user_id=OWNER)
        await h.settled(30)
        sends = [b for s in fake_eve.sessions.values() for b in s.sends if "actually, this" in str(b.get("message"))]
        assert len(sends) == 1, (len(sends), tg.texts())
        assert tg.texts().count("echo: actually, this") == 1, tg.texts()
    finally:
        await h.stop()


async def test_an_ambiguous_send_queued_behind_a_compaction_is_not_sent_again(tmp_path: Path, tg: FakeTelegram,
                                                                              fake_eve: FakeEve):
    """F4 x C6: the compaction was released and a message sent meanwhile; eve takes it while it
    runs the late compaction (queued behind it, PROTOCOL.md §5) but the answer is a 502. The
    message goes to eve once and is answered once (the resume looked once, found no turn.started
    yet — the compaction still ran — and sent it again)."""
    h = await behind_a_late_compaction(tmp_path, tg, fake_eve, summary_delay=3.0)
    try:
        fake_eve.hold_sends = True
        await tg.message("second", user_id=OWNER)
        await h.until(lambda: fake_eve.held == 1, what="the send at eve")
        await h.until(lambda: eve_compacting(fake_eve), what="eve running the compaction")
        fake_eve.ambiguous_sends = 1
        fake_eve.release_sends.set()
        await h.settled(30)
        sends = [b for s in fake_eve.sessions.values() for b in s.sends if b.get("message") == "second"]
        assert len(sends) == 1, (len(sends), tg.texts())
        assert tg.texts().count("echo: second") == 1, tg.texts()
        assert state_of(await h.chat()) is ChatState.IDLE
    finally:
        await h.stop()


@pytest.mark.eve_wire(26)  # eve 0.80 only: a session stuck without session.waiting (1.x recovers a crashed run)
async def test_a_turn_answered_whose_session_waiting_never_comes_does_not_ask_to_repeat(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """eve finished the turn (message.completed, turn.completed) and the answer went out, but
    session.waiting never comes (eve killed in between: PROTOCOL.md §9, a stuck run). The busy
    timeout frees the chat; the person is told the next message starts anew, never asked to
    repeat a request that was answered."""
    original = fake_eve._waiting
    skipped = []

    async def no_waiting_once(s, deliveries):  # type: ignore[no-untyped-def]
        if not skipped:
            skipped.append(1)
            return
        await original(s, deliveries)

    fake_eve._waiting = no_waiting_once  # type: ignore[method-assign]
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="1")
    await h.start()
    try:
        await tg.message("hello", user_id=OWNER)
        await h.settled(20, eve_quiet=False)
        assert tg.texts() == ["echo: hello", t("session_lost_after_answer", "en")], tg.texts()
        assert state_of(await h.chat()) is ChatState.IDLE
    finally:
        await h.stop()


async def test_a_cancel_that_crosses_the_compactions_completion_reports_it_completed(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """C4/C7: /stop reaches a /compact after eve completed it, before its session.waiting. The
    compaction happened: the person hears it was done, and it is counted — not "didn't work"."""
    await tg.message("a long one [[tokens=50000]]", user_id=OWNER)
    await harness.settled()
    fake_eve.waiting_after_compaction = 1.0
    await tg.message("/compact", user_id=OWNER)
    await harness.until(lambda: any(e["type"] == "compaction.completed" for s in fake_eve.sessions.values()
                                    for e in s.events), what="eve completed the compaction")
    await tg.message("/stop", user_id=OWNER)
    await harness.settled()
    assert t("compact_done", "en") in tg.texts() and t("compact_failed", "en") not in tg.texts(), tg.texts()
    assert (await harness.chat()).compactions == 1


async def test_a_stream_line_nested_past_the_stack_does_not_wedge_the_chat(
        tmp_path, tg: FakeTelegram, fake_eve: FakeEve, monkeypatch):
    """F6 (review): an event eve records with deeply nested data (a model's tool input, say) is a
    malformed line, skipped; the chat goes on. (It raised RecursionError, which the reader passed
    on, and each new consumer met it again at the same cursor: busy for ever.)"""
    import json as _json

    import tests.fakes.eve as fake_module

    class Deep:
        @staticmethod
        def dumps(obj, **kw):
            return _json.dumps(obj, **kw).replace('"__DEEP__"', "[" * 50000 + "]" * 50000)

        def __getattr__(self, name):
            return getattr(_json, name)

    monkeypatch.setattr(fake_module, "json", Deep())
    fake_eve.tamper = {"message.completed": {"extra": "__DEEP__"}}
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="3")
    await h.start()
    try:
        await tg.message("hello", user_id=OWNER)
        await h.settled(timeout=20)  # the turn whose answer eve wrote nested past the stack
        await tg.message("second", user_id=OWNER)
        await h.until(lambda: any("second" in t for t in tg.texts()), timeout=30, what="the next message answered")
    finally:
        await h.stop()


async def test_a_press_after_an_unsure_text_answer_reaches_the_question(tmp_path: Path, tg: FakeTelegram,
                                                                        fake_eve: FakeEve):
    """T5/F4 (review): a question is open; the person's typed reply gets a 500 (eve never took it:
    unsure, its steer claim stays); then they press the button. The press reaches the question
    (the guard "one unsure send at a time" held it back: the turn waited 7 days)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_BUSY_TIMEOUT="2")
    await h.start()
    try:
        await tg.message("deploy? [[ask=Deploy to prod?|approve|cancel]]", user_id=OWNER)
        await tg.wait_texts(1, OWNER)
        await h.until(lambda: (h.maybe_chat() or None) is not None and h.maybe_chat().waiting_input,
                      what="waiting on the person")
        fake_eve.failing_texts = {"poison"}
        await tg.message("poison reply", user_id=OWNER)
        await h.until(lambda: fake_eve.failed_sends >= 1, what="the unsure steer")
        fake_eve.failing_texts = set()
        await tg.press(tg.sent(OWNER)[0], "Approve", user_id=OWNER)
        await h.until(lambda: any(x.startswith("answered:") for x in tg.texts(OWNER)), timeout=15,
                      what="the press answered")
    finally:
        await h.stop()


async def test_a_stop_during_the_unsent_grace_is_not_undone(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """L*/F4 (review): an unrecorded send behind a late compaction is followed; the person sends
    /stop meanwhile. Whatever becomes of the message, the stop is not undone by the grace's give
    back (which frees the chat): the stopped message is not answered."""
    h = await behind_a_late_compaction(tmp_path, tg, fake_eve, summary_delay=3.0)
    try:
        await h.until(lambda: eve_compacting(fake_eve), what="eve running the compaction")
        fake_eve.failing_texts = {"second"}  # a 500: eve never took it
        await tg.message("second", user_id=OWNER)
        await h.until(lambda: fake_eve.failed_sends >= 1, what="the failed send")
        fake_eve.failing_texts = set()
        await tg.message("/stop", user_id=OWNER)
        await h.settled(30)
        assert "echo: second" not in tg.texts(), tg.texts()
        assert state_of(await h.chat()) is ChatState.IDLE
    finally:
        await h.stop()
