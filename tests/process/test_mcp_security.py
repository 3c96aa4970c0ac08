"""Who gets into the notebook's /mcp (issue 12, S1) through the real daemon: the token eve's
notebook connection sends (the fake eve's ``mcp_token``; the real eve built with
NOTEBOOK_MCP_TOKEN), a wrong one, the start-up refusal off loopback, the warning on loopback,
and what ``iva check`` can and cannot tell."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import eve_client as eve
from bridge.chat.transitions import Transitions
from bridge.notebook import Notebook, NotebookConfig
from bridge.storage.state import open_state
from bridge.web.listener import Listener
from bridge.web.mcp import TOOLS, McpServer
from tests.conftest import MCP_TOKENS, OWNER, REAL, ROOT, free_port
from tests.daemons import check_env, iva_check
from tests.fakes.telegram import TOKEN
from tests.scenarios import owner_turn

SAVE = '[[mcp=chat_note_save {"name": "shop", "description": "list", "body": "milk"}]]'


def notes(d) -> dict[str, str]:
    with d.db() as conn:
        return {r["name"]: r["body"] for r in conn.execute("SELECT name, body FROM notes WHERE address = ?",
                                                           (str(OWNER),))}


async def post(url: str, message: dict[str, Any], **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=message, headers=headers) as response:
        return response.status, await response.json(content_type=None)


@pytest.mark.process
async def test_eve_with_the_token_saves_and_a_caller_without_it_gets_401(tg, daemon_factory, fake_eve):
    """The fake eve sends its mcp_token; daemon_factory gives the daemon the same IVA_MCP_TOKEN."""
    fake_eve.mcp_token = "fake-mcp-token-1"
    d = daemon_factory(fake_eve.url, fake_eve.token)
    assert d.env["IVA_MCP_TOKEN"] == "fake-mcp-token-1"
    fake_eve.mcp_url = d.api_url + "/mcp"
    await d.start()
    await tg.message(f"remember {SAVE}", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    assert fake_eve.mcp_results[0]["is_error"] is False and notes(d) == {"shop": "milk"}
    session = fake_eve.mcp_results[0]["session"]
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"authorization": "Bearer fake-mcp-token-2"}):
        status, body = await post(fake_eve.mcp_url, listing, **{"x-eve-session-id": session}, **headers)
        assert status == 401 and body["error"]["code"] == -32001, body
    assert "mcp_unauthorized" in d.logs() and "mcp_without_token" not in d.logs()


@pytest.mark.process
async def test_eve_with_a_wrong_token_gets_no_tools_and_writes_nothing(tg, daemon_factory, fake_eve):
    fake_eve.mcp_token = "eves-stale-token"
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="iva-new-token")
    fake_eve.mcp_url = d.api_url + "/mcp"
    await d.start()
    await tg.message(f"remember {SAVE}", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    assert fake_eve.mcp_results[0]["listed"] == [] and notes(d) == {}
    assert '"event": "mcp_unauthorized"' in d.logs() and '"reason": "wrong"' in d.logs()


@pytest.mark.process
async def test_iva_refuses_to_start_off_loopback_without_the_token_and_warns_on_loopback(tg, daemon_factory, fake_eve):
    """S1: IVA_API_LISTEN=0.0.0.0 without IVA_MCP_TOKEN is a configuration error (exit 2, one line
    naming the fix); on loopback the bridge runs and says at start that /mcp has no token."""
    env = {**os.environ, "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": fake_eve.url,
           "IVA_OWNER_IDS": str(OWNER), "IVA_API_LISTEN": f"0.0.0.0:{free_port()}"}
    env.pop("IVA_MCP_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bridge", "run", cwd=ROOT, env=env,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, out
    [line] = [x for x in out.decode().splitlines() if "IVA_MCP_TOKEN" in x]
    assert "IVA_API_LISTEN=0.0.0.0:" in line and "is not loopback" in line and "NOTEBOOK_MCP_TOKEN" in line
    assert not tg.calls_of("getMe")  # refused before reaching anything

    d = daemon_factory(fake_eve.url, fake_eve.token)
    assert "IVA_MCP_TOKEN" not in d.env
    await d.start()
    assert "mcp_without_token" in d.logs()


@pytest.mark.process
async def test_check_says_what_it_cannot_see_and_warns_without_the_token(tg, fake_eve):
    """eve's /info shows no connection headers (hasHeaders is false even with a resolver), so the
    check says it cannot tell whether eve sends the token; Iva's own missing token is a warning."""
    fake_eve.mcp_url = "http://127.0.0.1:8787/mcp"
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0 and "warn notebook: IVA_MCP_TOKEN is not set" in out
    assert "note notebook: eve's /info does not show the 'notebook' connection's headers" in out
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="mcp-token-1"))
    assert code == 0 and "warn" not in out and "note notebook: eve's /info does not show" in out


