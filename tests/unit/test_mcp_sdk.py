"""The notebook's MCP server driven by the official MCP Python SDK (PyPI ``mcp``, 2.x; issue 12,
S1): the real listener on loopback with the McpServer on the real store, and the SDK's
Streamable HTTP client with the bearer token — connect (it probes ``server/discover`` and
falls back to ``initialize``), tools/list, tools/call that saves a note in an owner's turn, and
the errors a client meets: an unknown tool, a refused session, no token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from bridge.chat.transitions import Transitions
from bridge.notebook import Notebook, NotebookConfig
from bridge.storage.state import open_state
from bridge.web.listener import Listener
from bridge.web.mcp import McpServer
from tests.conftest import free_port
from tests.scenarios import owner_turn

TOKEN = "sdk-mcp-token"
CHAT = "42"
SESSION = "wrun_sdk_owner"


@dataclass
class Served:
    url: str
    notebook: Notebook


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    state = await open_state(tmp_path / "iva.sqlite3")
    notebook = Notebook(state.db, state.store, NotebookConfig())
    await owner_turn(Transitions(store=state.store, queue=state.queue, notebook=notebook), CHAT, SESSION)
    listen = f"127.0.0.1:{free_port()}"
    listener = Listener(listen, store=state.store, queue=state.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[McpServer(notebook, state.store, token=TOKEN).routes])
    await listener.start()
    try:
        yield Served(f"http://{listen}/mcp", notebook)
    finally:
        await listener.stop()
        await state.db.close()


def client(url: str, **headers: str) -> mcp.Client:
    http = create_mcp_http_client(headers=headers)
    return mcp.Client(streamable_http_client(url, http_client=http), raise_exceptions=True)


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def test_the_official_client_initializes_lists_and_saves_a_note(served):
    async with client(served.url, authorization=f"Bearer {TOKEN}", **{"x-eve-session-id": SESSION}) as c:
        session = c.session
        assert session.initialize_result is not None  # discover refused → the initialize handshake
        assert session.initialize_result.server_info.name == "iva-notebook"
        assert session.protocol_version == "2025-11-25"
        listed = await c.list_tools()
        names = {t.name for t in listed.tools}
        assert names == {"chat_note_save", "chat_note_delete", "chat_note_pin", "chat_note_unpin"}  # inline mode
        assert all("eve_session_id" not in (t.input_schema.get("properties") or {}) for t in listed.tools)
        saved = await c.call_tool("chat_note_save", {"name": "shop", "description": "list", "body": "milk",
                                                     "eve_session_id": SESSION})
        assert saved.is_error is False and saved.structured_content == {
            "saved": "shop", "created": True, "chars": 4, "pinned": False}
        # A tool error (over a limit) is a result with isError, not a protocol error.
        refused = await c.call_tool("chat_note_save", {"name": "Bad Name!", "body": "x"})
        assert refused.is_error is True and "slug" in text(refused).lower()
        # A tool that does not exist for this chat (no read tool in inline mode) is a protocol error.
        with pytest.raises(MCPError) as unknown:
            await c.call_tool("chat_note_read", {"name": "shop"})
        assert unknown.value.error.code == -32602
    assert [(n.name, n.body) for n in await served.notebook.notes(CHAT)] == [("shop", "milk")]


async def test_a_session_outside_an_owner_turn_gets_no_tools_and_writes_nothing(served):
    async with client(served.url, authorization=f"Bearer {TOKEN}", **{"x-eve-session-id": "wrun_other"}) as c:
        assert (await c.list_tools()).tools == []
        refused = await c.call_tool("chat_note_save", {"name": "x", "body": "y"})
        assert refused.is_error is True and "owner's own turns" in text(refused)
    assert await served.notebook.notes(CHAT) == []


@pytest.mark.parametrize("auth", [None, "Bearer wrong"])
async def test_the_official_client_without_the_token_cannot_connect(served, auth):
    headers = {"x-eve-session-id": SESSION, **({"authorization": auth} if auth else {})}
    with pytest.raises(Exception) as raised:  # the SDK wraps it in its task group's group
        async with client(served.url, **headers):
            pass
    refused: BaseException = raised.value
    while isinstance(refused, BaseExceptionGroup) and len(refused.exceptions) == 1:
        refused = refused.exceptions[0]
    assert isinstance(refused, MCPError), repr(refused)
    assert refused.error.code == -32001 and "IVA_MCP_TOKEN" in refused.error.message
    assert await served.notebook.notes(CHAT) == []
    async with httpx2.AsyncClient() as http:  # what the client saw on the wire
        response = await http.post(served.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers)
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
