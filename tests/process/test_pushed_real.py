"""The assistant writes first, on the real eve (../shared/eve-peer, PROTOCOL.md §14): an eve of its
own, built with the handler-form schedule ``agent/schedules/iva-push.ts`` (IVA_PUSH_URL at
start.sh: every minute it POSTs a pushed turn keyed by the minute to the daemon's owner API) and
the notebook connection pointing at the daemon's /mcp (where the reminder tools are)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    EVE_PEER,
    EVE_VERSIONS,
    MCP_LISTEN,
    MCP_TOKENS,
    OWNER,
    REAL,
    RealEve,
    free_port,
)

# eve's build (with the schedule), then minutes of fires
pytestmark = [REAL, pytest.mark.process, pytest.mark.timeout(600)]

API_TOKEN = "push-api-token-0123456789"
MCP_TOKEN = "push-mcp-token-0123456789"
BRIEF = re.compile(r"^echo: scheduled brief for (\d{4}-\d\d-\d\dT\d\d:\d\d)$")


@pytest.fixture(scope="module", params=EVE_VERSIONS)
def pushing_eve(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEve]:
    """A real eve (each version in turn) whose schedule pushes to the daemon's owner API (the
    daemon listens where both the schedule's URL and the notebook connection point)."""
    if os.environ.get("IVA_SKIP_REAL_EVE") == "1":
        pytest.skip("IVA_SKIP_REAL_EVE=1: real-eve contract tests skipped on request")
    run_dir = tmp_path_factory.mktemp(f"eve-peer-push-{request.param}")
    listen = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "EVE_VERSION": request.param, "EVE_PORT": str(free_port()), "FAKE_LLM_PORT": str(free_port()),
           "EVE_PEER_RUN_DIR": str(run_dir), "NOTEBOOK_MCP_URL": f"http://{listen}/mcp",
           "NOTEBOOK_MCP_TOKEN": MCP_TOKEN, "IVA_PUSH_URL": f"http://{listen}/v1/chats/{OWNER}/turns",
           "IVA_PUSH_TOKEN": API_TOKEN}
    done = subprocess.run(["bash", str(EVE_PEER / "start.sh")], env=env, capture_output=True, text=True,
                          timeout=400, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.fail(f"eve-peer did not start:\n{done.stdout}\n{done.stderr}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    peer = RealEve({"EVE_VERSION": request.param, **values}, Path(run_dir))
    peer.script_env = env
    peer.mcp_listen = listen
    MCP_LISTEN[peer.url] = listen
    MCP_TOKENS[peer.url] = MCP_TOKEN
    try:
        yield peer
    finally:
        subprocess.run(["bash", str(EVE_PEER / "stop.sh")], env=env, capture_output=True, timeout=60,
                       stdin=subprocess.DEVNULL)
        MCP_LISTEN.pop(peer.url, None)
        MCP_TOKENS.pop(peer.url, None)


@pytest.fixture
async def daemon(daemon_factory, pushing_eve: RealEve):
    pushing_eve.control(full_log=True)
    d = daemon_factory(pushing_eve.url, pushing_eve.token, IVA_API_TOKEN=API_TOKEN)
    await d.start()
    yield d


def briefs(tg) -> list[str]:
    """The minutes whose scheduled brief was answered, one entry per answer."""
    return [m.group(1) for text in tg.texts(OWNER) if (m := BRIEF.match(text))]


async def test_an_eve_schedules_push_is_answered_in_the_chat_once_per_fire(tg, pushing_eve, daemon):
    """W10: eve fires its schedule on the minute with no request from outside; the fire is one
    pushed turn (its key names the minute), answered once in the chat; the same fire pushed
    again (a retried run) adds nothing. One fire is waited for, not two (a minute of the
    suite's time): that another minute's key is another turn is proved in process
    (tests/push/test_pushed.py, test_a_repeated_key_is_the_same_turn_even_after_a_restart)."""
    await tg.message("hello", user_id=OWNER)  # Iva knows the chat from here on (before: 404 to eve)
    await tg.wait_texts(1, timeout=60)
    await tg.wait_for(lambda: briefs(tg), 150, "a scheduled fire answered")
    first = briefs(tg)[0]
    # the fire's turn is answered once eve has ended it, a moment after its text shows (on 0.80,
    # session.waiting comes after the reply): the same fire pushed again is asked about then
    await tg.wait_for(lambda: (c := daemon.chat(str(OWNER))) is not None and c["status"] == "idle", 60, "idle")
    api = f"http://{pushing_eve.mcp_listen}"
    async with httpx.AsyncClient(base_url=api, headers={"authorization": f"Bearer {API_TOKEN}"}) as client:
        again = await client.post(f"/v1/chats/{OWNER}/turns", json={"text": f"scheduled brief for {first}",
                                                                     "key": f"eve-schedule:{first}"})
        assert again.status_code == 202 and again.json()["state"] == "answered", again.text
        state = await client.get(f"/v1/chats/{OWNER}/turns/{again.json()['id']}")
        assert state.json()["state"] == "answered"
    await tg.wait_for(lambda: (c := daemon.chat(str(OWNER))) is not None and c["status"] == "idle", 60, "idle")
    answered = briefs(tg)
    assert len(answered) == len(set(answered)), answered  # once per minute it fired
    with daemon.db() as conn:
        keys = [r[0] for r in conn.execute("SELECT dedupe_key FROM diskqueue_messages WHERE dedupe_key LIKE "
                                           "'push:%' ORDER BY id")]
    assert {f"push:{OWNER}:eve-schedule:{m}" for m in answered} <= set(keys)
    # eve was told each was pushed (by whom, its key), not written by the person.
    asked = [r for r in pushing_eve.llm_requests() if f"scheduled brief for {first}" in str(r.get("latest_user"))]
    assert asked and all(f"eve-schedule:{first}" in json.dumps(r.get("messages")) and
                         "[pushed turn]" in json.dumps(r.get("messages")) for r in asked), asked[:1]


async def test_the_assistant_sets_a_reminder_with_its_tool_and_the_reminder_is_answered(tg, pushing_eve, daemon):
    """W9/W7: in an owner turn the model calls chat_reminder_set (through eve's MCP connection);
    a few seconds later the reminder falls due as a pushed turn of the chat, answered there."""
    await tg.message("hello", user_id=OWNER)
    await tg.wait_for(lambda: "echo: hello" in tg.texts(OWNER), 60, "hello answered")
    at = datetime.fromtimestamp(time.time() + 8, UTC).isoformat(timespec="seconds")
    args = {"text": "rem1 tell Ann the tea is ready", "at": at}
    await tg.message(f"rem0 remind me [[call=notebook__chat_reminder_set {json.dumps(args)}]]", user_id=OWNER)
    await tg.wait_for(lambda: any(t.startswith("tool done") for t in tg.texts(OWNER)), 90, "the tool turn")
    with daemon.db() as conn:
        rows = conn.execute("SELECT author, text, state FROM reminders").fetchall()
    assert [(r["author"], r["text"]) for r in rows] == [("assistant", "rem1 tell Ann the tea is ready")]
    await tg.wait_for(lambda: "echo: rem1 tell Ann the tea is ready" in tg.texts(OWNER), 90, "the reminder's turn")
    await tg.wait_for(lambda: (c := daemon.chat(str(OWNER))) is not None and c["status"] == "idle", 60, "idle")
    assert tg.texts(OWNER).count("echo: rem1 tell Ann the tea is ready") == 1
    with daemon.db() as conn:
        assert conn.execute("SELECT state FROM reminders").fetchone()[0] == "done"
