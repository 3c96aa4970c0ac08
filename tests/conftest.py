"""Shared fixtures: the fakes on loopback, and the real daemon as a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, FakeTelegram

ROOT = Path(__file__).resolve().parent.parent
OWNER = 1
FRIEND = 2
STRANGER = 666


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def fake_eve() -> AsyncIterator[FakeEve]:
    fake = FakeEve()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


class Daemon:
    """``python -m bridge run`` as a real process, for end-to-end and crash tests."""

    def __init__(self, state: Path, env: dict[str, str], tg: FakeTelegram) -> None:
        self.state = state
        self.env = env
        self.tg = tg
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.log = state / "daemon.log"

    async def start(self, **overrides: str) -> None:
        env = {**os.environ, **self.env, **overrides}
        env.pop("NOTIFY_SOCKET", None)
        polls = len(self.tg.calls_of("getUpdates"))
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bridge", "run", cwd=ROOT, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
            )
        # Ready once it polls Telegram.
        await self.tg.wait_for(lambda: len(self.tg.calls_of("getUpdates")) > polls or self._died(), 20,
                               "the daemon to poll")
        if self._died():
            raise AssertionError(f"daemon exited early:\n{self.log.read_text()[-3000:]}")

    def _died(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed, nothing said."""
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def terminate(self, timeout: float = 15) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.state / "iva.sqlite3")
        conn.row_factory = sqlite3.Row
        return conn

    def chat(self, address: str) -> dict[str, Any] | None:
        with self.db() as conn:
            row = conn.execute("SELECT * FROM chats WHERE address = ?", (address,)).fetchone()
            return dict(row) if row else None

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
async def daemon_factory(tmp_path: Path, tg: FakeTelegram):
    daemons: list[Daemon] = []

    def make(eve_url: str, eve_token: str, **env: str) -> Daemon:
        base = {
            "IVA_TELEGRAM_TOKEN": TOKEN,
            "IVA_TELEGRAM_API_URL": tg.url,
            "IVA_EVE_URL": eve_url,
            "IVA_EVE_TOKEN": eve_token,
            "IVA_STATE_DIR": str(tmp_path / "state"),
            "IVA_OWNER_IDS": str(OWNER),
            "IVA_ALLOWED_USER_IDS": str(FRIEND),
            "IVA_LANG": "en",
            "IVA_LOG_LEVEL": "debug",
            **env,
        }
        (tmp_path / "state").mkdir(exist_ok=True)
        daemon = Daemon(tmp_path / "state", base, tg)
        daemons.append(daemon)
        return daemon

    yield make
    for daemon in daemons:
        if daemon.proc and daemon.proc.returncode is None:
            try:
                await daemon.terminate(10)
            except TimeoutError:
                await daemon.kill()


@pytest.fixture
async def bridge(daemon_factory, fake_eve: FakeEve) -> Daemon:
    """A daemon against the fake eve, started."""
    daemon = daemon_factory(fake_eve.url, fake_eve.token)
    await daemon.start()
    return daemon
