"""The notebook's MCP server and the owner API as an HTTP surface (issue 12, S1), in process on
the real store: who gets in (bearer token, no browser Origin, JSON bodies only), the session-id
gate behind the token, tool schemas without the session id, and JSON-RPC errors for malformed
messages, never a 500 (MCP 2025-11-25 over Streamable HTTP)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bridge.chat.transitions import Transitions
from bridge.config import ConfigError, Settings, is_loopback
from bridge.notebook import Notebook, NotebookConfig
from bridge.storage.state import open_state
from bridge.web.listener import Listener
from bridge.web.mcp import TOOLS, McpServer
from bridge.web.owner_api import OwnerApi
from tests.scenarios import owner_turn

MCP_TOKEN = "mcp-secret-1"
API_TOKEN = "api-secret-1"
CHAT = "1"
SESSION = "wrun_owner"
JSON = {"content-type": "application/json"}
AUTH = {"authorization": f"Bearer {MCP_TOKEN}", **JSON}


@dataclass
class Surface:
    http: TestClient
    tr: Transitions

    async def notes(self) -> list[Any]:
        assert self.tr.notebook is not None
        return await self.tr.notebook.notes(CHAT)

    async def rpc(self, message: Any, *, headers: dict[str, str | None] | None = None,
                  session: str | None = SESSION) -> tuple[int, Any, dict[str, str]]:
        """POST one raw message to /mcp; (status, JSON body or None, headers)."""
        merged = {**AUTH, **({"x-eve-session-id": session} if session else {}), **(headers or {})}
        sent = {k: v for k, v in merged.items() if v is not None}  # None: leave the header out
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        async with self.http.post("/mcp", data=data, headers=sent) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None, dict(response.headers)

    async def call(self, method: str, params: Any = None, **kw: Any) -> tuple[int, Any, dict[str, str]]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            message["params"] = params
        return await self.rpc(message, **kw)


@pytest.fixture
async def surface(tmp_path: Path) -> AsyncIterator[Surface]:
    state = await open_state(tmp_path / "iva.sqlite3")
    notebook = Notebook(state.db, state.store, NotebookConfig())
    tr = Transitions(store=state.store, queue=state.queue, notebook=notebook)
    await owner_turn(tr, CHAT, SESSION)
    app = web.Application()
    McpServer(notebook, state.store, token=MCP_TOKEN).routes(app)
    OwnerApi(API_TOKEN, notebook, state.store).routes(app)
    async with TestClient(TestServer(app)) as http:
        yield Surface(http, tr)
    await state.db.close()


SAVE = {"name": "chat_note_save", "arguments": {"name": "shop", "description": "list", "body": "milk",
                                                "eve_session_id": SESSION}}


# -- who gets in -------------------------------------------------------------------------------

async def test_mcp_without_or_with_a_wrong_bearer_is_401_with_a_json_rpc_error(surface):
    """S1: no token, a wrong one, another scheme → 401, WWW-Authenticate: Bearer, a JSON-RPC error,
    and nothing written; the right one gets in."""
    for auth in (None, "", "Bearer", "Bearer wrong", f"Basic {MCP_TOKEN}", f"Bearer {MCP_TOKEN}x", MCP_TOKEN):
        status, body, headers = await surface.call("tools/call", SAVE, headers={"authorization": auth})
        assert status == 401, (auth, status, body)
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert body["jsonrpc"] == "2.0" and body["id"] is None and "IVA_MCP_TOKEN" in body["error"]["message"]
    assert await surface.notes() == []
    status, body, _ = await surface.call("tools/call", SAVE)
    assert status == 200 and body["result"]["isError"] is False


async def test_the_session_check_stays_a_second_gate_after_the_token(surface):
    """The bearer gets a request in; the session id still decides whose notebook, and a header
    and an argument that disagree are refused."""
    other = {**SAVE, "arguments": {**SAVE["arguments"], "eve_session_id": "wrun_other"}}
    status, body, _ = await surface.call("tools/call", other)
    assert status == 200 and body["result"]["isError"] and "refused" in body["result"]["content"][0]["text"]
    status, body, _ = await surface.call("tools/list", {}, session="wrun_stranger")
    assert body["result"]["tools"] == []
    assert await surface.notes() == []


async def test_tool_schemas_never_carry_the_session_id(surface):
    """eve fills the provided argument eve_session_id itself and strips it from what the model
    sees (PROTOCOL.md §11; eve's resolveProvidedArguments), so no schema names it."""
    status, body, _ = await surface.call("tools/list", {})
    assert status == 200 and {t["name"] for t in body["result"]["tools"]} == set(TOOLS) - {"chat_note_read"}
    for tool in [*body["result"]["tools"], *TOOLS.values()]:
        assert "eve_session_id" not in json.dumps(tool["inputSchema"]), tool["name"]
    # ...and a call that carries it (as eve's do) is still accepted against additionalProperties: false.
    status, body, _ = await surface.call("tools/call", SAVE)
    assert body["result"]["structuredContent"] == {"saved": "shop", "created": True, "chars": 4, "pinned": False}


@pytest.mark.parametrize("origin", ["https://evil.example", "http://127.0.0.1:8787", "null"])
async def test_a_browser_origin_is_refused_on_mcp_and_the_owner_api(surface, origin):
    """S1: any Origin header (a web page, one on a rebound name, a sandboxed frame) → 403, before
    the token is even looked at; eve and curl send none."""
    status, body, _ = await surface.call("tools/call", SAVE, headers={"origin": origin})
    assert status == 403 and body["error"]["code"] == -32600
    api = {"authorization": f"Bearer {API_TOKEN}", "origin": origin}
    for method, path, data in (("GET", "/v1/chats/1/notes", None), ("PUT", "/v1/chats/1/notes/x", b'{"body": "b"}'),
                               ("POST", "/v1/chats/1/notes/seen", b"{}")):
        async with surface.http.request(method, path, data=data, headers={**api, **JSON}) as response:
            assert response.status == 403 and (await response.json())["code"] == "origin_refused", (method, path)
    assert await surface.notes() == []


async def test_a_body_that_is_not_json_is_415_on_mcp_and_the_owner_api(surface):
    """S1: a POST/PUT body must be application/json (a form or text/plain post is what a page can
    send without asking first); a body-less POST stays fine."""
    payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": SAVE}).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "application/octet-stream"):
        status, body, _ = await surface.rpc(payload, headers={"content-type": kind})
        assert status == 415 and body["error"]["code"] == -32600 and kind in body["error"]["message"]
        async with surface.http.put("/v1/chats/1/notes/x", data=b'{"body": "b"}',
                                    headers={"authorization": f"Bearer {API_TOKEN}", "content-type": kind}) as response:
            assert response.status == 415 and (await response.json())["code"] == "not_json"
    assert await surface.notes() == []
    status, body, _ = await surface.rpc(payload, headers={"content-type": "application/json; charset=utf-8"})
    assert status == 200 and body["result"]["isError"] is False
    async with surface.http.post("/v1/chats/1/notes/seen",
                                 headers={"authorization": f"Bearer {API_TOKEN}"}) as response:
        assert response.status == 200  # no body at all


# -- JSON-RPC and Streamable HTTP correctness --------------------------------------------------

@pytest.mark.parametrize("params", [[1, 2], "x", 3, True])
async def test_params_that_are_not_an_object_are_invalid_params(surface, params):
    for method in ("tools/call", "tools/list", "initialize"):
        status, body, _ = await surface.call(method, params)
        assert status == 200 and body["id"] == 1 and body["error"]["code"] == -32602, (method, body)


@pytest.mark.parametrize("arguments", [["shop"], "shop", 7])
async def test_arguments_that_are_not_an_object_are_invalid_params(surface, arguments):
    status, body, _ = await surface.call("tools/call", {"name": "chat_note_save", "arguments": arguments})
    assert status == 200 and body["error"]["code"] == -32602 and "arguments" in body["error"]["message"]


async def test_a_tool_name_or_session_argument_of_the_wrong_type_is_invalid_params(surface):
    for params in ({"name": ["chat_note_save"], "arguments": {}},
                   {"name": "chat_note_save", "arguments": {"name": "a", "body": "b", "eve_session_id": {"x": 1}}}):
        status, body, _ = await surface.call("tools/call", params)
        assert status == 200 and body["error"]["code"] == -32602, body


@pytest.mark.parametrize("msg_id", [None, 1.5, {"a": 1}, [1], True])
async def test_an_id_that_is_null_or_not_a_string_or_integer_is_an_invalid_request(surface, msg_id):
    """MCP: request ids are strings or integers, never null (a null id is not a notification)."""
    status, body, _ = await surface.rpc({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": SAVE})
    assert status == 200 and body["id"] is None and body["error"]["code"] == -32600, body
    assert await surface.notes() == []


@pytest.mark.parametrize("version", ["2099-01-01", "latest", "2026-07-28", ""])
async def test_an_unsupported_protocol_version_header_is_400_with_a_json_rpc_error(surface, version):
    status, body, _ = await surface.call("tools/list", {}, headers={"mcp-protocol-version": version})
    assert status == 400 and body["error"]["code"] == -32600 and "MCP-Protocol-Version" in body["error"]["message"]
    for good in ("2025-11-25", "2025-06-18", "2025-03-26"):
        status, body, _ = await surface.call("tools/list", {}, headers={"mcp-protocol-version": good})
        assert status == 200 and "tools" in body["result"]


@pytest.mark.parametrize("message", [
    {"jsonrpc": "2.0", "id": 4, "result": {}},
    {"jsonrpc": "2.0", "id": 4, "error": {"code": -32601, "message": "no"}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
])
async def test_a_posted_response_or_notification_is_202_with_no_body(surface, message):
    status, body, _ = await surface.rpc(message)
    assert status == 202 and body is None


@pytest.mark.parametrize("message", [
    {"jsonrpc": "2.0", "id": 1, "method": 5}, {"jsonrpc": "1.0", "id": 1, "method": "ping"}, {"id": 1},
    [], "ping", 7, None,
])
async def test_other_malformed_messages_are_invalid_requests(surface, message):
    status, body, _ = await surface.rpc(message)
    assert status == 200 and body["error"]["code"] == -32600, body


async def test_parse_errors_and_unknown_methods(surface):
    status, body, _ = await surface.rpc(b"{not json")
    assert status == 400 and body["error"]["code"] == -32700
    status, body, _ = await surface.call("server/discover")
    assert status == 200 and body["error"]["code"] == -32601
    status, body, _ = await surface.call("resources/list", {})
    assert status == 200 and body["error"]["code"] == -32601


# -- a slow disk (issue 11 §4) -------------------------------------------------------------------

async def test_tools_list_and_healthz_answer_while_the_writer_holds_the_lock(surface):
    """On a slow disk the writer's lock is held by a queue of transactions, each ending in an
    fsync of 50 ms or more (benchmark 7: /healthz waited up to 2 s behind it). tools/list (eve
    gives it 10 s) and /healthz read the last committed state instead: here a transaction holds
    the lock until both have answered. (The 10 s limits only break the deadlock of the old code.)"""
    db = surface.tr.store.db
    holding, done = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with db.transaction():
            await db.execute("UPDATE chats SET progress_at = progress_at WHERE address = ?", (CHAT,))
            holding.set()
            await done.wait()

    task = asyncio.create_task(writer())
    await holding.wait()
    try:
        status, body, _ = await asyncio.wait_for(surface.call("tools/list", {}), 10)
        assert status == 200 and {t["name"] for t in body["result"]["tools"]} == set(TOOLS) - {"chat_note_read"}
        listener = Listener("127.0.0.1:0", store=surface.tr.store, queue=surface.tr.queue,
                            ingest=SimpleNamespace(last_poll_ok=time.time(), storage_error=None))  # type: ignore[arg-type]
        response = await asyncio.wait_for(listener.healthz(None), 10)  # type: ignore[arg-type]
        assert response.status == 200
        assert json.loads(response.text or "")["busy_chats"] == 1
        assert not task.done()
    finally:
        done.set()
        await task


# -- the start-up rules --------------------------------------------------------------------------

ENV = {"IVA_TELEGRAM_TOKEN": "123456:ABCDEFGHIJKLMNOPQRSTUVWXYZ", "IVA_EVE_URL": "http://127.0.0.1:3000",
       "IVA_OWNER_IDS": "1"}


@pytest.mark.parametrize("listen", ["0.0.0.0:8787", "[::]:8787", "192.168.1.5:8787", "iva.lan:8787"])
def test_iva_refuses_to_start_off_loopback_without_the_mcp_token(listen):
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({**ENV, "IVA_API_LISTEN": listen})
    [problem] = refused.value.problems
    assert "IVA_MCP_TOKEN" in problem and "\n" not in problem
    assert Settings.from_env({**ENV, "IVA_API_LISTEN": listen, "IVA_MCP_TOKEN": "t"}).api.mcp_token == "t"
    assert Settings.from_env({**ENV, "IVA_API_LISTEN": listen, "IVA_NOTES_ENABLED": "0"}).api.mcp_token is None


@pytest.mark.parametrize("listen", ["127.0.0.1:8787", "127.0.0.2:1", "localhost:8787", "[::1]:8787"])
def test_a_loopback_listener_starts_without_the_token(listen):
    assert is_loopback(listen)
    assert Settings.from_env({**ENV, "IVA_API_LISTEN": listen}).api.mcp_token is None


def test_the_mcp_token_is_not_the_owner_apis_and_is_never_in_repr():
    with pytest.raises(ConfigError, match="IVA_MCP_TOKEN must differ from IVA_API_TOKEN"):
        Settings.from_env({**ENV, "IVA_MCP_TOKEN": "same-token", "IVA_API_TOKEN": "same-token"})
    assert "mcp-secret" not in repr(Settings.from_env({**ENV, "IVA_MCP_TOKEN": "mcp-secret"}))
