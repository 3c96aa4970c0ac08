"""The notebook's tools, served to eve as an MCP server (Streamable HTTP, stateless, JSON
answers) on the bridge's local listener at ``/mcp`` (N3, N5).

eve calls the server with the session id in the ``x-eve-session-id`` header on every request
and as the provided argument ``eve_session_id`` on every tool call (PROTOCOL.md §11); that id
maps the call to its chat. The gate is the same for listing and for calling: no tools for a
session we do not know (a subagent, a rebuild's throwaway session) or outside an owner's turn,
and no ``chat_note_read`` in inline mode, so the model cannot even find it.

eve first tries ``server/discover`` (MCP 2026-07-28); we answer "method not found" and it falls
back to ``initialize`` (2025-11-25), which needs no session: every request stands alone.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .. import log
from ..store import Chat, Store
from .rules import INDEX, NoteError
from .service import Notebook

__all__ = ["PROTOCOL_VERSION", "TOOLS", "McpServer"]

logger = log.get("bridge.notebook.mcp")

PROTOCOL_VERSION = "2025-11-25"
_SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
_SESSION_ARG = "eve_session_id"

_NAME = {"type": "string", "description": "The note's name: a slug of a-z, 0-9, '_' and '-', at most 48."}
_SESSION = {"type": "string", "description": "Filled in by eve."}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str], *,
          read_only: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": {**properties, _SESSION_ARG: _SESSION},
                        "required": required, "additionalProperties": False},
        "annotations": {"readOnlyHint": read_only, "destructiveHint": name == "chat_note_delete",
                        "openWorldHint": False},
        "_meta": {"iva/quiet": True},
    }


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
          {"name": _NAME}, ["name"]),
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
    def __init__(self, notebook: Notebook, store: Store) -> None:
        self.notebook = notebook
        self.store = store

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/mcp", self.post)
        app.router.add_route("GET", "/mcp", self.no_stream)
        app.router.add_route("DELETE", "/mcp", self.no_stream)

    async def no_stream(self, request: web.Request) -> web.Response:
        # Stateless: no server-initiated stream, no session to end (Streamable HTTP allows 405).
        return web.Response(status=405, headers={"allow": "POST"})

    async def post(self, request: web.Request) -> web.StreamResponse:
        try:
            message = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response(_error(None, -32700, "Parse error"), status=400)
        session = request.headers.get("x-eve-session-id", "")
        if isinstance(message, list):  # a JSON-RPC batch (older clients)
            answers = [a for m in message if (a := await self._one(m, session)) is not None]
            return web.json_response(answers) if answers else web.Response(status=202)
        answer = await self._one(message, session)
        return web.json_response(answer) if answer is not None else web.Response(status=202)

    async def _one(self, message: Any, session: str) -> dict[str, Any] | None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or "method" not in message:
            return _error(message.get("id") if isinstance(message, dict) else None, -32600, "Invalid Request")
        method, msg_id, params = message["method"], message.get("id"), message.get("params") or {}
        if msg_id is None:
            return None  # a notification (notifications/initialized, cancelled): nothing to answer
        if method == "initialize":
            asked = params.get("protocolVersion")
            return _result(msg_id, {
                "protocolVersion": asked if asked in _SUPPORTED else PROTOCOL_VERSION,
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
        return _error(msg_id, -32601, f"Method not found: {method}")

    async def _owner_chat(self, session: str) -> Chat | None:
        """The chat whose owner turn this session is running now, or None (N1: master_only, lead_only)."""
        if not session or not self.notebook.enabled:
            return None
        chat = await self.store.chat_by_session(session)
        if chat is None or not chat.busy or chat.kind != "turn" or not chat.owner_turn or chat.reset_mark:
            return None
        return chat

    @staticmethod
    def _available(chat: Chat) -> list[str]:
        names = list(TOOLS)
        if chat.notes_mode != INDEX:
            names.remove("chat_note_read")  # N2/N3: in inline mode the read tool does not exist at all
        return names

    async def _listed(self, session: str) -> list[dict[str, Any]]:
        chat = await self._owner_chat(session)
        return [] if chat is None else [TOOLS[n] for n in self._available(chat)]

    async def _call(self, msg_id: Any, params: dict[str, Any], session: str) -> dict[str, Any]:
        name = params.get("name")
        args = dict(params.get("arguments") or {})
        provided = args.pop(_SESSION_ARG, None)
        if provided and session and provided != session:
            logger.warning("mcp_session_mismatch", header=session, argument=provided)
            return _tool_error(msg_id, "This call does not belong to one conversation; refused.")
        session = provided or session
        chat = await self._owner_chat(session)
        if not isinstance(name, str) or name not in TOOLS or (chat is not None and name not in self._available(chat)):
            return _error(msg_id, -32602, f"Unknown tool: {name}")
        if chat is None:
            logger.info("mcp_call_refused", tool=name, session=session or None)
            return _tool_error(msg_id, "The notebook is available only in the owner's own turns of a chat; "
                                       "nothing was written.")
        try:
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
            if not await nb.delete(address, name):
                raise NoteError(f"There is no note named '{name}'.")
            return {"deleted": name}
        note = await nb.set_pinned(address, name, tool == "chat_note_pin")
        return {"name": note.name, "pinned": note.pinned}


def _result(msg_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def _error(msg_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


def _tool_error(msg_id: Any, text: str) -> dict[str, Any]:
    return _result(msg_id, {"content": [{"type": "text", "text": text}], "isError": True,
                            "_meta": {"iva/uneventful": True}})
