"""Small faults of pushed turns and reminders (issue 34, item 9): a pushed turn stopped before eve
had it, /reminders in a group, a reminder whose fire raises. In process, the fakes on loopback."""

from __future__ import annotations

import time

from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

A = str(OWNER)


async def test_a_pushed_turn_stopped_before_eve_had_it_reads_stopped(harness: Harness, tg: FakeTelegram,
                                                                     fake_eve: FakeEve):
    """/stop while the pushed turn's send is on its way, the bridge dying before eve takes it: after
    the restart it is not sent, and its state reads ``stopped`` (before: ``answered``)."""
    h = harness
    await tg.message("hello", user_id=OWNER)
    await h.settled()
    assert h.pushes is not None
    fake_eve.hold_sends = True
    state = await h.pushes.push_turn(A, "nightly digest")
    await h.until(lambda: fake_eve.held == 1, what="the send at eve")
    await tg.message("/stop", user_id=OWNER)
    await h.until(lambda: (c := h.maybe_chat()) is not None and c.stop_wanted, what="the stop recorded")
    await h.until(lambda: len(tg.texts()) == 2 and not h.observe(
        "SELECT count(*) FROM outbox WHERE state = 'pending'")[0][0], what="the answer to /stop recorded")
    await h.crash()
    await h.until(lambda: fake_eve.held_callers_gone() == 1, what="eve to see the caller gone")
    fake_eve.hold_sends = False
    fake_eve.release_sends.set()
    await h.start()
    await h.settled()
    assert not [b for s in fake_eve.sessions.values() for b in s.sends if "nightly digest" in str(b.get("message"))]
    done = await h.pushes.turn(A, state.id)
    assert done is not None and done.state == "stopped", done


async def test_a_reminder_whose_fire_raises_stops_alone_and_its_chat_is_told_once(harness: Harness, tg: FakeTelegram):
    """A recurring reminder whose zone is gone from tzdata (its next instant cannot be read): it
    stops, alone — the other chat's reminder due in the same batch fires (before: the batch rolled
    back and every reminder of every chat stopped, the loop failing on it for ever) — and its chat
    is told in one line, once."""
    h = harness
    await tg.message("hello", user_id=OWNER)
    await tg.message("hello", user_id=FRIEND)
    await h.settled()
    assert h.reminders is not None and h.db is not None
    clock = [time.time()]
    h.reminders.clock = lambda: clock[0]
    broken = await h.reminders.set(A, "hourly check", cron="0 * * * *", tz="Europe/Berlin")
    fine = await h.reminders.set(str(FRIEND), "hourly too", cron="0 * * * *")
    async with h.db.transaction():
        await h.db.execute("UPDATE reminders SET tz = 'Gone/Zone' WHERE id = ?", (broken.id,))
    clock[0] += 3600
    assert await h.reminders.fire_due() == [str(FRIEND)]
    await h.settled()
    assert tg.texts(FRIEND)[-1] == "echo: hourly too"
    assert await h.reminders.active(A) == [] and [r.id for r in await h.reminders.active(str(FRIEND))] == [fine.id]
    [told] = [text for text in tg.texts(OWNER) if broken.id in text]
    assert "stopped" in told and "Gone/Zone" in told
    clock[0] += 3600
    assert await h.reminders.fire_due() == [str(FRIEND)]
    await h.settled()
    assert len([text for text in tg.texts(OWNER) if broken.id in text]) == 1
