"""Clock steps (F9): deadlines inside the process run on the monotonic clock, the wall time the
bridge writes is steady (bridge/clock.py), and what crosses a restart is measured on the shared
monotonic clock of the same boot or clamped. libfaketime breaks time.sleep here, so the steps are
an injected clock, in process."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import structlog

from bridge.clock import Clock
from bridge.storage.retention import DAY, prune
from bridge.web.listener import Listener
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness, open_store
from tests.scenarios import file_parts

HOUR = 3600.0


class Stepped:
    """The wall clock (``time.time``) as NTP steps it: real time plus ``step`` seconds. Installed
    with monkeypatch (the standard library's clock, not our code): the bridge's own clock read
    the wall once at import and runs on the monotonic clock since."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.step = 0.0
        self.real = time.time
        monkeypatch.setattr(time, "time", self)

    def __call__(self) -> float:
        return self.real() + self.step


async def test_a_backward_step_does_not_hold_an_album(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve,
                                                     monkeypatch: pytest.MonkeyPatch):
    """The wall clock steps back an hour (a VM restored from a snapshot) while an album arrives:
    it settles as usual and goes as one turn, and the message behind it too (before: they waited
    the hour, the first part's arrival an hour in the future)."""
    wall = Stepped(monkeypatch)
    await tg.album(["b1", "b2"], captions={0: "two photos"}, user_id=OWNER, batch=True)
    await harness.until(lambda: harness.observe("SELECT count(*) FROM diskqueue_messages WHERE state = 0")[0][0] == 2,
                        what="the album on disk, settling")
    wall.step = -HOUR
    await tg.message("and this", user_id=OWNER)
    await harness.settled(20)
    assert [len(parts) for parts in file_parts(fake_eve)] == [2]
    assert any("and this" in text for text in tg.texts())


def test_elapsed_across_a_restart_is_monotonic_in_the_same_boot_and_clamped_across_a_reboot() -> None:
    """A recovered turn's spent time (Transitions.spent, which the resumed consumer counts): the
    last process wrote its progress 10 s ago on its steady clock; the wall clock then stepped an
    hour forward. In the same boot the monotonic clock says 10 s (before: the hour, clamped to
    the whole timeout — the resumed turn got only the grace); after a reboot, the wall
    difference clamped to [0, limit]; a backward step counts 0. Within a process no step counts."""
    mono = [1000.0]
    wall = [1_800_000_000.0]
    before = Clock(wall=lambda: wall[0], mono=lambda: mono[0], boot="boot-a")
    stamp, anchor = before.now(), before.anchor()
    mono[0] += 10.0
    wall[0] += 10.0 + HOUR
    after = Clock(wall=lambda: wall[0], mono=lambda: mono[0], boot="boot-a")
    assert after.since(stamp, limit=900.0, anchor=anchor) == 10.0
    assert Clock(wall=lambda: wall[0], mono=lambda: 5.0, boot="boot-b").since(stamp, limit=900.0,
                                                                               anchor=anchor) == 900.0
    wall[0] -= 2 * HOUR
    assert Clock(wall=lambda: wall[0], mono=lambda: 5.0, boot="boot-b").since(stamp, limit=900.0,
                                                                               anchor=anchor) == 0.0
    t0 = after.now()
    wall[0] += 30 * DAY
    assert after.now() == t0 and after.bounded() == t0


async def test_a_forward_step_does_not_make_healthz_503(harness: Harness, tg: FakeTelegram,
                                                        monkeypatch: pytest.MonkeyPatch):
    """The wall clock steps a day forward: `/healthz` stays 200 — the last poll's age and the
    chats' progress are on the steady clock (before: the last poll looked a day old, 503)."""
    assert harness.loop is not None
    listener = Listener("127.0.0.1:0", store=harness.s.store, queue=harness.s.queue, ingest=harness.loop)
    await listener.start()
    try:
        assert listener._runner is not None
        port = listener._runner.addresses[0][1]
        await tg.message("hello", user_id=OWNER)
        await harness.settled()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).status_code == 200
            Stepped(monkeypatch).step = DAY
            r = await client.get("/healthz")
            assert r.status_code == 200, r.json()
            assert r.json()["telegram_poll_age_s"] < 60
    finally:
        await listener.stop()


async def test_a_forward_step_does_not_prune_fresh_dedupe_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Retention after the wall clock stepped 30 days forward: its cutoff is the earlier of the
    wall and the steady clock, so a mark made a moment ago stays (before: a step past
    IVA_RETENTION_DAYS pruned fresh dedupe marks, and Telegram's redelivery became a new message)."""
    db, queue, store = await open_store(tmp_path / "iva.sqlite3")
    try:
        async with db.transaction():
            assert await queue.remember("1", {"kind": "refused"}, dedupe_key="tg:1:1")
        Stepped(monkeypatch).step = 30 * DAY
        await prune(queue, store, days=14)
        assert await queue.history("tg:1:1")
        async with db.transaction():
            assert not await queue.remember("1", {"kind": "refused"}, dedupe_key="tg:1:1")  # still a duplicate
    finally:
        await db.close()


async def test_a_backward_step_labels_no_new_reply_may_repeat(harness: Harness, tg: FakeTelegram,
                                                              monkeypatch: pytest.MonkeyPatch):
    """The wall clock steps back an hour: a reply written after it is this process's own, sent
    once without the "may repeat" label and without the extra write of a row pending since
    before the start (before: every new reply looked older than the start — `reply_sent_after_
    restart` and a write each). What was pending before the start is told by the row's id."""
    Stepped(monkeypatch).step = -HOUR
    with structlog.testing.capture_logs() as logs:
        await tg.message("hello", user_id=OWNER)
        await harness.settled()
    assert tg.texts() == ["echo: hello"]
    assert [e for e in logs if e["event"] == "reply_sent_after_restart"] == []


async def test_a_forward_step_does_not_give_up_a_message_eve_failed_on_once(harness: Harness, tg: FakeTelegram,
                                                                           fake_eve: FakeEve,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """F6 by age against F9: eve fails on a message once, then the wall clock steps two hours
    forward: the message is not an hour old — it is tried again and answered (before: its age
    read on the wall clock, given up after one failure, the person told it failed)."""
    wall = Stepped(monkeypatch)
    fake_eve.failing_texts = {"flaky"}
    await tg.message("flaky", user_id=OWNER)
    await harness.until(lambda: fake_eve.failed_sends >= 1, 60, "the first failed send")
    wall.step = 2 * HOUR
    await harness.until(lambda: fake_eve.failed_sends >= 2 or tg.texts(), 60, "a second try, or an answer")
    fake_eve.failing_texts = set()
    await harness.settled(60)
    assert tg.texts() == ["echo: flaky"]


async def test_a_message_queued_while_the_clock_was_behind_is_not_aged_by_the_correction(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve, monkeypatch: pytest.MonkeyPatch):
    """The other way round: the wall clock is two hours behind when a message comes, eve fails on
    it once, and NTP corrects the clock: the queue's stamp is on the steady clock, so the
    correction does not age the message either (before: its `enqueued_at` two hours back)."""
    wall = Stepped(monkeypatch)
    wall.step = -2 * HOUR
    fake_eve.failing_texts = {"flaky"}
    await tg.message("flaky", user_id=OWNER)
    await harness.until(lambda: fake_eve.failed_sends >= 1, 60, "the first failed send")
    wall.step = 0.0
    await harness.until(lambda: fake_eve.failed_sends >= 2 or tg.texts(), 60, "a second try, or an answer")
    fake_eve.failing_texts = set()
    await harness.settled(60)
    assert tg.texts() == ["echo: flaky"]
