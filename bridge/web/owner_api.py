"""The owner HTTP API (N9) on ``IVA_API_LISTEN``, behind ``Authorization: Bearer $IVA_API_TOKEN``.
A request with a browser ``Origin`` is refused (403), and so is a body that is not
``application/json`` (415) (S1, :mod:`bridge.web.guards`).

``{chat}`` is the Telegram chat id, or ``<chat id>:<topic id>`` for a forum topic. Errors are
JSON: ``{"error": "<what is wrong and what to do>", "code": "<short code>"}``. A storage fault (the
database locked past its timeout, a full disk, an I/O error) is ``503`` with ``Retry-After`` and
``{"code": "storage_unavailable", "retry_after"}`` (F14): every write of this API and of
:mod:`bridge.web.push_api` commits as its last storage step, so a 503 means nothing was written and
the same request may be sent again.

    GET    /v1/chats/{chat}/notes               the notebook: bodies, prev_body, what is new (ETag)
    PUT    /v1/chats/{chat}/notes/{name}        {"body", "description"?, "pinned"?}: the owner writes
    DELETE /v1/chats/{chat}/notes/{name}
    POST   /v1/chats/{chat}/notes/restore       the archived notebook back (the current one is archived)
    POST   /v1/chats/{chat}/notes/seen          the server-side seen mark ({"viewer"?})
    GET    /v1/chats/{chat}/spend               model usage by label (turns, notes)
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from diskqueue import DatabaseError

from .. import log
from ..notebook.rules import NoteError, totals
from ..notebook.service import DEFAULT_VIEWER, Notebook
from ..storage.address import Address
from ..storage.store import Store
from .guards import bearer_matches, browser_origin, not_json

__all__ = ["OwnerApi"]

logger = log.get(__name__)

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]  # (request, the chat's address)
Guarded = Callable[[web.Request], Awaitable[web.StreamResponse]]

RETRY_AFTER = 5  # seconds a client is asked to wait after a storage fault (F14)


def _versioned(request: web.Request, data: dict[str, Any]) -> web.Response:
    """A JSON answer with an ``ETag`` of its content; ``If-None-Match`` naming it → 304, so a
    client re-reads the notebook only after a change (seed 000: the client re-reads after a turn)."""
    body = json.dumps(data, ensure_ascii=False, sort_keys=True).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    wanted = {tag.strip().removeprefix("W/") for tag in request.headers.get("If-None-Match", "").split(",")}
    if etag in wanted or "*" in wanted:
        return web.Response(status=304, headers={"ETag": etag})
    return web.Response(body=body, content_type="application/json", headers={"ETag": etag})


def _fail(status: int, code: str, message: str, *, field: str | None = None, **headers: str) -> web.Response:
    body = {"error": message, "code": code} if field is None else {"error": message, "code": code, "field": field}
    return web.json_response(body, status=status, headers=headers or None)


def _unavailable(request: web.Request, exc: Exception) -> web.Response:
    """F14: a storage fault is JSON 503 with a retry hint, never aiohttp's text 500 and traceback.
    Nothing was written (each write commits last): the same request may be sent again."""
    logger.warning("api_storage_unavailable", path=request.path, method=request.method, error=str(exc)[:300])
    body = {"error": f"Iva's storage failed ({exc}); nothing was written. Send the same request again in "
                     f"{RETRY_AFTER} s.", "code": "storage_unavailable", "retry_after": RETRY_AFTER}
    return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER)})


class OwnerApi:
    def __init__(self, token: str | None, notebook: Notebook, store: Store) -> None:
        self.token = token
        self.notebook = notebook
        self.store = store

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/chats/{chat}/notes", self._guard(self.list_notes))
        r.add_post("/v1/chats/{chat}/notes/restore", self._guard(self.restore))
        r.add_post("/v1/chats/{chat}/notes/seen", self._guard(self.seen))
        r.add_put("/v1/chats/{chat}/notes/{name}", self._guard(self.put_note))
        r.add_delete("/v1/chats/{chat}/notes/{name}", self._guard(self.delete_note))
        r.add_get("/v1/chats/{chat}/spend", self._guard(self.spend, notes=False))

    def guard(self, handler: Handler) -> Guarded:
        """``handler`` behind this API's checks (origin, token, JSON, a chat Iva knows), for the
        routes of other modules (bridge/push); the notebook need not be on."""
        return self._guard(handler, notes=False)

    def _guard(self, handler: Handler, *, notes: bool = True) -> Guarded:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if (origin := browser_origin(request)) is not None:
                logger.warning("api_origin_refused", origin=origin, path=request.path)
                return _fail(403, "origin_refused", "Browser requests are refused: the owner API takes no Origin.")
            if not self.token:
                return _fail(403, "api_off", "The owner API is off: set IVA_API_TOKEN to turn it on.")
            if not bearer_matches(request, self.token):
                return _fail(401, "unauthorized", "Send Authorization: Bearer <IVA_API_TOKEN>.",
                             **{"www-authenticate": 'Bearer realm="iva"'})
            if (kind := not_json(request)) is not None:
                return _fail(415, "not_json", f"Send the body as application/json, not {kind}.")
            if notes and not self.notebook.enabled:
                return _fail(404, "notes_off", "The notebook is off (IVA_NOTES_ENABLED=0).")
            try:
                address = str(self._address(request.match_info["chat"]))
            except ValueError:
                return _fail(400, "bad_chat", "A chat is its Telegram id, or <chat id>:<topic id> for a topic.",
                             field="chat")
            try:
                if await self.store.chat(address) is None:
                    return _fail(404, "no_chat", f"Iva has no chat {request.match_info['chat']}.", field="chat")
                return await handler(request, address)
            except NoteError as exc:
                return _fail(422, "rejected", str(exc))
            except (sqlite3.Error, DatabaseError) as exc:
                return _unavailable(request, exc)
        return guarded

    @staticmethod
    def _address(raw: str) -> Address:
        chat, _, topic = raw.partition(":")
        return Address(int(chat), int(topic) if topic else None)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise web.HTTPBadRequest(text=json.dumps({"error": f"The body is not JSON: {exc}", "code": "bad_json"}),
                                     content_type="application/json") from exc
        if not isinstance(data, dict):
            raise web.HTTPBadRequest(text=json.dumps({"error": "The body must be a JSON object.", "code": "bad_json"}),
                                     content_type="application/json")
        return data

    async def list_notes(self, request: web.Request, address: str) -> web.Response:
        viewer = request.query.get("viewer", DEFAULT_VIEWER)
        notes = await self.notebook.notes(address)
        seen = await self.notebook.seen_at(address, viewer)
        chat = await self.store.chat(address)
        chars, count = totals(notes)
        archived = await self.notebook.archive(address)
        return _versioned(request, {
            "chat": request.match_info["chat"],
            "mode": chat.notes_mode if chat else "inline",
            "chars": chars,
            "count": count,
            "seen_at": seen,
            "archive": None if archived is None else {"notes": len(archived[0]), "archived_at": archived[1],
                                                      "reason": archived[2]},
            "notes": [{**n.as_record(), "new": seen is None or n.updated_at > seen} for n in notes],
            "last_turn": [{"name": name, "change": change} for name, change in await self.notebook.last_turn(address)],
        })

    async def put_note(self, request: web.Request, address: str) -> web.Response:
        data = await self._body(request)
        body, description, pinned = data.get("body"), data.get("description"), data.get("pinned")
        if not isinstance(body, str):
            return _fail(400, "bad_note", 'Send {"body": "<text>", "description": "<one line>", "pinned": false}.')
        if ((description is not None and not isinstance(description, str))
                or (pinned is not None and not isinstance(pinned, bool))):
            return _fail(400, "bad_note", "description is text and pinned is true or false.")
        note, created = await self.notebook.save(address, request.match_info["name"], body,
                                                 description=description, pinned=pinned, author="owner")
        return web.json_response(note.as_record(), status=201 if created else 200)

    async def delete_note(self, request: web.Request, address: str) -> web.Response:
        name = request.match_info["name"]
        if not await self.notebook.delete(address, name):
            return _fail(404, "no_note", f"There is no note named {name!r}.")
        return web.json_response({"deleted": name})

    async def restore(self, request: web.Request, address: str) -> web.Response:
        restored = await self.notebook.restore(address)
        if restored is None:
            return _fail(404, "no_archive", "There is no archived notebook for this chat yet.")
        return web.json_response({"restored": restored})

    async def seen(self, request: web.Request, address: str) -> web.Response:
        data = await self._body(request)
        viewer = data.get("viewer", DEFAULT_VIEWER)
        if not isinstance(viewer, str) or not viewer:
            return _fail(400, "bad_viewer", "viewer is a non-empty name.")
        return web.json_response({"seen_at": await self.notebook.mark_seen(address, viewer)})

    async def spend(self, request: web.Request, address: str) -> web.Response:
        return web.json_response({"chat": request.match_info["chat"],
                                  "spend": await self.store.spend(address)})
