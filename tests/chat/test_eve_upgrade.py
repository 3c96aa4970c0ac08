"""An eve upgrade under Iva (SPEC V2, V5 in part; PROTOCOL-27.md §11), in process on the fake:
an idle chat whose session eve stranded goes on in a new session, the person told once; a busy
chat whose cursor was read on stream version 26 meets a 27 stream and is never applied to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.chat.transitions import ChatState, state_of
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
        assert "repeat" in tg.texts()[1] and "echo: slow one" not in tg.texts()
        await tg.message("again", user_id=OWNER)
        await h.settled()
        assert tg.texts()[2:] == ["echo: again"]
        assert (await h.chat()).eve_session != old
    finally:
        await h.stop()
