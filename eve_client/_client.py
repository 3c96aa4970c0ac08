"""EveClient: a typed async client of every route of eve's session API (PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import enum
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from ._errors import (
    EveError,
    EveProtocolError,
    EveTransportError,
    map_response,
    map_transport,
)
from ._events import Event, MalformedLine, SessionCompleted, parse_event
from ._models import Accepted, AgentInfo, Delivery, Health, ResetResult, StreamPage
from ._retry import RetryPolicy

__all__ = ["ClientContext", "EveClient", "TurnPolicy", "file_part"]

log = logging.getLogger("eve_client")

TurnPolicy = Literal["queue", "steer"]


def file_part(data: bytes, media_type: str, filename: str | None = None) -> dict[str, Any]:
    """A file part for :meth:`EveClient.send`, carried as a base64 ``data:`` URL."""
    import base64

    part: dict[str, Any] = {"type": "file", "mediaType": media_type,
                            "data": f"data:{media_type};base64,{base64.b64encode(data).decode()}"}
    if filename:
        part["filename"] = filename
    return part
ClientContext = str | Sequence[str] | Mapping[str, Any]

DEFAULT_TIMEOUT = httpx.Timeout(15.0, connect=5.0)
DEFAULT_STREAM_IDLE = 120.0
POOLS = 16  # connection pools the sessions are spread over (by session id)
# A followed stream holds its connection for a whole turn, so the pool must not cap them: the
# caller bounds concurrency (the bridge's IVA_MAX_TURNS). httpx's default of 100 would make
# the 101st busy chat wait for a connection and fail with PoolTimeout.
DEFAULT_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=32)


class _State(enum.Enum):
    UNOPENED = 1
    OPENED = 2
    CLOSED = 3


class EveClient:
    """Async client of eve's HTTP API. Knows nothing about Telegram.

    Use as ``async with EveClient(url, token=...) as eve:``. ``transport`` is the one seam for
    tests. Requests that eve may already have acted on (send, compact) are only retried when
    the connection was never made or eve said ``session_not_ready``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        stream_idle_timeout: float = DEFAULT_STREAM_IDLE,
        limits: httpx.Limits = DEFAULT_LIMITS,
        on_malformed: Callable[[str, MalformedLine], None] | None = None,
    ) -> None:
        headers = {"accept": "application/json", "user-agent": "iva-eve-client/0.1"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        # One TLS context for every pool: httpx would build one per client, and loading the CA
        # bundle costs ~20 ms of CPU each (16 pools: a third of a second at every start).
        tls = httpx.create_ssl_context() if transport is None else None

        def client() -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout,
                                     transport=transport, limits=limits, verify=tls or True)

        # Sessions are spread over POOLS connection pools: each followed stream holds a
        # connection for the whole busy period, and httpcore scans every connection of a pool on
        # every request and release; with 1 000 busy chats in one pool that scan was the top
        # cost (docs/benchmarks.md, 6). One session's calls and stream share a pool, so a
        # stream can reuse the connection its send just freed.
        self._pools = [client() for _ in range(POOLS)]
        self._http = self._pools[0]
        self._retry = retry or RetryPolicy()
        self._stream_idle = stream_idle_timeout
        self._on_malformed = on_malformed
        self._state = _State.UNOPENED

    async def __aenter__(self) -> Self:
        if self._state is _State.OPENED:
            raise RuntimeError("EveClient is already open")
        if self._state is _State.CLOSED:
            raise RuntimeError("EveClient was closed and cannot be reopened")
        self._state = _State.OPENED
        for pool in self._pools:
            await pool.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._state is not _State.CLOSED:
            self._state = _State.CLOSED
            for pool in self._pools:
                await pool.aclose()

    # -- plumbing ---------------------------------------------------------------------------

    async def _once(self, method: str, path: str, route: str, json: Any = None) -> httpx.Response:
        try:
            response = await self._pool_of(path).request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise map_transport(exc, route) from exc
        if response.status_code >= 400:
            raise map_response(response, route)
        return response

    async def _call(
        self, method: str, path: str, *, route: str, json: Any = None, idempotent: bool = True
    ) -> tuple[httpx.Response, dict[str, Any]]:
        async for attempt in self._retry.retrying(idempotent=idempotent):
            with attempt:
                response = await self._once(method, path, route, json)
        try:
            body = response.json()
        except ValueError as exc:
            raise EveProtocolError(f"{route}: answer is not JSON", route=route) from exc
        if not isinstance(body, dict):
            raise EveProtocolError(f"{route}: answer is not a JSON object", route=route)
        return response, body

    def _pool(self, session_id: str) -> httpx.AsyncClient:
        return self._pools[zlib.crc32(session_id.encode()) % len(self._pools)]

    def _pool_of(self, path: str) -> httpx.AsyncClient:
        """/eve/v1/session/<id>/... goes to that session's pool; the rest to the first."""
        parts = path.split("/", 5)
        return self._pool(parts[4]) if len(parts) > 4 and parts[3] == "session" and parts[4] else self._http

    @staticmethod
    def _sid(session_id: str) -> str:
        if not session_id or "/" in session_id:
            raise ValueError(f"not a session id: {session_id!r}")
        return session_id

    # -- routes -----------------------------------------------------------------------------

    async def health(self) -> Health:
        """``GET /eve/v1/health`` (no auth needed)."""
        _, body = await self._call("GET", "/eve/v1/health", route="health")
        return Health(ok=bool(body.get("ok")), status=body.get("status"))

    async def info(self) -> AgentInfo:
        """``GET /eve/v1/info``: the agent, its model and the model's context window."""
        _, body = await self._call("GET", "/eve/v1/info", route="info")
        return AgentInfo.from_json(body)

    async def create_session(
        self, message: str | None = None, *, client_context: ClientContext | None = None
    ) -> str:
        """``POST /eve/v1/session``; returns the new session id."""
        payload: dict[str, Any] | None = None
        if message is not None:
            payload = {"message": message}
            if client_context is not None:
                payload["clientContext"] = client_context
        elif client_context is not None:
            raise ValueError("eve accepts clientContext on create only together with a message")
        response, body = await self._call(
            "POST", "/eve/v1/session", route="create", json=payload, idempotent=False
        )
        session_id = body.get("sessionId") or response.headers.get("x-eve-session-id")
        if not isinstance(session_id, str) or not session_id:
            raise EveProtocolError("create: no sessionId in the answer", route="create")
        return session_id

    async def send(
        self,
        session_id: str,
        message: str | Sequence[Mapping[str, Any]],
        *,
        turn_policy: TurnPolicy | None = None,
        client_context: ClientContext | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Delivery:
        """``POST /eve/v1/session/:id``: deliver a message (steer by default, as eve does).

        ``message`` is text, or a list of parts (``{"type": "text", "text"}`` and
        ``{"type": "file", "data": "data:<type>;base64,…", "mediaType", "filename"}``).
        """
        payload: dict[str, Any] = {"message": message if isinstance(message, str) else list(message)}
        if turn_policy is not None:
            payload["turnPolicy"] = turn_policy
        if client_context is not None:
            payload["clientContext"] = client_context
        if extra:
            payload.update(extra)
        _, body = await self._call(
            "POST", f"/eve/v1/session/{self._sid(session_id)}", route="send", json=payload,
            idempotent=False,
        )
        delivery = body.get("deliveryId")
        return Delivery(session_id=session_id, delivery_id=delivery if isinstance(delivery, str) else None)

    async def respond(self, session_id: str, responses: Sequence[Mapping[str, Any]]) -> Delivery:
        """Answer pending input requests: ``[{"requestId", "optionId"?, "text"?}]``."""
        _, body = await self._call(
            "POST", f"/eve/v1/session/{self._sid(session_id)}", route="respond",
            json={"inputResponses": [dict(r) for r in responses]}, idempotent=False,
        )
        delivery = body.get("deliveryId")
        return Delivery(session_id=session_id, delivery_id=delivery if isinstance(delivery, str) else None)

    async def _action(self, session_id: str, action: str, payload: Any, *, idempotent: bool) -> dict[str, Any]:
        _, body = await self._call(
            "POST", f"/eve/v1/session/{self._sid(session_id)}/{action}", route=action,
            json=payload, idempotent=idempotent,
        )
        return body

    async def cancel(self, session_id: str, *, turn_id: str | None = None) -> Accepted:
        """``POST …/cancel``: cancel the running turn or compaction."""
        body = await self._action(session_id, "cancel", {"turnId": turn_id} if turn_id else {}, idempotent=True)
        return Accepted(status=str(body.get("status", "")))

    async def compact(self, session_id: str) -> Accepted:
        """``POST …/compact``: eve answers 202 before the summary runs (PROTOCOL.md §5)."""
        body = await self._action(session_id, "compact", {}, idempotent=False)
        return Accepted(status=str(body.get("status", "")))

    async def clear(self, session_id: str) -> Accepted:
        """``POST …/clear``: drop the history, keep the session."""
        body = await self._action(session_id, "clear", {}, idempotent=False)
        return Accepted(status=str(body.get("status", "")))

    async def reset(self, session_id: str, *, reason: str | None = None) -> ResetResult:
        """``POST …/reset``: retire the session; later sends get ``session_not_active``."""
        body = await self._action(session_id, "reset", {"reason": reason} if reason else {}, idempotent=True)
        previous = body.get("previousSessionId")
        return ResetResult(status=str(body.get("status", "")), previous_session_id=previous if isinstance(previous, str) else None)

    # -- the stream -------------------------------------------------------------------------

    def _params(self, start_index: int, follow: bool) -> dict[str, str]:
        params = {"startIndex": str(start_index), "includeTailIndex": "1"}
        if not follow:
            params["follow"] = "false"
        return params

    async def read(self, session_id: str, start_index: int = 0) -> StreamPage:
        """Read the stream from ``start_index`` to its current tail (``follow=false``)."""
        events: list[Event] = []
        tail: int | None = None
        async for attempt in self._retry.retrying(idempotent=True):
            with attempt:
                events.clear()
                async with self._open(session_id, start_index, follow=False, idle=None) as (first, lines, tail):
                    async for item in self._parse(session_id, first, lines):
                        events.append(item)
        return StreamPage(events=tuple(events), tail_index=tail)

    async def stream(self, session_id: str, start_index: int = 0) -> AsyncIterator[Event]:
        """Follow the stream from absolute ``start_index``; a dropped connection resumes.

        Ends after ``session.completed`` (the session was retired). A dropped or silent
        connection is reopened from the cursor; after ``attempts`` failures in a row without
        progress the transport error is raised, and the caller resumes later from its cursor.
        """
        cursor = start_index
        failures = 0
        while True:
            progressed = False
            try:
                async with self._open(session_id, cursor, follow=True, idle=self._stream_idle) as (
                    first, lines, _tail,
                ):
                    async for event in self._parse(session_id, first, lines):
                        cursor = event.index + 1
                        progressed = True
                        yield event
                        if isinstance(event, SessionCompleted):
                            return
                failure: EveError | None = None
            except EveTransportError as exc:
                failure = exc
            failures = 1 if progressed else failures + 1
            if failure is not None and failures >= self._retry.attempts:
                raise failure
            log.info("eve_stream_reconnect", extra={"session_id": session_id, "cursor": cursor})
            await asyncio.sleep(self._retry.backoff(failures))

    def _open(self, session_id: str, start_index: int, *, follow: bool, idle: float | None) -> _StreamContext:
        return _StreamContext(self, session_id, start_index, follow, idle)

    async def _parse(
        self, session_id: str, first: int, lines: AsyncIterator[bytes]
    ) -> AsyncIterator[Event]:
        index = first
        async for line in lines:
            if not line.strip():
                continue
            item = parse_event(line, index)
            if isinstance(item, MalformedLine):
                # Not counted as an index: if it was one, the cursor lags and a resume reads one
                # event again (harmless, events have stable ids); counting it could skip one.
                log.warning("eve_stream_malformed_line", extra={"session_id": session_id, "index": item.index, "error": item.error})
                if self._on_malformed is not None:
                    self._on_malformed(session_id, item)
                continue
            index += 1
            yield item


class _StreamContext:
    """Opens one stream response; yields (index of first line, complete lines, tail index)."""

    def __init__(self, client: EveClient, session_id: str, start: int, follow: bool, idle: float | None):
        self._client = client
        self._session_id = session_id
        self._path = f"/eve/v1/session/{client._sid(session_id)}/stream"
        self._params = client._params(start, follow)
        self._start = start
        self._idle = idle
        self._cm: Any = None

    async def __aenter__(self) -> tuple[int, AsyncIterator[bytes], int | None]:
        http = self._client._pool(self._session_id)
        timeout = httpx.Timeout(http.timeout.connect or 5.0, read=self._idle, connect=http.timeout.connect)
        # A stream is read as it comes: ask for no compression (a compressing proxy would hold
        # lines back), and decode whatever content-encoding comes anyway (aiter_bytes).
        request = http.build_request("GET", self._path, params=self._params, timeout=timeout,
                                     headers={"accept-encoding": "identity"})
        try:
            response = await http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise map_transport(exc, "stream") from exc
        self._cm = response
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            raise map_response(response, "stream")
        tail_header = response.headers.get("x-eve-stream-tail-index")
        tail = int(tail_header) if tail_header and tail_header.lstrip("-").isdigit() else None
        first = self._start
        if first < 0:
            if tail is None:
                await response.aclose()
                raise EveProtocolError("stream: a negative startIndex needs the tail index header", route="stream")
            first = max(0, tail + 1 + first)
        return first, self._lines(response), tail

    async def _lines(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """Complete, newline-terminated lines only; a line cut by a dropped connection is not one."""
        buffer = b""
        try:
            async for chunk in response.aiter_bytes():
                buffer += chunk
                while (cut := buffer.find(b"\n")) >= 0:
                    line, buffer = buffer[:cut], buffer[cut + 1 :]
                    yield line
        except httpx.HTTPError as exc:
            raise map_transport(exc, "stream") from exc
        if buffer.strip():
            # A final line without its newline: the connection was cut inside it.
            raise EveTransportError("stream: connection closed inside a line", route="stream")

    async def __aexit__(self, *exc: object) -> None:
        if self._cm is not None:
            await self._cm.aclose()


