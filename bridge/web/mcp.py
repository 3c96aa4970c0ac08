"""The notebook's tools, served to eve as an MCP server (Streamable HTTP, stateless, JSON
answers) on the bridge's local listener at ``/mcp`` (N3, N5).

Who gets in (S1), in this order: no browser ``Origin`` (403); ``Authorization: Bearer
$IVA_MCP_TOKEN`` when the token is set (401 with ``WWW-Authenticate: Bearer``; without a token, which
only a loopback listener allows, anyone local may ask); an ``application/json`` body (415); a
``MCP-Protocol-Version`` header, when sent, that we speak (400). Every refusal is a JSON-RPC error.

eve calls the server with the session id in the ``x-eve-session-id`` header on every request
and as the provided argument ``eve_session_id`` on every tool call (PROTOCOL.md §11); that id
maps the call to its chat, and a call whose two ids differ is refused. eve fills a provided
argument whatever the server's schema says (it adds it to every call and strips it from the
schema the model sees), so the tools' schemas do not mention it. The gate is the same for listing
and for calling: no tools for a session we do not know (a subagent, a rebuild's throwaway session)
or outside an owner's turn, and no ``chat_note_read`` in inline mode, so the model cannot even
find it.

eve first tries ``server/discover`` (MCP 2026-07-28) with that version in the header; we refuse
the version (400) or, without the header, answer "method not found", and it falls back to
``initialize`` (2025-11-25), which needs no session: every request stands alone.

Malformed messages get JSON-RPC errors, never a 500: a non-object ``params`` or ``arguments`` is
-32602, a null or non-scalar ``id`` is -32600 (MCP ids are strings or integers), a posted
response or notification is accepted with 202 and no body.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .. import log
from ..notebook.rules import INDEX, NoteError
from ..notebook.service import Notebook
from ..push.reminders import Reminders
from ..push.tools import REMINDER_TOOLS, run_tool
from ..push.turns import PushError
from ..storage.store import Chat, Store
from ..toolschema import tool as _tool
from .guards import bearer_matches, browser_origin, not_json

__all__ = ["PROTOCOL_VERSION", "TOOLS", "McpServer"]

logger = log.get(__name__)

PROTOCOL_VERSION = "2025-11-25"
_SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
_SESSION_ARG = "eve_session_id"

_NAME = {"type": "string", "description": "The note's name: a slug of a-z, 0-9, '_' and '-', at most 48."}

_PARSE_ERROR, _INVALID_REQUEST, _METHOD_NOT_FOUND, _INVALID_PARAMS, _INTERNAL = -32700, -32600, -32601, -32602, -32603
_UNAUTHORIZED = -32001  # implementation-defined (JSON-RPC reserves -32000..-32099 for servers)



TOOLS: dict[str, dict[str, Any]] = {t["name"]: t for t in (
    _tool("chat_note_save",
          "Save a note for yourself in this chat's notebook (create, or overwrite the whole note). Notes outlive "
          "compaction and /new. Body at most 2000 characters; split longer things into two notes.",
          {"name": _NAME,
           "description": {"type": "string", "description": "One line (at most 120) saying what the note is "
                           "about; needed for a new note, kept when omitted on an update."},
           "body": {"type": "string", "description": "The whole text of the note."},
           "pinned": {"type": "boolean", "description": "Pin it: its body is shown in full every turn."}},
          ["name", "body"]),
    _tool("chat_note_read", "Read the full body of one note of this chat's notebook.", {"name": _NAME}, ["name"],
          read_only=True),
    _tool("chat_note_delete", "Delete a note of this chat's notebook that is done or no longer true.",
          {"name": _NAME}, ["name"], destructive=True),
    _tool("chat_note_pin", "Pin a note: its body is shown in full in every turn (a small shared budget).",
          {"name": _NAME}, ["name"]),
    _tool("chat_note_unpin", "Unpin a note: in index mode only its name and description are shown.",
          {"name": _NAME}, ["name"]),
)}


class _Refused(Exception):
    pass


class _Unknown(Exception):
    pass


class McpServer:
    def __init__(self, notebook: Notebook, store: Store, *, token: str | None = None,
                 reminders: Reminders | None = None) -> None:
        self.notebook = notebook
        self.store = store
        self.token = token
        self.reminders = reminders  # W9: the reminder tools ride on this connection, behind the same gate
        self.tools = dict(TOOLS)
        if reminders is not None:
            self.tools.update(REMINDER_TOOLS)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/mcp", self.post)
        app.router.add_route("GET", "/mcp", self.no_stream)
        app.router.add_route("DELETE", "/mcp", self.no_stream)

    async def no_stream(self, request: web.Request) -> web.Response:
        # Stateless: no server-initiated stream, no session to end (Streamable HTTP allows 405).
        return web.Response(status=405, headers={"allow": "POST"})

    def _refused(self, request: web.Request) -> web.Response | None:
        """S1, before the body is read: a browser, a missing or wrong token, a body that is not
        JSON, a protocol version we do not speak."""
        if (origin := browser_origin(request)) is not None:
            logger.warning("mcp_origin_refused", origin=origin)
            return _http_error(403, _INVALID_REQUEST, "Forbidden: browser requests (with an Origin) are refused.")
        if self.token and not bearer_matches(request, self.token):
            logger.warning("mcp_unauthorized", reason="wrong" if "authorization" in request.headers else "missing")
            return _http_error(401, _UNAUTHORIZED, "Unauthorized: send Authorization: Bearer <IVA_MCP_TOKEN>.",
                               **{"www-authenticate": 'Bearer realm="iva-mcp"'})
        if (kind := not_json(request)) is not None:
            return _http_error(415, _INVALID_REQUEST, f"Unsupported Media Type: send application/json, not {kind}.")
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in _SUPPORTED:
            return _http_error(400, _INVALID_REQUEST, f"Bad Request: unsupported MCP-Protocol-Version {version!r}; "
                                                      f"supported: {', '.join(_SUPPORTED)}.")
        return None

    async def post(self, request: web.Request) -> web.StreamResponse:
        if (refusal := self._refused(request)) is not None:
            return refusal
        try:
            message = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response(_error(None, _PARSE_ERROR, "Parse error"), status=400)
        session = request.headers.get("x-eve-session-id", "")
        if isinstance(message, list):  # a JSON-RPC batch (2025-03-26 clients)
            if not message:
                return web.json_response(_error(None, _INVALID_REQUEST, "Invalid Request: an empty batch"))
            answers = [a for m in message if (a := await self._safe(m, session)) is not None]
            return web.json_response(answers) if answers else web.Response(status=202)
        answer = await self._safe(message, session)
        return web.json_response(answer) if answer is not None else web.Response(status=202)

    async def _safe(self, message: Any, session: str) -> dict[str, Any] | None:
        try:
            return await self._one(message, session)
        except Exception as exc:  # a bug or a database fault: an answer, not a 500
            logger.exception("mcp_internal_error", error=str(exc))
            return _error(_id_of(message), _INTERNAL, "Internal error")

    async def _one(self, message: Any, session: str) -> dict[str, Any] | None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(_id_of(message), _INVALID_REQUEST, "Invalid Request")
        if "method" not in message:
            if "id" in message and ("result" in message or "error" in message):
                return None  # a response (we never ask anything): accepted, nothing to answer
            return _error(_id_of(message), _INVALID_REQUEST, "Invalid Request")
        method = message["method"]
        if not isinstance(method, str):
            return _error(_id_of(message), _INVALID_REQUEST, "Invalid Request: method must be a string")
        if "id" not in message:
            return None  # a notification (notifications/initialized, cancelled): nothing to answer
        msg_id = message["id"]
        if not _valid_id(msg_id):
            return _error(None, _INVALID_REQUEST, "Invalid Request: an MCP request id is a string or an integer, "
                                                  "never null")
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(msg_id, _INVALID_PARAMS, "Invalid params: params must be an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            return _result(msg_id, {
                "protocolVersion": asked if isinstance(asked, str) and asked in _SUPPORTED else PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "iva-notebook", "version": "1"},
                "instructions": "Per-chat notebook: notes the assistant keeps for itself in one chat.",
            })
        if method == "ping":
            return _result(msg_id, {})
        if method == "tools/list":
            return _result(msg_id, {"tools": await self._listed(session)})
        if method == "tools/call":
            return await self._call(msg_id, params, session)
        return _error(msg_id, _METHOD_NOT_FOUND, f"Method not found: {method}")

    async def _owner_chat(self, session: str) -> Chat | None:
        """The chat whose owner turn this session is running now, or None (N1: master_only, lead_only)."""
        if not session or not self.notebook.enabled:
            return None
        # Committed state, without queueing behind the writer's lock (eve gives tools/list 10 s;
        # on a slow disk the queue of transactions, an fsync each, can be seconds long).
        async with self.store.db.committed():
            chat = await self.store.chat_by_session(session)
        if chat is None or not chat.busy or chat.kind != "turn" or not chat.owner_turn or chat.reset_mark:
            return None
        return chat

    def _available(self, chat: Chat) -> list[str]:
        names = list(self.tools)
        if chat.notes_mode != INDEX:
            names.remove("chat_note_read")  # N2/N3: in inline mode the read tool does not exist at all
        return names

    async def _listed(self, session: str) -> list[dict[str, Any]]:
        chat = await self._owner_chat(session)
        return [] if chat is None else [self.tools[n] for n in self._available(chat)]

    async def _call(self, msg_id: Any, params: dict[str, Any], session: str) -> dict[str, Any]:
        name = params.get("name")
        raw = params.get("arguments")
        if not isinstance(name, str):
            return _error(msg_id, _INVALID_PARAMS, "Invalid params: name must be the tool's name")
        if raw is not None and not isinstance(raw, dict):
            return _error(msg_id, _INVALID_PARAMS, "Invalid params: arguments must be an object")
        args = dict(raw or {})
        provided = args.pop(_SESSION_ARG, None)
        if provided is not None and not isinstance(provided, str):
            return _error(msg_id, _INVALID_PARAMS, f"Invalid params: {_SESSION_ARG} is text")
        if provided and session and provided != session:
            logger.warning("mcp_session_mismatch", header=session, argument=provided)
            return _tool_error(msg_id, "This call does not belong to one conversation; refused.")
        session = provided or session
        chat = await self._owner_chat(session)
        if name not in self.tools or (chat is not None and name not in self._available(chat)):
            return _error(msg_id, _INVALID_PARAMS, f"Unknown tool: {name}")
        if chat is None:
            logger.info("mcp_call_refused", tool=name, session=session or None)
            what = "Reminders are" if name.startswith("chat_reminder_") else "The notebook is"
            return _tool_error(msg_id, f"{what} available only in the owner's own turns of a chat; "
                                       "nothing was written.")
        try:
            if name.startswith("chat_reminder_") and self.reminders is not None:
                try:
                    payload = await run_tool(self.reminders, chat, name, args)
                except PushError as exc:
                    logger.info("mcp_call_rejected", tool=name, field=exc.field, reason=str(exc))
                    return _tool_error(msg_id, f"{exc.field}: {exc}")
            else:
                payload = await self._run(chat, name, args)
        except NoteError as exc:
            logger.info("mcp_call_rejected", tool=name, reason=str(exc))
            return _tool_error(msg_id, str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            return _tool_error(msg_id, f"Bad arguments for {name}: {exc}")
        return _result(msg_id, {"content": [{"type": "text", "text": json.dumps(payload, ensure_ascii=False)}],
                                "structuredContent": payload, "isError": False,
                                "_meta": {"iva/uneventful": True}})

    async def _run(self, chat: Chat, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        nb, address = self.notebook, chat.address
        name = args.get("name")
        if not isinstance(name, str):
            raise NoteError("Give the note's name.")
        if tool == "chat_note_save":
            body, description, pinned = args.get("body"), args.get("description"), args.get("pinned")
            if not isinstance(body, str):
                raise NoteError("Give the note's body as text.")
            note, created = await nb.save(address, name, body,
                                          description=description if isinstance(description, str) else None,
                                          pinned=pinned if isinstance(pinned, bool) else None, guard=chat)
            return {"saved": note.name, "created": created, "chars": len(note.body), "pinned": note.pinned}
        if tool == "chat_note_read":
            found = await nb.note(address, name)
            if found is None:
                raise NoteError(f"There is no note named '{name}'.")
            nb.mark_read(chat, name)
            return {"name": found.name, "description": found.description, "body": found.body, "pinned": found.pinned}
        if tool == "chat_note_delete":
            if not await nb.delete(address, name, guard=chat):
                raise NoteError(f"There is no note named '{name}'.")
            return {"deleted": name}
        note = await nb.set_pinned(address, name, tool == "chat_note_pin", guard=chat)
        return {"name": note.name, "pinned": note.pinned}


def _result(msg_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def _http_error(status: int, code: int, message: str, **headers: str) -> web.Response:
    return web.json_response(_error(None, code, message), status=status, headers=headers or None)


def _valid_id(msg_id: Any) -> bool:
    return isinstance(msg_id, str) or (isinstance(msg_id, int) and not isinstance(msg_id, bool))


def _id_of(message: Any) -> Any:
    """The id to answer an invalid message with: its own when usable, else null."""
    msg_id = message.get("id") if isinstance(message, dict) else None
    return msg_id if _valid_id(msg_id) else None


def _tool_error(msg_id: Any, text: str) -> dict[str, Any]:
    return _result(msg_id, {"content": [{"type": "text", "text": text}], "isError": True,
                            "_meta": {"iva/uneventful": True}})
