"""Who gets into the notebook's /mcp (issue 12, S1), where it takes a process: the start-up refusal
off loopback (``python -m bridge run``'s exit), what ``iva check`` can and cannot tell, and what
the real eve sends. The rest runs in process: tests/notebook/test_mcp_token.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

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


@pytest.mark.process
async def test_iva_refuses_to_start_off_loopback_without_the_token(tg, fake_eve):
    """S1: IVA_API_LISTEN=0.0.0.0 without IVA_MCP_TOKEN is a configuration error (exit 2, one line
    naming the fix), from ``python -m bridge run`` itself; the warning on loopback:
    tests/notebook/test_mcp_token.py."""
    env = {**os.environ, "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": fake_eve.url,
           "IVA_OWNER_IDS": str(OWNER), "IVA_API_LISTEN": f"0.0.0.0:{free_port()}"}
    env.pop("IVA_MCP_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bridge", "run", cwd=ROOT, env=env,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)  # a failure bound: a loaded machine imports slowly
    finally:
        if proc.returncode is None:  # failed: nothing of it may outlive the test (its transport neither)
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2, out
    [line] = [x for x in out.decode().splitlines() if "IVA_MCP_TOKEN" in x]
    assert "IVA_API_LISTEN=0.0.0.0:" in line and "is not loopback" in line and "NOTEBOOK_MCP_TOKEN" in line
    assert not tg.calls_of("getMe")  # refused before reaching anything


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
        answered = [r for r in real_eve.llm_requests()
                    if "sa1" in (r.get("latest_user") or "") and r.get("tool_results")]
        if answered:
            break
        await asyncio.sleep(0.05)
    assert json.loads(answered[-1]["tool_results"][-1]["content"])["saved"] == "shop"
