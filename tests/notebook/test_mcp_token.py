"""Who gets into the notebook's /mcp (issue 12, S1) through the bridge in process with its listener
(tests/harness.py): the token eve's notebook connection sends (the fake eve's ``mcp_token``; the
real eve built with NOTEBOOK_MCP_TOKEN), a wrong one, and the warning on loopback without one. The
start-up refusal off loopback and what ``iva check`` says run the CLI: tests/process/test_mcp_security.py."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import OWNER, REAL

SAVE = '[[mcp=chat_note_save {"name": "shop", "description": "list", "body": "milk"}]]'


def notes(d) -> dict[str, str]:
    with d.db() as conn:
        return {r["name"]: r["body"] for r in conn.execute("SELECT name, body FROM notes WHERE address = ?",
                                                           (str(OWNER),))}


async def post(url: str, message: dict[str, Any], **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=message, headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def test_eve_with_the_token_saves_and_a_caller_without_it_gets_401(tg, eve_in_process_factory, fake_eve):
    """The fake eve sends its mcp_token; eve_in_process_factory gives the bridge the same IVA_MCP_TOKEN."""
    fake_eve.mcp_token = "fake-mcp-token-1"
    d = eve_in_process_factory(fake_eve.url, fake_eve.token, fake_eve, listen=True,
                               IVA_NOTES_ENABLED="1")  # the daemon's default: notes on
    assert d.env["IVA_MCP_TOKEN"] == "fake-mcp-token-1"
    fake_eve.mcp_url = d.api_url + "/mcp"
    with d.catching_logs():
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


async def test_eve_with_a_wrong_token_gets_no_tools_and_writes_nothing(tg, eve_in_process_factory, fake_eve):
    fake_eve.mcp_token = "eves-stale-token"
    d = eve_in_process_factory(fake_eve.url, fake_eve.token, fake_eve, listen=True, IVA_NOTES_ENABLED="1",
                               IVA_MCP_TOKEN="iva-new-token")
    fake_eve.mcp_url = d.api_url + "/mcp"
    with d.catching_logs():
        await d.start()
        await tg.message(f"remember {SAVE}", user_id=OWNER)
        await tg.wait_texts(1, timeout=30)
    assert fake_eve.mcp_results[0]["listed"] == [] and notes(d) == {}
    assert '"event": "mcp_unauthorized"' in d.logs() and '"reason": "wrong"' in d.logs()


async def test_on_loopback_without_the_token_iva_runs_and_warns(tg, eve_in_process_factory, fake_eve):
    """S1: on loopback the bridge runs without IVA_MCP_TOKEN and says at start that /mcp has no
    token (the refusal off loopback: tests/process/test_mcp_security.py)."""
    d = eve_in_process_factory(fake_eve.url, fake_eve.token, fake_eve, listen=True, IVA_NOTES_ENABLED="1")
    assert "IVA_MCP_TOKEN" not in d.env
    with d.catching_logs():
        await d.start()
    assert "mcp_without_token" in d.logs()


# -- the real eve (the bridge in process against it, as tests/contract/ does) -------------------

@REAL
async def test_the_real_eve_with_a_wrong_token_gets_no_tools_and_the_turn_goes_on(tg, eve_in_process_factory, real_eve):
    """eve reads the 401 as "needs authorization" and tells the model so; the turn still ends."""
    d = eve_in_process_factory(real_eve.url, real_eve.token, IVA_NOTES_ENABLED="1",
                               IVA_MCP_TOKEN="not-what-eve-was-built-with")
    with d.catching_logs():
        await d.start()
        await tg.message('wt1 [[call=notebook__chat_note_save '
                         '{"name": "shop", "description": "list", "body": "milk"}]]',
                         user_id=OWNER)
        await tg.wait_texts(1, timeout=60)
    assert notes(d) == {}
    records = [r for r in real_eve.llm_requests() if "wt1" in (r.get("latest_user") or "") and r.get("tool_results")]
    seen_by_model = records[-1]["tool_results"][-1]["content"]
    assert '"notebook" requires authorization' in seen_by_model, seen_by_model
    assert "mcp_unauthorized" in d.logs()
