"""Against ``telegram-test-api`` as published (issue 11 acceptance): a third-party Bot API
emulator a new user may try, run from npm (tests/emulator, installed by ``scripts/test``).

What it answers that aiogram cannot read:

- ``getMe``: a user without ``is_bot`` (``result.is_bot: Field required``);
- ``sendMessage``: ``ok: true`` with the request's own form fields echoed back, so
  ``link_preview_options`` is the JSON *string* Iva sent, not an object;
- every method it does not implement (``setMyCommands``, ``sendChatAction``,
  ``setMessageReaction``…): HTTP 500 with ``{"message": …}``, no ``ok``;
- ``getUpdates`` ignores ``timeout`` and ``offset``: it answers at once, and an update is
  gone once it was handed out.

``iva check`` names ``is_bot`` in one line; ``iva run`` logs it and keeps asking, paced, and
takes nothing from the emulator meanwhile. Past start-up (the launcher's ``--bot-is-a-bot``
adds ``is_bot`` to getMe and changes nothing else), each reply goes out once, whatever the
answer, and the poll loop keeps its floor between the emulator's instant empty answers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import OWNER, ROOT, Daemon, free_port, secret_leaks
from tests.fakes.telegram import TOKEN
from tests.fakes.waiting import until

pytestmark = pytest.mark.process  # every test here runs the bridge as a process

EMULATOR = ROOT / "tests" / "emulator"
STARTUP_BASE = 0.5  # bridge/backoff.py STARTUP: the shortest wait between two getMe tries


class Emulator:
    """The emulator process and its two HTTP faces: the Bot API (``url``) and its client API
    (a person's messages in, the bot's messages out), plus the launcher's call counter. Its
    sync methods are what :class:`tests.conftest.Daemon` asks of a Bot API fake."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self._user_messages = 0

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"content-type": "application/json"},
                                         method="GET" if body is None else "POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def calls(self) -> dict[str, int]:
        """Bot API requests served so far, by method (the launcher counts them)."""
        return self._call("/__iva/calls")

    def count(self, method: str) -> int:
        return self.calls().get(method, 0)

    def say(self, text: str, user_id: int = OWNER) -> None:
        """A private message from ``user_id``, through the emulator's client API (the body its
        own TelegramClient.makeMessage builds)."""
        person = {"id": user_id, "first_name": "TestName", "username": "testUserName", "is_bot": False}
        self._call("/sendMessage", {"botToken": TOKEN, "date": int(time.time()), "text": text, "from": person,
                                    "chat": {**person, "type": "private", "title": "Test Name"}})
        self._user_messages += 1

    def history(self) -> list[dict[str, Any]]:
        return self._call("/getUpdatesHistory", {"token": TOKEN})["result"]

    def bot_texts(self, chat_id: int = OWNER) -> list[str]:
        """Every message the bot sent to ``chat_id``, in order, as the emulator stored them."""
        return [item["message"].get("text") for item in self.history()
                if "botToken" in item and "chat_id" in item["message"]
                and str(item["message"]["chat_id"]) == str(chat_id)]

    def unread_user_messages(self) -> int:
        return sum(1 for item in self.history() if "chat_id" not in item["message"] and not item["isRead"])

    # -- what Daemon asks of a Bot API fake ---------------------------------------------------

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        return [{} for _ in range(self.count(method))]  # the counter keeps no parameters

    def all_confirmed(self) -> bool:
        """Every person's message was handed to the bot (the emulator has no offsets: handing an
        update out is all the confirming there is; the nudge then covers its commit)."""
        return self.unread_user_messages() == 0

    def in_flight(self, method: str | None = None) -> int:
        return 0  # not visible from outside; the nudge waits out a call being answered

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
        return await until(predicate, timeout, what, every=0.05, detail=lambda: f"calls={self.calls()}")

    async def nudge(self, timeout: float = 15.0) -> None:
        """Two more getUpdates: the polling loop went round after this point, so every update
        handed out before it was committed (ingest commits a batch before asking again)."""
        polls = self.count("getUpdates")
        await self.wait_for(lambda: self.count("getUpdates") >= polls + 2, timeout, "the daemon to poll twice more")


