"""A fake eve server following PROTOCOL.md (eve 0.80.1 as observed), with fault controls.

Messages understand the fake LLM's markers, so one scenario runs against this fake and the
real eve alike: ``[[tokens=N]]``, ``[[delay=S]]`` (before each step's output),
``[[chunkdelay=S]]`` (the reply word by word, S apart; a cancel cuts it off), ``[[fail=CODE]]``,
``[[reply=TEXT]]``, ``[[tool=noop]]``. Faults a test can set on :class:`FakeEve`:

- ``not_ready_sends``: the next N sends answer 409 ``session_not_ready``;
- ``cut_streams``: the next N stream responses are cut after ``cut_after`` lines (mid-line);
- ``garbage_every``: a malformed line is written before every Nth event of a stream;
- ``stuck``: sessions accept messages and never run them (eve restarted mid-turn, §9);
- ``server_errors``: the next N requests of any route answer 500;
- ``tamper``: fields laid over the next event of a type (an event a handler cannot take, F6);
- ``failing_texts``: a send whose text holds one of these answers 500 and is never taken (F6);
- ``compact_ack_delay`` / ``summary_delay`` / ``summary_fail`` / ``compact_errors``: compaction
  behaviour (§5);
- ``stream_lag``: a followed stream writes each batch that many seconds late (a page read is
  not late): eve has written an event the bridge's open stream has not brought yet.

Like real eve with an MCP connection (§11), ``[[mcp=TOOL {json}]]`` makes the "model" call a tool
of the MCP server at ``mcp_url``: a fresh ``tools/list`` with the session header, then
``tools/call`` with ``eve_session_id`` provided; a tool not listed is never called (the model
gets eve's "no tool named" error). Results land in ``mcp_results``. ``reply_for(text)`` may
script the reply to a message (the notebook rebuild's throwaway session). ``clientContext``
counts in the estimated input tokens, as on eve (§12).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError

_MARKER = re.compile(r"\[\[(\w+)(?:=([^\]]*))?\]\]")
_MCP = re.compile(r"\[\[mcp=(\w+) (\{[^\]]*\})\]\]")


def _markers(text: str) -> tuple[str, dict[str, str]]:
    found = {m.group(1): (m.group(2) or "") for m in _MARKER.finditer(text)}
    return re.sub(r"\s+", " ", _MARKER.sub("", text)).strip(), found  # as fake_llm.strip_markers


def _flatten(message: Any) -> str:
    """Like eve's message.received data.message: text parts, then one line per file."""
    if isinstance(message, str):
        return message
    lines = [p.get("text", "") for p in message if p.get("type") == "text"]
    lines += [f"[file: {p.get('filename') or 'file'} ({p.get('mediaType')})]" for p in message if p.get("type") == "file"]
    return "\n".join(line for line in lines if line)


def _parts(message: Any) -> list[dict[str, Any]]:
    """Like eve's message.received data.parts: file metadata, never the bytes."""
    import base64

    if isinstance(message, str):
        return [{"text": message, "type": "text"}]
    out = []
    for p in message:
        if p.get("type") == "file":
            data = str(p.get("data", ""))
            size = len(base64.b64decode(data.split(",", 1)[1])) if "," in data else 0
            out.append({"mediaType": p.get("mediaType"), "type": "file", "filename": p.get("filename"), "size": size})
        else:
            out.append({"text": p.get("text", ""), "type": "text"})
    return out


@dataclass
class _Input:
    kind: str  # message | compact | clear
    text: str = ""
    delivery: str = ""
    policy: str = "steer"
    context_chars: int = 0


@dataclass
class FakeSession:
    id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    inputs: asyncio.Queue[_Input] = field(default_factory=asyncio.Queue)
    active: bool = True
    sequence: int = 0
    running: bool = False
    output_started: bool = False
    steer: asyncio.Queue[_Input] = field(default_factory=asyncio.Queue)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    usage_in: int = 0
    usage_out: int = 0
    history_chars: int = 0
    started: bool = False
    task: asyncio.Task[None] | None = None
    turns_run: int = 0
    compactions_done: int = 0
    parts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    compacting: bool = False  # between compaction.requested and the compaction's end
    asking: bool = False  # a question is open (input.requested … turn.waiting on input)
    answers: asyncio.Queue[tuple[str, Any, str]] = field(default_factory=asyncio.Queue)
    sends: list[dict[str, Any]] = field(default_factory=list)


