"""The disk (F2, F3): a full disk or a lock held for minutes is waited on, alive — the watchdog
fed, `/healthz` and `iva status` saying nothing can be made durable — and a reply whose "sent"
record cannot be written is not sent again at each restart while nothing can be written.

The root tests mount a small tmpfs on the state directory and fill it (CI runs as root); they
skip otherwise. The others fail statements the way a full disk does (tests/harness.py)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bridge.app import run
from bridge.cli import main
from bridge.config import Settings
from bridge.storage.state import open_state
from bridge.web.listener import Listener
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, UNPACED, FakeTelegram
from tests.harness import OWNER, Harness

FULL = sqlite3.OperationalError("database or disk is full")
ALWAYS = 10**6


@contextlib.contextmanager
def small_disk(directory: Path, size: str = "512k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``directory`` (root only: skips otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the disk says it is full."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler


async def test_waiting_on_a_failing_disk_keeps_the_watchdog_fed_and_healthz_says_it(harness: Harness,
                                                                                      tg: FakeTelegram):
    """Ingest's commit fails (the disk full) and is retried: the loop is alive, so its liveness
    (what the watchdog pings on) moves on while it waits — before, it stood still and
    ``WatchdogSec`` killed a bridge that was only waiting — and `/healthz` is 503 saying why;
    once a commit succeeds the message is answered once and the report clears."""
    h = harness
    assert h.db is not None and h.loop is not None
    h.db.failure = FULL
    h.db.failing["INSERT"] = 3
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=h.loop)
    await listener.start()
    try:
        assert listener._runner is not None
        port = listener._runner.addresses[0][1]
        sent = time.monotonic()
        await tg.message("hello", user_id=OWNER)
        await h.until(lambda: h.db is not None and h.db.failing["INSERT"] <= 1, what="two failed commits")
        assert h.loop.alive_at > sent  # waiting on storage, the loop still counts as alive
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.get("/healthz")
            assert r.status_code == 503
            assert r.json()["storage"].startswith("failing: database or disk is full")
            await h.settled(30)
            assert tg.texts() == ["echo: hello"]
            r = await client.get("/healthz")
            assert r.json()["storage"] == "ok"
    finally:
        await listener.stop()


async def test_a_reply_whose_record_cannot_be_written_is_not_resent_at_each_restart(harness: Harness,
                                                                                     tg: FakeTelegram):
    """F3 on a full disk: the reply went, its "sent" record fails; the process restarts (twice)
    while the disk is still full — the reply is not sent again (before: once per restart), since
    a pending row is only sent again after a write about it succeeded. Once the disk has room it
    goes once more: the one labelled duplicate (``reply_sent_after_restart``), then recorded."""
    h = harness
    assert h.db is not None
    h.db.failure = FULL
    h.db.failing["UPDATE outbox"] = ALWAYS
    await tg.message("hello", user_id=OWNER)
    await h.until(lambda: tg.texts() == ["echo: hello"], what="the reply sent")
    await h.until(lambda: h.db is not None and h.db.failing["UPDATE outbox"] < ALWAYS - 1,
                  what="its record failing")
    for _ in range(2):  # the watchdog (or anything) restarts it while the disk is full
        await h.crash()
        h.failing_at_start = {"UPDATE outbox": ALWAYS}
        await h.start()
        assert h.db is not None
        h.db.failure = FULL
        await h.until(lambda: h.db is not None and h.db.failing["UPDATE outbox"] < ALWAYS - 1,
                      what="the flush retried on the full disk")
        assert tg.texts() == ["echo: hello"]
    h.failing_at_start = {}
    h.db.failing.clear()  # the disk has room again
    await h.settled(30)
    assert tg.texts() == ["echo: hello", "echo: hello"]  # the one labelled duplicate
    assert h.observe("SELECT state FROM outbox")[0]["state"] == "sent"


def _settings(state: Path, tg: FakeTelegram, fake_eve: FakeEve) -> Settings:
    return Settings.from_env({
        "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": fake_eve.url,
        "IVA_EVE_TOKEN": fake_eve.token, "IVA_STATE_DIR": str(state), "IVA_OWNER_IDS": str(OWNER),
        "IVA_LANG": "en", "IVA_NOTES_ENABLED": "0", **UNPACED,
    })


async def test_a_fresh_database_that_cannot_be_made_after_a_quarantine_still_tells_the_owners(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """R5 on a full disk: the corrupt file is moved aside, the fresh one cannot be created; the
    bridge exits 4 (nothing moved on later starts, which find no file to quarantine) — and the
    owners hear it now, sent directly (before: a traceback, and they were never told)."""
    with small_disk(tmp_path / "state") as state:
        settings = _settings(state, tg, fake_eve)
        settings.db_path.write_bytes(b"this is not a database " * 200)
        fill(state)
        assert await run(settings) == 4
        assert list(state.glob("iva.sqlite3.quarantined-*"))
        told = tg.texts(OWNER)
        assert len(told) == 1 and "moved aside" in told[0] and "could not be made" in told[0], told


async def test_iva_status_says_the_disk_is_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`iva status` on a state directory whose disk is full: one line says nothing can be made
    durable (the daemon waits on storage meanwhile)."""
    with small_disk(tmp_path / "state", "4m") as state:
        opened = await open_state(state / "iva.sqlite3")  # the daemon, running
        try:
            assert main(["status", "--state", str(state)]) == 0
            assert "STORAGE" not in capsys.readouterr().out
            fill(state)
            assert main(["status", "--state", str(state)]) == 0
            assert "STORAGE: the disk of" in capsys.readouterr().out
            assert main(["status", "--json", "--state", str(state)]) == 0
            assert "nothing can be made durable" in capsys.readouterr().out
        finally:
            await opened.db.close()