async def _start_emulator(*flags: str) -> Emulator:
    if not (EMULATOR / "node_modules" / "telegram-test-api").is_dir():
        pytest.fail("telegram-test-api is not installed: npm ci --prefix tests/emulator (scripts/test does it)")
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        "node", str(EMULATOR / "serve.js"), str(port), *flags, cwd=EMULATOR,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
    except TimeoutError:
        line = b""
    if line.decode().strip() != f"listening {port}":
        if proc.returncode is None:
            proc.kill()
        rest = await proc.stdout.read()
        raise AssertionError(f"the emulator did not start: {(line + rest).decode(errors='replace')[-2000:]}")
    return Emulator(proc, port)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    """telegram-test-api exactly as published."""
    emu = await _start_emulator()
    try:
        yield emu
    finally:
        await _stop(emu.proc)


@pytest.fixture
async def emulator_past_getme() -> AsyncIterator[Emulator]:
    """The same, with ``is_bot: true`` added to getMe's answer and nothing else changed."""
    emu = await _start_emulator("--bot-is-a-bot")
    try:
        yield emu
    finally:
        await _stop(emu.proc)


def _env(emu: Emulator, fake_eve: Any, state: Path) -> dict[str, str]:
    env = {"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": emu.url, "IVA_EVE_URL": fake_eve.url,
           "IVA_EVE_TOKEN": fake_eve.token, "IVA_OWNER_IDS": str(OWNER), "IVA_STATE_DIR": str(state),
           "IVA_LANG": "en", "IVA_LOG_LEVEL": "debug", "IVA_API_LISTEN": f"127.0.0.1:{free_port()}"}
    if fake_eve.mcp_token:
        env["IVA_MCP_TOKEN"] = fake_eve.mcp_token
    return env


@pytest.fixture
async def daemons() -> AsyncIterator[list[Daemon]]:
    """Every daemon a test starts: stopped at the end, and its log checked for secrets (S5)."""
    started: list[Daemon] = []
    yield started
    for daemon in started:
        if daemon.proc is not None and daemon.proc.returncode is None:
            try:
                await daemon.terminate(10)
            except TimeoutError:
                await daemon.kill()
    for daemon in started:
        leaks = secret_leaks(daemon.log, daemon.env)
        assert not leaks, f"a secret in {daemon.log}: {leaks[:3]}"


def _log_events(daemon: Daemon, event: str) -> list[dict[str, Any]]:
    found = []
    for line in daemon.logs().splitlines():
        if f'"{event}"' in line:
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