class FakeEve:
    def __init__(self, *, token: str = "eve-test-token", window: int = 128_000) -> None:
        self.token = token
        self.window = window
        self.sessions: dict[str, FakeSession] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.not_ready_sends = 0
        self.cut_streams = 0
        self.cut_after = 3
        self.garbage_every = 0
        self.stuck = False
        self.server_errors = 0
        self.compact_ack_delay = 0.0
        self.compact_errors = 0  # the next N compact requests answer 500
        self.ambiguous_sends = 0  # the next N sends are taken and run, but answered 502
        self.failing_texts: set[str] = set()  # a send whose text holds one of these: 500, never taken (F6)
        self.failed_sends = 0
        self.cancel_errors = 0  # the next N cancels answer 500 (and cancel nothing)
        self.cancel_ignored_while_asking = False
        self.waiting_after_compaction = 0.0  # seconds between compaction.completed and session.waiting  # an eve whose cancel cannot end a turn waiting on input
        self.tamper: dict[str, dict[str, Any]] = {}  # event type → fields laid over its next emission (F6)
        self.unhealthy = False  # /eve/v1/health answers 503 (eve down behind a proxy)
        self.summary_delay = 0.0
        self.summary_fail = False
        self.step_delay = 0.0
        self.ask_as_action = False  # review: a question shows as the model's tool call first
        self.send_at: dict[str, float] = {}  # message text → monotonic time its send arrived (benchmarks)
        self.completed_at: dict[str, float] = {}  # reply text → monotonic time message.completed was emitted
        self.first_delta_at: dict[str, float] = {}  # reply text → monotonic time its first message.appended was emitted
        self.hold_sends = False  # sends wait for release_sends; a caller gone by then is dropped
        self.release_sends = asyncio.Event()
        self.held = 0
        self.sends_while_running = 0  # queue-policy sends that reached a running turn
        self.sends_while_compacting = 0  # sends that reached a session while it compacted (seed 004 rejects it)
        self.stream_lag = 0.0
        self.mcp_url: str | None = None
        self.mcp_token: str | None = None  # sent as "authorization: Bearer" (NOTEBOOK_MCP_TOKEN); daemons get it
        self.mcp_connection = "notebook"
        self.mcp_results: list[dict[str, Any]] = []
        self.reply_for: Any = None  # text -> reply text or None
        self.creates: list[tuple[float, str]] = []  # (monotonic time, message) of sessions created with one
        self._in_flight = 0  # requests being answered, streams aside (they stay open by design)
        self._held: list[web.Request] = []  # sends waiting on release_sends
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(middlewares=[self._track])
        r = app.router
        r.add_get("/eve/v1/health", self._health)
        r.add_get("/eve/v1/info", self._info)
        r.add_post("/eve/v1/session", self._create)
        r.add_post("/eve/v1/session/{id}", self._send)
        r.add_get("/eve/v1/session/{id}/stream", self._stream)
        for action in ("cancel", "compact", "clear", "reset"):
            r.add_post(f"/eve/v1/session/{{id}}/{action}", getattr(self, f"_{action}"))
        # What is still being answered when a test ends is a stream or a held send: nothing to wait for, so
        # the stop cancels it at once (aiohttp waits shutdown_timeout for a handler first; 0 is "forever").
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.01)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for session in self.sessions.values():
            if session.task:
                session.task.cancel()
        if self.runner is not None:
            await self.runner.cleanup()

    # -- helpers for tests ------------------------------------------------------------------

    def quiet(self) -> bool:
        """Nothing in flight: no request being answered (streams aside), no session running a turn
        or a compaction, no input queued for one."""
        return self._in_flight == 0 and all(
            not s.running and s.inputs.empty() and s.steer.empty() for s in self.sessions.values()
        )

    def held_callers_gone(self) -> int:
        """How many held sends (``hold_sends``) lost their caller: eve will drop them on release."""
        return sum(1 for r in self._held if r.transport is None or r.transport.is_closing())

    def sends(self) -> list[dict[str, Any]]:
        return [b for m, p, b in self.requests if m == "POST" and p.count("/") == 4 and b is not None]

    def routes(self, name: str) -> list[str]:
        return [p for m, p, _ in self.requests if p.endswith("/" + name)]

    # -- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/stream"):
            return await handler(request)
        self._in_flight += 1
        try:
            return await handler(request)
        finally:
            self._in_flight -= 1

    def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return web.json_response(
                {"code": "unauthorized", "error": "Authorization is required for this route.", "ok": False},
                status=401, headers={"www-authenticate": "Bearer"},
            )
        if self.server_errors > 0:
            self.server_errors -= 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        return None

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        body = json.loads(raw) if raw.strip() else None
        self.requests.append((request.method, request.path, body))
        return body

    def _session(self, request: web.Request) -> FakeSession | None:
        return self.sessions.get(request.match_info["id"])

    async def _tool_step(self, s: FakeSession, call: str, tool: str, step: int, tokens: int,
                         turn: dict[str, Any], deliveries: list[str]) -> None:
        """One model call that ends in a tool call: the call requested, its result, the step's usage."""
        await self._emit(s, "actions.requested", {"actions": [{"callId": call, "input": {}, "kind": "tool-call",
                                                               "toolName": tool}], "stepIndex": step, **turn},
                         deliveries)
        await self._emit(s, "action.result", {"result": {"callId": call, "kind": "tool-result", "output": {"ok": True},
                                                         "toolName": tool}, "status": "completed", "stepIndex": step,
                                              **turn}, deliveries)
        await self._emit(s, "step.completed", {"finishReason": "tool-calls", "stepIndex": step, **turn,
                                               "usage": {"inputTokens": tokens, "outputTokens": 5, "cacheReadTokens": 0}},
                         deliveries)
        s.usage_in += tokens

    async def _emit(self, session: FakeSession, type_: str, data: dict[str, Any], deliveries: list[str]) -> None:
        if type_ in self.tamper:
            data = {**data, **self.tamper.pop(type_)}
        event = {"type": type_, "data": data,
                 "meta": {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ"), "id": f"evt_{next(self._ids):08d}",
                          "deliveryIds": list(deliveries)}}
        if type_ == "message.completed":
            self.completed_at.setdefault(data.get("message", ""), time.monotonic())
        async with self._changed:
            session.events.append(event)
            self._changed.notify_all()

    # -- routes -----------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        if self.unhealthy:
            return web.json_response({"ok": False, "status": "unavailable"}, status=503)
        return web.json_response({"ok": True, "status": "ready", "workflowId": "workflow//eve//workflowEntry"})

    async def _info(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        connections = [{"connectionName": self.mcp_connection, "protocol": "mcp", "url": self.mcp_url,
                        "hasHeaders": False}] if self.mcp_url else []
        return web.json_response({"agent": {"model": {"id": "fake/fake-model", "contextWindowTokens": self.window}},
                                  "connections": connections, "version": 5})

    async def _create(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        body = await self._body(request)
        session = FakeSession(id=f"wrun_{uuid.uuid4().hex[:20].upper()}")
        self.sessions[session.id] = session
        session.task = asyncio.create_task(self._run(session))
        if body and "message" in body:
            self.creates.append((time.monotonic(), _flatten(body["message"])))
            delivery = str(uuid.uuid4())
            session.inputs.put_nowait(_Input("message", body["message"], delivery))
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202,
                                 headers={"x-eve-session-id": session.id})

    async def _send(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        arrived = time.monotonic()
        body = await self._body(request) or {}
        if isinstance(body.get("message"), str):
            self.send_at.setdefault(body["message"], arrived)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"code": "session_not_active", "error": "The session is no longer active.",
                                      "ok": False}, status=409)
        if self.not_ready_sends > 0:
            self.not_ready_sends -= 1
            return web.json_response({"code": "session_not_ready",
                                      "error": "The session is not ready to accept messages yet.", "ok": False},
                                     status=409)
        if any(bad in _flatten(body.get("message", "")) for bad in self.failing_texts):
            self.failed_sends += 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        if "inputResponses" in body and "message" not in body:
            delivery = str(uuid.uuid4())
            session.answers.put_nowait(("response", body["inputResponses"], delivery))
            return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted",
                                      "deliveryId": delivery}, status=202)
        if session.asking and not self.stuck:
            delivery = str(uuid.uuid4())
            session.answers.put_nowait(("message", body.get("message", ""), delivery))
            return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted",
                                      "deliveryId": delivery}, status=202)
        policy = body.get("turnPolicy", "steer")
        if policy not in ("queue", "steer"):
            return web.json_response({"error": "Expected 'turnPolicy' to be either 'queue' or 'steer'.", "ok": False},
                                     status=400)
        if self.hold_sends:
            self.held += 1
            self._held.append(request)
            try:
                await self.release_sends.wait()
            finally:
                self._held.remove(request)
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # the caller died waiting: eve never took it
        delivery = str(uuid.uuid4())
        session.sends.append(body)
        if session.running and policy == "queue":
            self.sends_while_running += 1
        if session.compacting:
            self.sends_while_compacting += 1
        item = _Input("message", _flatten(body.get("message", "")), delivery, policy)
        context = body.get("clientContext")
        item.context_chars = sum(len(c) + 16 for c in ([context] if isinstance(context, str) else context or []))
        session.parts[delivery] = _parts(body.get("message", ""))
        if self.stuck:
            pass  # accepted, never run (PROTOCOL.md §9)
        elif session.running and policy == "steer" and not session.output_started:
            session.steer.put_nowait(item)
        else:
            session.inputs.put_nowait(item)
        if self.ambiguous_sends:
            # Accepted and running, but the answer is lost to a proxy's 502 (an ambiguous send).
            self.ambiguous_sends -= 1
            return web.Response(status=502, text="Bad Gateway")
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted",
                                  "deliveryId": delivery}, status=202)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        session = self._session(request)
        if session is None:
            return web.json_response({"error": "Session not found.", "ok": False}, status=404)
        if not session.active:
            # Observed on eve 0.80.1: a stream opened after the reset answers 410 (a stream that
            # was open during the reset got session.completed and closed).
            return web.json_response({"code": "session_expired", "error": "Session history is no longer available.",
                                      "ok": False}, status=410)
        start = int(request.query.get("startIndex", "0"))
        follow = request.query.get("follow") != "false"
        if start < 0:
            start = max(0, len(session.events) + start)
        headers = {"content-type": "application/x-ndjson; charset=utf-8", "x-eve-stream-format": "ndjson",
                   "x-eve-session-id": session.id}
        if not follow or request.query.get("includeTailIndex") == "1":
            headers["x-eve-stream-tail-index"] = str(len(session.events) - 1)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        try:
            return await self._write_stream(request, response, session, start, follow)
        except (ConnectionResetError, ClientConnectionResetError):
            return response  # the reader went away (a consumer ends its busy period)

    async def _write_stream(self, request: web.Request, response: web.StreamResponse, session: FakeSession,
                            start: int, follow: bool) -> web.StreamResponse:
        cut = None
        if self.cut_streams > 0:
            self.cut_streams -= 1
            cut = self.cut_after
        index, written = start, 0
        tail_at_open = len(session.events)
        while True:
            async with self._changed:
                while index >= len(session.events):
                    if not follow and index >= tail_at_open:
                        break
                    if not session.active and index >= len(session.events):
                        break
                    await self._changed.wait()
                batch = session.events[index:] if follow else session.events[index:tail_at_open]
            if not batch:
                break
            if follow and self.stream_lag:
                await asyncio.sleep(self.stream_lag)
            for event in batch:
                line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
                if cut is not None and written >= cut:
                    await response.write(line[: len(line) // 2])
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if self.garbage_every and (index + 1) % self.garbage_every == 0:
                    await response.write(b"{this is not json\n")
                await response.write(line)
                written += 1
                index += 1
                if event["type"] == "session.completed":
                    await response.write_eof()
                    return response
            if not follow and index >= tail_at_open:
                break
        await response.write_eof()
        return response

    async def _cancel(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        await self._body(request)
        session = self._session(request)
        if self.cancel_errors:
            self.cancel_errors -= 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_turn"})
        session.cancel.set()
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202)

    async def _compact(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        await self._body(request)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_session"})
        if self.compact_errors:
            self.compact_errors -= 1
            return web.json_response({"ok": False, "code": "internal_error", "message": "boom"}, status=500)
        if self.compact_ack_delay:
            await asyncio.sleep(self.compact_ack_delay)
        if not self.stuck:
            session.inputs.put_nowait(_Input("compact"))
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202)

    async def _clear(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        await self._body(request)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_session"})
        session.inputs.put_nowait(_Input("clear"))
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202)

    async def _reset(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        await self._body(request)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_session"})
        if self.stuck:
            await asyncio.sleep(30)
            return web.json_response({"error": "Failed to reset the session.", "ok": False}, status=500)
        if session.running:
            session.cancel.set()
            for _ in range(200):
                if not session.running:
                    break
                await asyncio.sleep(0.01)
        session.active = False
        if session.task:
            session.task.cancel()
        await self._emit(session, "session.completed", {"usage": self._usage(session)}, [])
        return web.json_response({"ok": True, "previousSessionId": session.id, "status": "reset"})

    # -- the agent --------------------------------------------------------------------------

    def _usage(self, s: FakeSession) -> dict[str, int]:
        return {"cacheReadTokens": 0, "cacheWriteTokens": 0, "inputTokens": s.usage_in, "outputTokens": s.usage_out}

    async def _waiting(self, s: FakeSession, deliveries: list[str]) -> None:
        await self._emit(s, "session.waiting", {"continuationToken": s.id, "usage": self._usage(s),
                                                "wait": "next-user-message"}, deliveries)

    async def _run(self, s: FakeSession) -> None:
        while True:
            item = await s.inputs.get()
            if item.kind == "message":
                await self._turn(s, item)
            elif item.kind == "compact":
                await self._compaction(s)
            elif item.kind == "clear":
                turn = {"sequence": s.sequence, "sessionId": s.id, "turnId": f"turn_{s.sequence}"}
                s.history_chars = 0
                await self._emit(s, "context.cleared", turn, [])
                await self._waiting(s, [])

    async def _sleep_or(self, s: FakeSession, seconds: float) -> str:
        """Sleep, unless a steer or a cancel comes first."""
        steer = asyncio.ensure_future(s.steer.get())
        cancel = asyncio.ensure_future(s.cancel.wait())
        done, pending = await asyncio.wait({steer, cancel}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if cancel in done:
            if steer in done:
                s.steer.put_nowait(steer.result())
            return "cancel"
        if steer in done:
            s.steer.put_nowait(steer.result())
            return "steer"
        return "timeout"

    async def _turn(self, s: FakeSession, item: _Input) -> None:
        s.running, s.output_started = True, False
        s.cancel.clear()
        deliveries = [item.delivery]
        seq = s.sequence
        turn = {"sequence": seq, "turnId": f"turn_{seq}"}
        if not s.started:
            s.started = True
            await self._emit(s, "session.started", {"runtime": {"agentId": "fake", "agentName": "fake",
                                                                "eveVersion": "0.80.1"}}, deliveries)
        await self._emit(s, "turn.started", turn, deliveries)
        texts = [item.text]
        await self._emit(s, "message.received", {"message": item.text,
                                                 "parts": s.parts.get(item.delivery) or [{"text": item.text, "type": "text"}],
                                                 **turn}, deliveries)
        step = 0
        try:
            while True:
                await self._emit(s, "step.started", {"modelId": "fake/fake-model", "stepIndex": step, **turn}, deliveries)
                clean, marks = _markers(texts[-1])
                delay = float(marks.get("delay") or 0) + self.step_delay
                outcome = await self._sleep_or(s, delay) if delay else "timeout"
                if outcome == "timeout" and not s.steer.empty():
                    outcome = "steer"
                if outcome == "cancel":
                    await self._emit(s, "turn.cancelled", turn, deliveries)
                    return
                if outcome == "steer":
                    steer = s.steer.get_nowait()
                    deliveries.append(steer.delivery)
                    texts.append(steer.text)
                    await self._emit(s, "step.completed", {"finishReason": "other", "stepIndex": step, **turn}, deliveries)
                    await self._emit(s, "message.received", {"message": steer.text,
                                                             "parts": [{"text": steer.text, "type": "text"}], **turn},
                                     deliveries)
                    step += 1
                    continue
                if "ask" in marks and step == 0:
                    prompt, *options = marks["ask"].split("|")
                    request_id = f"req_{seq}"
                    if self.ask_as_action:
                        await self._emit(s, "actions.requested", {"actions": [{
                            "callId": f"call_{seq}", "input": {}, "kind": "tool-call", "toolName": "ask_question"}],
                            "stepIndex": step, **turn}, deliveries)
                    await self._emit(s, "input.requested", {"requests": [{
                        "requestId": request_id, "kind": "question", "prompt": prompt, "allowFreeform": True,
                        "options": [{"id": o, "label": o.title()} for o in options],
                        "action": {"callId": f"call_{seq}", "input": {}, "kind": "tool-call", "toolName": "ask_question"},
                    }], **turn}, deliveries)
                    await self._emit(s, "turn.waiting", {"on": "input", **turn}, deliveries)
                    s.asking = True
                    try:
                        answer = asyncio.ensure_future(s.answers.get())
                        waits = {answer} if self.cancel_ignored_while_asking else {answer, asyncio.ensure_future(s.cancel.wait())}
                        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                        for task in pending:
                            task.cancel()
                        if answer not in done:  # cancelled while waiting on the person
                            await self._emit(s, "turn.cancelled", turn, deliveries)
                            return
                        how, value, delivery = answer.result()
                    finally:
                        s.asking = False
                    deliveries.append(delivery)
                    if how == "message":
                        text = _flatten(value)
                        await self._emit(s, "message.received", {"message": text, "parts": _parts(value), **turn},
                                         deliveries)
                        response = {"text": text}
                    else:
                        response = {k: v for k, v in value[0].items() if k != "requestId"}
                    await self._emit(s, "input.resolved", {"resolutions": [{
                        "requestId": request_id, "kind": "question", "outcome": "answered", "response": response}],
                        **turn}, deliveries)
                    step += 1
                    await self._emit(s, "step.started", {"modelId": "fake/fake-model", "stepIndex": step, **turn},
                                     deliveries)
                    answer = response.get("optionId") or response.get("text")
                    texts[-1] = f"[[reply=answered: {answer}]]"
                    clean, marks = _markers(texts[-1])
                if "fail" in marks:
                    await self._emit(s, "step.failed", {"code": "MODEL_CALL_FAILED", "stepIndex": step, **turn}, deliveries)
                    await self._emit(s, "turn.failed", {"code": "MODEL_CALL_FAILED",
                                                        "details": {"message": "AI_RetryError: Failed after 3 attempts"},
                                                        **turn}, deliveries)
                    return
                tokens = (int(marks["tokens"]) if marks.get("tokens")
                          else math.ceil((s.history_chars + 400 + item.context_chars) / 4))
                if step == 0 and self.mcp_url and _MCP.search(texts[-1]):
                    for tool, raw_args in _MCP.findall(texts[-1]):
                        await self._mcp_step(s, tool, json.loads(raw_args), step, turn, deliveries, tokens)
                        step += 1
                    texts[-1] = _MCP.sub("", texts[-1])
                    clean, marks = _markers(texts[-1])
                values = [int(v) for v in marks.get("steps", "").split(",") if v.strip()]
                if values:
                    # Like fake_llm's [[steps=A,B,C]]: a tool-using turn whose inputs grow, one
                    # model call per value, a noop tool call in each but the last.
                    tokens = values[min(step, len(values) - 1)]
                if values and step < len(values) - 1:
                    await self._tool_step(s, f"call_fake_{seq}_{step}", "noop", step, tokens, turn, deliveries)
                    step += 1
                    continue
                if "tool" in marks and step == 0:
                    call = f"call_fake_{seq}_{step}"
                    await self._emit(s, "action.input.appended", {"callId": call, "inputTextDelta": "{}",
                                                                  "toolName": marks["tool"], "stepIndex": step,
                                                                  **turn}, deliveries)
                    await self._tool_step(s, call, marks["tool"], step, tokens, turn, deliveries)
                    step += 1
                    continue
                # Like the fake LLM: echo the latest user message, markers stripped.
                scripted = self.reply_for(texts[-1]) if self.reply_for is not None else None
                reply = marks.get("reply") or scripted or "echo: " + clean
                s.output_started = True
                self.first_delta_at.setdefault(reply, time.monotonic())  # benchmarks: eve's first delta
                if marks.get("chunkdelay"):
                    # Like fake_llm's [[chunkdelay=S]]: word by word, S seconds apart; a cancel
                    # cuts the text off (turn.cancelled, no message.completed).
                    pace = float(marks["chunkdelay"])
                    words = reply.split(" ")
                    for n, word in enumerate(words):
                        delta = word if n == 0 else " " + word
                        await self._emit(s, "message.appended", {"messageDelta": delta, "stepIndex": step, **turn},
                                         deliveries)
                        if n + 1 < len(words):
                            try:
                                await asyncio.wait_for(s.cancel.wait(), pace)
                            except TimeoutError:
                                continue
                            await self._emit(s, "turn.cancelled", turn, deliveries)
                            return
                else:
                    await self._emit(s, "message.appended", {"messageDelta": reply, "stepIndex": step, **turn},
                                     deliveries)
                await self._emit(s, "message.completed", {"finishReason": "stop", "message": reply, "stepIndex": step,
                                                          **turn}, deliveries)
                await self._emit(s, "step.completed", {"finishReason": "stop", "stepIndex": step, **turn,
                                                       "usage": {"inputTokens": tokens, "outputTokens": len(reply) // 4,
                                                                 "cacheReadTokens": 0}}, deliveries)
                s.usage_in += tokens
                s.usage_out += len(reply) // 4
                s.history_chars += sum(len(t) for t in texts) + len(reply)
                await self._emit(s, "turn.completed", turn, deliveries)
                return
        finally:
            s.sequence += 1
            s.turns_run += 1
            s.running = False
            # Steers that came after output started run as the next turn (PROTOCOL.md §4).
            while not s.steer.empty():
                s.inputs.put_nowait(s.steer.get_nowait())
            if s.active:
                await self._waiting(s, deliveries)

    async def _mcp_step(self, s: FakeSession, tool: str, args: dict[str, Any], step: int, turn: dict[str, Any],
                        deliveries: list[str], tokens: int) -> None:
        """One model step that calls an MCP tool the way eve does (PROTOCOL.md §11)."""
        import aiohttp

        headers = {"x-eve-session-id": s.id, "accept": "application/json, text/event-stream",
                   **({"authorization": f"Bearer {self.mcp_token}"} if self.mcp_token else {})}
        record: dict[str, Any] = {"session": s.id, "tool": tool, "args": args}
        assert self.mcp_url is not None
        try:
            async with aiohttp.ClientSession(headers=headers) as http:
                async def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
                    async with http.post(self.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                             "params": params}) as response:
                        return await response.json()

                listed = (await rpc("tools/list", {})).get("result", {}).get("tools", [])
                record["listed"] = [t["name"] for t in listed]
                if tool not in record["listed"]:
                    record["error"] = f'Connection "{self.mcp_connection}" has no tool named "{tool}".'
                else:
                    call = f"call_mcp_{turn['sequence']}_{step}"
                    name = f"{self.mcp_connection}__{tool}"
                    await self._emit(s, "actions.requested", {"actions": [{"callId": call, "input": args,
                                                                           "kind": "tool-call", "toolName": name}],
                                                              "stepIndex": step, **turn}, deliveries)
                    answer = await rpc("tools/call", {"name": tool, "arguments": {**args, "eve_session_id": s.id}})
                    result = answer.get("result") or {}
                    text = "".join(c.get("text", "") for c in result.get("content", []))
                    record.update(is_error=bool(result.get("isError")) or "error" in answer, output=text,
                                  rpc_error=answer.get("error"))
                    await self._emit(s, "action.result", {"result": {"callId": call, "kind": "tool-result",
                                                                     "output": text, "toolName": name},
                                                          "status": "failed" if record["is_error"] else "completed",
                                                          "stepIndex": step, **turn}, deliveries)
        except (aiohttp.ClientError, OSError) as exc:
            record["error"] = f'Failed to load tools for "{self.mcp_connection}": {exc}'
        self.mcp_results.append(record)
        await self._emit(s, "step.completed", {"finishReason": "tool-calls", "stepIndex": step, **turn,
                                               "usage": {"inputTokens": tokens, "outputTokens": 5,
                                                         "cacheReadTokens": 0}}, deliveries)
        s.usage_in += tokens

    async def _compaction(self, s: FakeSession) -> None:
        s.running = s.compacting = True
        s.cancel.clear()
        seq = s.sequence
        turn = {"sequence": seq, "sessionId": s.id, "stepIndex": 0, "turnId": f"turn_{seq}"}
        await self._emit(s, "compaction.requested", {"modelId": "fake/fake-model", **turn,
                                                     "usageInputTokens": s.history_chars / 4 + 31.75}, [])
        outcome = await self._sleep_or(s, self.summary_delay) if self.summary_delay else "timeout"
        s.running = s.compacting = False
        if outcome == "cancel":
            await self._waiting(s, [])
            await self._waiting(s, [])  # eve emits it twice after a cancelled compaction (§5)
            return
        if self.summary_fail:
            await self._waiting(s, [])
            return
        s.history_chars = min(s.history_chars, 400)
        s.compactions_done += 1
        await self._emit(s, "compaction.completed", {"modelId": "fake/fake-model", **turn}, [])
        if self.waiting_after_compaction:
            await asyncio.sleep(self.waiting_after_compaction)
        await self._waiting(s, [])
