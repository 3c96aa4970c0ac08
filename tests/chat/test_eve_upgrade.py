"""An eve upgrade under Iva (SPEC V2, V5; PROTOCOL-27.md §11), in process on the fake: an idle
chat whose session eve stranded goes on in a new session, the person told once; a busy chat whose
cursor was read on stream version 26 meets a 27 stream and is never applied to it (the cut turn
told in one line that says why); a compaction cut so is silent, and the next answer says it; the
operator's ``iva sessions`` lists the stranded chats and moves them before their next message.
On the real eves: tests/contract/test_contract_upgrade.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.chat.transitions import ChatState, state_of
from bridge.cli import main as iva
from bridge.telegram.texts import t
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness


async def test_an_idle_chat_on_a_stranded_session_goes_on_in_a_new_one(tmp_path: Path, tg: FakeTelegram,
                                                                       fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        await tg.message("before", user_id=OWNER)
        await h.settled()
        old = (await h.chat()).eve_session
        assert old is not None
        fake_eve.strand(old)  # eve 1.x opened 0.80's store: 409 session_stranded on every send
        await tg.message("after the upgrade", user_id=OWNER)
        await h.settled()
        chat = await h.chat()
        told = t("eve_upgraded", "en")
        assert tg.texts() == ["echo: before", told, "echo: after the upgrade"]  # told once, first
        assert chat.eve_session not in (None, old) and state_of(chat) is ChatState.IDLE
        # the recent exchange came along with the new session's first message (bridge/chat/carry.py)
        first = next(b for b in fake_eve.sessions[chat.eve_session].sends)
        assert first["clientContext"]["ivaHistory"] == [{"role": "user", "text": "before"},
                                                        {"role": "assistant", "text": "echo: before"}]
    finally:
        await h.stop()


@pytest.mark.eve_wire(26)
async def test_a_cursor_read_on_26_is_never_applied_to_27(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """Iva stopped mid-turn on eve 0.80; eve upgraded (the same session now served as version 27);
    Iva started: the cursor is not applied to the new stream — the turn is lost as after a crash,
    the person asked to repeat once, and the next message answered in a new session."""
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    await tg.message("warm up", user_id=OWNER)
    await h.settled()  # the cursor on the record, read on version 26
    assert (await h.chat()).cursor.version == 26
    await tg.message("slow one [[delay=1.5]]", user_id=OWNER)
    await h.until(lambda: any(s.running for s in fake_eve.sessions.values()), what="eve running the turn")
    old = (await h.chat()).eve_session
    await h.stop()
    fake_eve.stream_version = 27
    await h.start()
    try:
        await tg.wait_texts(2, OWNER, timeout=30)
        assert tg.texts()[1] == t("eve_upgraded_cut", "en") and "echo: slow one" not in tg.texts()
        await tg.message("again", user_id=OWNER)
        await h.settled()
        assert tg.texts()[2:] == ["echo: again"]  # told once: the new session says nothing more
        chat = await h.chat()
        assert chat.eve_session != old and chat.upgraded_from is None
        # the exchange before the cut came along with the new session's first message (carry.py)
        first = fake_eve.sessions[chat.eve_session].sends[0]
        assert {"role": "user", "text": "warm up"} in first["clientContext"]["ivaHistory"]
    finally:
        await h.stop()


@pytest.mark.eve_wire(26)
async def test_a_compaction_cut_by_an_upgrade_is_told_by_the_next_answer(tmp_path: Path, tg: FakeTelegram,
                                                                        fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_CONTEXT_WINDOW="128000")
    await h.start()
    fake_eve.summary_delay = 30
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await h.until(lambda: any(s.compacting for s in fake_eve.sessions.values()), what="eve compacting")
    await h.stop()
    fake_eve.stream_version = 27  # eve upgraded while Iva was down
    await h.start()
    try:
        # the old session's summary is still being written at the fake eve: nobody waits on it
        await h.settled(30, eve_quiet=False)
        assert tg.texts() == ["echo: big"]  # an automatic compaction cut: nothing to say yet
        await tg.message("after", user_id=OWNER)
        await h.until(lambda: "echo: after" in tg.texts(), 30, "the answer in a new session")
        await h.settled(30, eve_quiet=False)
        assert tg.texts()[1:] == [t("eve_upgraded", "en"), "echo: after"]
        await tg.message("and again", user_id=OWNER)
        await h.until(lambda: "echo: and again" in tg.texts(), 30, "the next answer")
        await h.settled(30, eve_quiet=False)
        assert tg.texts()[3:] == ["echo: and again"]
    finally:
        await h.stop()


async def test_iva_sessions_lists_the_stranded_chats_and_moves_them(tmp_path: Path, tg: FakeTelegram,
                                                                   fake_eve: FakeEve,
                                                                   capsys: pytest.CaptureFixture[str]):
    """V5, V8: the daemon records which eve built each session and which eve it talks to now; after
    an upgrade `iva status` says how many chats are stranded, `iva sessions` lists them, and
    `--renew-stranded` moves the idle ones: the next message starts a new session at once (no
    send meets the 409 first) and the person is told once."""
    state = tmp_path / "state"
    h = Harness(state, tg, fake_eve)
    await h.start()
    await h.daemon_steps()  # eve's version learned
    await tg.message("before", user_id=OWNER)
    await h.settled()
    old = (await h.chat()).eve_session
    assert old is not None and (await h.chat()).session_eve == "1.0.1"
    await h.stop()
    fake_eve.eve_version = "1.0.2"  # any other eve strands a session (eve's docs: "Stranded sessions")
    fake_eve.strand(old)
    await h.start()
    try:
        await h.daemon_steps()
        capsys.readouterr()
        assert iva(["status", "--state", str(state)]) == 0
        assert "eve 1.0.2 (stream version 27" in capsys.readouterr().out
        assert iva(["sessions", "--state", str(state)]) == 0
        listed = capsys.readouterr().out
        assert f"stranded {OWNER}  session {old}  built by eve 1.0.1" in listed
        assert iva(["sessions", "--state", str(state), "--renew-stranded"]) == 0
        assert capsys.readouterr().out.startswith("1 chat(s) moved")
        assert iva(["sessions", "--state", str(state)]) == 0
        assert "stranded" not in capsys.readouterr().out.replace("(stranded)", "")
        await tg.message("after", user_id=OWNER)
        await h.settled()
        assert tg.texts() == ["echo: before", t("eve_upgraded", "en"), "echo: after"]
        assert [r for r in fake_eve.responses if r[2] == 409] == []  # never met the stranded session
        chat = await h.chat()
        assert chat.eve_session != old and chat.session_eve == "1.0.2" and chat.upgraded_from is None
    finally:
        await h.stop()