async def test_check_names_the_getme_field_the_emulator_leaves_out(emulator, fake_eve):
    """``iva check`` against the emulator: exit non-zero, one FAIL line naming ``is_bot``, no
    traceback (before issue 11's fix it crashed with a pydantic traceback)."""
    env = {**os.environ, "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": emulator.url,
           "IVA_EVE_URL": fake_eve.url, "IVA_EVE_TOKEN": fake_eve.token, "IVA_OWNER_IDS": str(OWNER),
           "IVA_MCP_TOKEN": "mcp-token-for-check"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge", "check", cwd=ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out_bytes, _ = await asyncio.wait_for(proc.communicate(), 60)
    out = out_bytes.decode()
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    failures = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(failures) == 1, out
    assert failures[0].startswith(f"FAIL telegram: {emulator.url} answered getMe"), failures
    assert "is_bot" in failures[0], failures
    assert "ok   eve:" in out  # the rest of the check still ran
    assert emulator.count("getMe") == 1


async def test_run_against_the_emulator_keeps_asking_getme_paced_and_takes_nothing(
        emulator, fake_eve, tmp_path, daemons):
    """``iva run`` cannot read the emulator's getMe: it stays up, logs the field each time,
    asks again with a growing wait (never faster than the start-up backoff's base), polls
    nothing meanwhile (a message waiting at the emulator stays there, not lost) and stops
    cleanly on SIGTERM."""
    state = tmp_path / "state"
    state.mkdir()
    daemon = Daemon(state, _env(emulator, fake_eve, state), emulator)  # type: ignore[arg-type]
    daemons.append(daemon)
    emulator.say("are you there?")
    with open(daemon.log, "ab") as out:
        daemon.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge", "run", cwd=ROOT, env={**os.environ, **daemon.env},
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )
    # Settled enough to judge the pace: the third try arrived and was logged. The pace is what
    # the daemon decided (each try's logged wait), not what a busy machine made of it: the
    # timeouts here bound a failure only.
    await emulator.wait_for(lambda: emulator.count("getMe") >= 3 or daemon.proc.returncode is not None, 120,
                            "three getMe tries")
    assert daemon.proc.returncode is None, daemon.logs()[-3000:]
    await emulator.wait_for(lambda: len(_log_events(daemon, "telegram_getme_undecodable")) >= 3, 60,
                            "the third try logged")
    calls = emulator.calls()
    tries = _log_events(daemon, "telegram_getme_undecodable")
    assert calls["getMe"] <= len(tries) + 1, (calls, len(tries))  # every try but one in flight waited first
    assert set(calls) == {"getMe"}, calls  # no getUpdates, no sendMessage: nothing taken, nothing said
    assert emulator.unread_user_messages() == 1
    assert all(t["problem"] == "result.is_bot: Field required" for t in tries), tries
    waits = [t["retry_in"] for t in tries]
    assert all(wait >= STARTUP_BASE for wait in waits), waits
    assert all(b > a for a, b in itertools.pairwise(waits[:4])), waits  # backing off, not a fixed beat

    daemon.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(daemon.proc.wait(), 60) == 0
    log = daemon.logs()
    assert "Traceback" not in log, log[-3000:]
    assert _log_events(daemon, "bridge_stopped_before_ready")


async def test_replies_through_the_emulator_go_once_and_polling_keeps_its_floor(
        emulator_past_getme, fake_eve, tmp_path, daemons):
    """Past getMe, every other answer is the emulator's own: sendMessage's ``ok: true`` cannot
    be decoded (``link_preview_options`` comes back a string) and must count as delivered —
    before issue 11's fix the same reply went out again on every retry and the chat stayed
    busy; the unsupported typing / commands calls are 500s without ``ok``; getUpdates answers
    at once. Two messages, one after the other: each answered exactly once, the chat free
    after each, /healthz ok and the sent counter right, and getUpdates never faster than the
    floor between empty polls."""
    emu = emulator_past_getme
    state = tmp_path / "state"
    state.mkdir()
    daemon = Daemon(state, _env(emu, fake_eve, state), emu)  # type: ignore[arg-type]
    daemons.append(daemon)
    await daemon.start()

    emu.say("first")
    await daemon.settled(60)
    assert emu.bot_texts() == ["echo: first"]
    emu.say("second")
    await daemon.settled(60)

    # No rate is asserted here (a busy machine's business): the floor between empty polls is
    # chat/test_chat_machine.py::test_a_bot_api_that_answers_long_polls_at_once_is_not_hammered.
    calls = emu.calls()
    assert emu.bot_texts() == ["echo: first", "echo: second"], emu.history()
    assert calls["sendMessage"] == 2, calls  # never resent
    assert calls["getMe"] == 1, calls

    with daemon.db() as conn:
        rows = conn.execute("SELECT state, chunks_sent FROM outbox ORDER BY id").fetchall()
    assert [(r["state"], r["chunks_sent"]) for r in rows] == [("sent", 1), ("sent", 1)], [dict(r) for r in rows]
    assert len(_log_events(daemon, "telegram_answer_undecodable_but_ok")) == 2

    def get(path: str) -> str:
        with urllib.request.urlopen(daemon.api_url + path, timeout=10) as response:
            return response.read().decode()

    health = json.loads(await asyncio.to_thread(get, "/healthz"))
    assert health["ok"] is True and health["oldest_pending_reply_s"] is None, health
    metrics = await asyncio.to_thread(get, "/metrics")
    sent = re.search(r"^iva_telegram_messages_sent_total (\S+)$", metrics, re.M)
    assert sent is not None and float(sent.group(1)) == 2.0, metrics
    assert "Traceback" not in daemon.logs()
