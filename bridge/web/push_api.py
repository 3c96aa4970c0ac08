"""The owner API's routes of the assistant writing first (W1-W8), behind the owner API's own
checks (:meth:`bridge.web.owner_api.OwnerApi.guard`: no browser ``Origin``, ``Authorization:
Bearer $IVA_API_TOKEN``, JSON bodies, a chat Iva knows — else 404). Errors are JSON naming the
field at fault: ``{"error", "code", "field"}``.

    POST   /v1/chats/{chat}/turns              {"text", "key"?, "by"?} → 202 {"id", "state"}
    GET    /v1/chats/{chat}/turns/{id}         {"id", "state": queued|running|answered|failed, …times}
    POST   /v1/chats/{chat}/messages           {"text", "key"?} → 202 {"id"}
    GET    /v1/chats/{chat}/reminders          {"reminders": [{"id", "text", "at"|"cron", "tz", "next_at", …}]}
    POST   /v1/chats/{chat}/reminders          {"text", "at"? | "cron"?, "tz"?} → 201 {"id", "next_at"}
    DELETE /v1/chats/{chat}/reminders/{id}
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..push.reminders import Reminders
from ..push.turns import PushError, Pushes

__all__ = ["PushApi"]

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]
Guard = Callable[[Handler], Callable[[web.Request], Awaitable[web.StreamResponse]]]


def _fail(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message, "code": code}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


class _BadBody(Exception):
    pass


class PushApi:
    def __init__(self, guard: Guard, pushes: Pushes, reminders: Reminders) -> None:
        self.guard = guard
        self.pushes = pushes
        self.reminders = reminders

    def routes(self, app: web.Application) -> None:
        r, g = app.router, self._wrapped
        r.add_post("/v1/chats/{chat}/turns", g(self.push_turn))
        r.add_get("/v1/chats/{chat}/turns/{id}", g(self.turn))
        r.add_post("/v1/chats/{chat}/messages", g(self.notify))
        r.add_get("/v1/chats/{chat}/reminders", g(self.list_reminders))
        r.add_post("/v1/chats/{chat}/reminders", g(self.set_reminder))
        r.add_delete("/v1/chats/{chat}/reminders/{id}", g(self.cancel_reminder))

    def _wrapped(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def safe(request: web.Request, address: str) -> web.StreamResponse:
            try:
                return await handler(request, address)
            except PushError as exc:
                return _fail(exc.status, exc.code, str(exc), exc.field)
            except _BadBody as exc:
                return _fail(400, "bad_json", str(exc), "body")
        return self.guard(safe)

    @staticmethod
    async def _body(request: web.Request, fields: tuple[str, ...]) -> dict[str, Any]:
        """The JSON object sent; a field this route does not take is named."""
        if not request.can_read_body:
            raise _BadBody("Send a JSON object as the body.")
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _BadBody(f"The body is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise _BadBody("The body must be a JSON object.")
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise PushError(unknown[0], f"Unknown field {unknown[0]!r}: this route takes {', '.join(fields)}.")
        return data

    async def push_turn(self, request: web.Request, address: str) -> web.Response:
        data = await self._body(request, ("text", "key", "by"))
        state = await self.pushes.push_turn(address, data.get("text"), key=data.get("key"), by=data.get("by"))
        return web.json_response(state.as_record(), status=202)

    async def turn(self, request: web.Request, address: str) -> web.Response:
        state = await self.pushes.turn(address, request.match_info["id"])
        if state is None:
            return _fail(404, "no_turn", f"This chat has no pushed turn {request.match_info['id']!r} "
                                         "(or it finished before the retention window).", "id")
        return web.json_response(state.as_record())

    async def notify(self, request: web.Request, address: str) -> web.Response:
        data = await self._body(request, ("text", "key"))
        message_id, _ = await self.pushes.notify(address, data.get("text"), key=data.get("key"))
        return web.json_response({"id": message_id}, status=202)

    async def list_reminders(self, request: web.Request, address: str) -> web.Response:
        return web.json_response({"reminders": [r.as_record() for r in await self.reminders.active(address)]})

    async def set_reminder(self, request: web.Request, address: str) -> web.Response:
        data = await self._body(request, ("text", "at", "cron", "tz"))
        made = await self.reminders.set(address, data.get("text"), at=data.get("at"), cron=data.get("cron"),
                                        tz=data.get("tz"), author="owner")
        return web.json_response({"id": made.id, "next_at": made.as_record()["next_at"]}, status=201)

    async def cancel_reminder(self, request: web.Request, address: str) -> web.Response:
        reminder_id = request.match_info["id"]
        if not await self.reminders.cancel(address, reminder_id):
            return _fail(404, "no_reminder", f"This chat has no active reminder {reminder_id!r}.", "id")
        return web.json_response({"cancelled": reminder_id})
