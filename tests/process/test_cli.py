"""``iva run``'s refusals at start: one line and an exit code systemd does not restart on. These
stay processes: ``main(["run"])`` installs its SIGTERM/SIGINT handlers, which only a main thread
may (the fakes would then need a loop of their own in a thread), and its ``log.configure`` caches
bridge.app's logger on the run's own processor list for the rest of the worker
(cache_logger_on_first_use), so a later test's ``capture_logs`` misses bridge.app's events (and
keeping that list as the configured one instead garbles the next in-process run's lines); undoing
it means touching bridge internals.
``iva check``, ``iva status`` and ``iva restore-notes`` run in process in tests/unit/test_cli.py."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from bridge.app import EXIT_OTHER_BOT, EXIT_SCHEMA_NEWER
from bridge.storage.state import open_state
from bridge.storage.store import SCHEMA_VERSION
from tests.daemons import check_env
from tests.fakes.telegram import BOT_ID
from tests.zygote import spawn_bridge

pytestmark = pytest.mark.process  # every test here runs the bridge as a process


async def _run_once(env: dict[str, str]) -> tuple[int, str]:
    proc = await spawn_bridge("run", env={**os.environ, **env})
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


async def _state_at(state: Path, sql: str) -> None:
    """A state database as this Iva leaves it, then ``sql`` on it."""
    opened = await open_state(state / "iva.sqlite3")
    await opened.db.close()
    conn = sqlite3.connect(state / "iva.sqlite3")
    conn.executescript(sql)
    conn.close()


async def test_a_state_of_a_newer_iva_is_one_line_and_an_exit_systemd_does_not_restart(tg, fake_eve, tmp_path):
    """An older Iva on a newer schema: one line naming it, exit 6 (RestartPreventExitStatus), no traceback."""
    state = tmp_path / "state"
    state.mkdir()
    await _state_at(state, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    code, out = await _run_once(check_env(tg, fake_eve.url, fake_eve.token, IVA_STATE_DIR=str(state),
                                          IVA_NOTES_ENABLED="0"))
    assert code == EXIT_SCHEMA_NEWER, out
    assert "Traceback" not in out
    [line] = [x for x in out.splitlines() if "state_schema_newer" in x]
    assert f"state schema {SCHEMA_VERSION + 1} is newer" in line
    assert tg.calls_of("getUpdates") == []


async def test_another_bots_state_is_refused_in_one_line(tg, fake_eve, tmp_path, daemon_factory):
    """The state remembers its bot; another bot's token on it: one line, exit 7, nothing taken from
    Telegram (its message ids would be dropped as the first bot's duplicates)."""
    daemon = daemon_factory(fake_eve.url, fake_eve.token)
    await daemon.start()
    assert daemon.db().execute("SELECT value FROM iva_meta WHERE key = 'bot_id'").fetchone()[0] == str(BOT_ID)
    await daemon.terminate()
    polled = len(tg.calls_of("getUpdates"))
    state = tmp_path / "other"
    state.mkdir()
    await _state_at(state, "INSERT INTO iva_meta (key, value) VALUES ('bot_id', '987654')")
    code, out = await _run_once(check_env(tg, fake_eve.url, fake_eve.token, IVA_STATE_DIR=str(state),
                                          IVA_NOTES_ENABLED="0"))
    assert code == EXIT_OTHER_BOT, out
    assert "Traceback" not in out
    [line] = [x for x in out.splitlines() if "state_of_another_bot" in x]
    assert "987654" in line and str(BOT_ID) in line
    assert len(tg.calls_of("getUpdates")) == polled