# -- the real eve ------------------------------------------------------------------------------

@REAL
async def test_the_real_eve_sends_the_token_and_fills_the_session_argument_no_schema_names(tmp_path: Path, real_eve):
    """PROTOCOL.md §11 and item 3 of issue 12, observed: the MCP server lists tools whose schemas
    have no eve_session_id, and eve still adds it to every tools/call (equal to the header), with
    ``authorization: Bearer <NOTEBOOK_MCP_TOKEN>`` on every request; the note is saved."""
    seen: list[tuple[dict[str, str], Any]] = []  # (headers, message) of every POST
    statuses: list[tuple[str | None, int]] = []  # (JSON-RPC method, HTTP status)

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        message = json.loads(body) if body else None
        if request.method == "POST":
            seen.append(({k.lower(): v for k, v in request.headers.items()}, message))
        response = await handler(request)
        statuses.append((message.get("method") if isinstance(message, dict) else None, response.status))
        return response

    state = await open_state(tmp_path / "iva.sqlite3")
    notebook = Notebook(state.db, state.store, NotebookConfig())
    token = MCP_TOKENS[real_eve.url]
    listener = Listener(real_eve.mcp_listen, store=state.store, queue=state.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[McpServer(notebook, state.store, token=token).routes,
                                lambda app: app.middlewares.append(record)])
    await listener.start()
    try:
        async with eve.EveClient(real_eve.url, token=real_eve.token) as client:
            session = await client.create_session()
            await owner_turn(Transitions(store=state.store, queue=state.queue, notebook=notebook), "7", session)
            await client.send(session, 'sa1 [[call=notebook__chat_note_save {"name": "shop", "description": "list", '
                                       '"body": "milk"}]]')
            for _ in range(600):
                if saved := await notebook.notes("7"):
                    break
                await asyncio.sleep(0.05)
    finally:
        await listener.stop()
        await state.db.close()
    assert [(n.name, n.body) for n in saved] == [("shop", "milk")]
    calls = [(h, m) for h, m in seen if isinstance(m, dict) and m.get("method") == "tools/call"]
    lists = [(h, m) for h, m in seen if isinstance(m, dict) and m.get("method") == "tools/list"]
    assert calls and lists, [m for _, m in seen]
    assert all("eve_session_id" not in json.dumps(t["inputSchema"]) for t in TOOLS.values())
    assert all(h.get("authorization") == f"Bearer {token}" for h, _ in seen), seen
    headers, call = calls[0]
    assert call["params"]["arguments"] == {"name": "shop", "description": "list", "body": "milk",
                                           "eve_session_id": session}
    assert headers["x-eve-session-id"] == session
    # eve probes server/discover at MCP 2026-07-28; the 400 for that version sends it to initialize.
    assert seen[0][0]["mcp-protocol-version"] == "2026-07-28" and statuses[0] == ("server/discover", 400)
    assert ("initialize", 200) in statuses and ("tools/call", 200) in statuses
    for _ in range(200):  # the model's next step gets the tool's result
        answered = [r for r in real_eve.llm_requests() if "sa1" in (r.get("latest_user") or "") and r.get("tool_results")]
        if answered:
            break
        await asyncio.sleep(0.05)
    assert json.loads(answered[-1]["tool_results"][-1]["content"])["saved"] == "shop"


@pytest.mark.process
@REAL
async def test_the_real_eve_with_a_wrong_token_gets_no_tools_and_the_turn_goes_on(tg, daemon_factory, real_eve):
    """eve reads the 401 as "needs authorization" and tells the model so; the turn still ends."""
    d = daemon_factory(real_eve.url, real_eve.token, IVA_MCP_TOKEN="not-what-eve-was-built-with")
    await d.start()
    await tg.message('wt1 [[call=notebook__chat_note_save {"name": "shop", "description": "list", "body": "milk"}]]',
                     user_id=OWNER)
    await tg.wait_texts(1, timeout=60)
    assert notes(d) == {}
    records = [r for r in real_eve.llm_requests() if "wt1" in (r.get("latest_user") or "") and r.get("tool_results")]
    seen_by_model = records[-1]["tool_results"][-1]["content"]
    assert '"notebook" requires authorization' in seen_by_model, seen_by_model
    assert "mcp_unauthorized" in d.logs()
