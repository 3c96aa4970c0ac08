"""The systemd units and the daemon's side of Type=notify (R7)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess

import pytest

from tests.conftest import OWNER, ROOT

UNITS = [ROOT / "systemd" / "iva.service", ROOT / "systemd" / "iva@.service"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_exposure_is_at_most_2(unit):
    """`systemd-analyze security --offline=true` rates each unit's exposure ≤ 2.0."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    done = subprocess.run([analyze, "security", "--offline=true", "--threshold=20", str(unit)],
                          capture_output=True, text=True, timeout=60)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert level, done.stdout[-2000:] + done.stderr
    assert float(level.group(1)) <= 2.0
    assert done.returncode == 0


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_is_notify_with_watchdog_state_and_restart(unit):
    text = unit.read_text()
    for line in ("Type=notify", "Restart=on-failure", "TimeoutStopSec=", "WatchdogSec=", "StateDirectory=iva",
                 "ExecStart=/opt/iva/.venv/bin/iva run"):
        assert line in text, line
    if unit.name == "iva@.service":
        assert "EnvironmentFile=/etc/iva/%i.env" in text and "StateDirectory=iva/%i" in text


@pytest.mark.process
async def test_daemon_notifies_ready_watchdog_and_stopping(tg, fake_eve, daemon_factory, tmp_path):
    """READY=1 once serving, WATCHDOG=1 while the polling loop goes round, STOPPING=1 on SIGTERM."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def collect():
        while True:
            data = await loop.sock_recv(sock, 4096)
            seen.extend(data.decode().split("\n"))

    reader = asyncio.create_task(collect())
    try:
        d = daemon_factory(fake_eve.url, fake_eve.token)
        await d.start(NOTIFY_SOCKET=str(path), WATCHDOG_USEC="1000000")
        await tg.wait_for(lambda: "READY=1" in seen and seen.count("WATCHDOG=1") >= 2, 10, "ready and pings")
        await tg.message("still fine", user_id=OWNER)
        await tg.wait_texts(1)
        assert await d.terminate() == 0
        await tg.wait_for(lambda: "STOPPING=1" in seen, 5, "stopping")
    finally:
        reader.cancel()
        sock.close()
    # Start-up's objects were moved out of the collector's generations before the chats began
    # (bridge.app.settle_heap): aiogram's models alone are over a hundred thousand.
    [ready] = [json.loads(line) for line in d.logs().splitlines() if '"bridge_ready"' in line]
    assert ready["frozen_objects"] > 50_000


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_exits_a_restart_cannot_change_are_not_restarted(unit):
    """A newer Iva's schema (6) and another bot's state (7) end in one line; systemd must not loop on them."""
    from bridge.app import EXIT_OTHER_BOT, EXIT_SCHEMA_NEWER

    [line] = [x for x in unit.read_text().splitlines() if x.startswith("RestartPreventExitStatus=")]
    assert {str(EXIT_SCHEMA_NEWER), str(EXIT_OTHER_BOT)} <= set(line.partition("=")[2].split())
