"""EveClient: a typed async client of every route of eve's session API (PROTOCOL.md)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from ._errors import (
    EveError,
    EveProtocolError,
    EveTransportError,
    StreamVersionChanged,
    UnsupportedStream,
    map_response,
    map_transport,
)
from ._model import Event, Position, SessionBegan, SessionEnded
from ._models import (
    Accepted,
    AgentInfo,
    Answer,
    Delivery,
    Health,
    StreamPage,
    implied_stream_version,
)
from ._retry import RetryPolicy
from ._wire import Malformed, Transport
from ._wire26 import Reader26
from ._wire27 import Reader27

__all__ = ["START", "STREAM_VERSIONS", "ClientContext", "EveClient", "TurnPolicy", "file_part", "parse_lines"]

STREAM_VERSIONS = (26, 27)  # what this client reads: eve 0.80.x (one deprecation window) and ≥ 0.84
START = Position()

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


def parse_lines(lines: Sequence[str | bytes], *, version: int, session_id: str = "session",
                first: int = 0) -> list[Event | Malformed]:
    """The events of a stream's lines, read as eve ``version``'s wire from line ``first`` (what
    :meth:`EveClient.stream` yields; transport records left out). For tests and tools."""
    if version not in STREAM_VERSIONS:
        raise UnsupportedStream(version)
    reader: Reader26 | Reader27 = Reader27(session_id) if version >= 27 else Reader26()
    out: list[Event | Malformed] = []
    number = first
    for line in lines:
        parsed = reader.line(line.encode() if isinstance(line, str) else line, number)
        if isinstance(parsed, Transport):
            continue
        if isinstance(parsed, Malformed):
            out.append(parsed)
            continue
        number += 1
        out.extend(parsed)
    return out


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
        on_malformed: Callable[[str, Malformed], None] | None = None,
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
        self._version: int | None = None
        self._unsupported: UnsupportedStream | None = None
        self.eve_version: str | None = None  # eve's own version, where /info said it

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

    async def _once(self, method: str, path: str, route: str, json: Any = None,
                    headers: Mapping[str, str] | None = None) -> httpx.Response:
        try:
            response = await self._pool_of(path).request(method, path, json=json, headers=headers)
        except httpx.HTTPError as exc:
            raise map_transport(exc, route) from exc
        if response.status_code >= 400:
            raise map_response(response, route)
        return response

    async def _call(
        self, method: str, path: str, *, route: str, json: Any = None, idempotent: bool = True, keyed: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[httpx.Response, dict[str, Any]]:
        async for attempt in self._retry.retrying(idempotent=idempotent, keyed=keyed):
            with attempt:
                response = await self._once(method, path, route, json, headers)
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
        info = AgentInfo.from_json(body)
        self.eve_version = info.eve_version or self.eve_version
        if self._version is None and (implied := info.stream_version) is not None:
            self._learned(implied)
        return info

    async def create_session(
        self, message: str | None = None, *, client_context: ClientContext | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """``POST /eve/v1/session``; returns the new session id. ``headers``: the caller's own,
        sent with this request only (never a body field: eve 1.x refuses unknown ones)."""
        payload: dict[str, Any] | None = None
        if message is not None:
            payload = {"message": message}
            if client_context is not None:
                payload["clientContext"] = client_context
        elif client_context is not None:
            raise ValueError("eve accepts clientContext on create only together with a message")
        response, body = await self._call(
            "POST", "/eve/v1/session", route="create", json=payload, idempotent=False, headers=headers
        )
        session_id = body.get("sessionId") or response.headers.get("x-eve-session-id")
        if not isinstance(session_id, str) or not session_id:
            raise EveProtocolError("create: no sessionId in the answer", route="create")
        return session_id

    @property
    def stream_version(self) -> int | None:
        """The stream version eve last spoke (a stream's header, or what ``/info`` implied);
        None until then."""
        return self._version

    def _wire(self) -> int:
        """The version requests are shaped for: the one eve spoke, else eve 1.x's (V3)."""
        return self._version or STREAM_VERSIONS[-1]

    @property
    def dedupes_sends(self) -> bool:
        """eve answers a send with a key it has seen with the first delivery (eve 1.x, V4): an
        ambiguous send is sent again instead of looked for in the stream (F4, eve 0.80)."""
        return self._wire() >= 27

    @property
    def unsupported(self) -> UnsupportedStream | None:
        """The error of the last stream eve served in a version this client cannot read (V1);
        None once eve speaks one it reads again."""
        return self._unsupported

    def _learned(self, version: int) -> None:
        self._unsupported = None
        if version != self._version:
            log.info("eve_stream_version", extra={"version": version})
            self._version = version

    def _refused(self, version: int) -> UnsupportedStream:
        error = UnsupportedStream(version)
        if self._unsupported is None or self._unsupported.version != version:
            log.error("eve_stream_version_unsupported", extra={"version": version, "error": str(error)})  # once
        self._unsupported = error
        return error

    async def probe_stream_version(self) -> int:
        """The stream version eve speaks, read from a stream's own header: a message-free session
        is made, read once (it holds nothing) and ended. Raises :class:`UnsupportedStream` for a
        version this client cannot read. For ``iva check``; the bridge learns it as it goes."""
        session = await self.create_session()
        try:
            page = await self.read(session)
        finally:
            with contextlib.suppress(EveError):
                await self.end(session, reason="iva check")
        return page.version

    async def send(
        self,
        session_id: str,
        message: str | Sequence[Mapping[str, Any]],
        *,
        turn_policy: TurnPolicy | None = None,
        client_context: ClientContext | None = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Delivery:
        """``POST /eve/v1/session/:id``: deliver a message (steer by default, as eve does).

        ``message`` is text, or a list of parts (``{"type": "text", "text"}`` and
        ``{"type": "file", "data": "data:<type>;base64,…", "mediaType", "filename"}``).
        ``idempotency_key`` (eve 1.x): the same key again is the same delivery and no second
        turn (V4); eve 0.80 has no such field and is not sent one (V3). ``headers``: as for
        :meth:`create_session`.
        """
        payload: dict[str, Any] = {"message": message if isinstance(message, str) else list(message)}
        if turn_policy is not None:
            payload["turnPolicy"] = turn_policy
        if client_context is not None:
            payload["clientContext"] = client_context
        keyed = idempotency_key is not None and self.dedupes_sends
        if keyed:
            assert idempotency_key is not None
            payload["idempotencyKey"] = idempotency_key[:256]
        # V4: a keyed send whose answer was lost is simply sent again: eve answers it once
        _, body = await self._call(
            "POST", f"/eve/v1/session/{self._sid(session_id)}", route="send", json=payload,
            idempotent=False, keyed=keyed, headers=headers,
        )
        delivery = body.get("deliveryId")
        return Delivery(session_id=session_id, delivery_id=delivery if isinstance(delivery, str) else None)

    async def respond(self, session_id: str, answers: Sequence[Answer], *,
                      headers: Mapping[str, str] | None = None) -> Delivery:
        """Answer what the turn waits on (a question, an approval, a budget prompt): eve 1.x's
        ``answers: [{interactionId, optionId | text}]``, or 0.80's ``inputResponses``.
        ``headers``: as for :meth:`create_session`."""
        v27 = self._wire() >= 27
        key = "interactionId" if v27 else "requestId"
        items = [{key: a.question_id, **({"optionId": a.option_id} if a.option_id is not None else {}),
                  **({"text": a.text} if a.text is not None else {})} for a in answers]
        _, body = await self._call(
            "POST", f"/eve/v1/session/{self._sid(session_id)}", route="respond",
            json={"answers" if v27 else "inputResponses": items}, idempotent=False, headers=headers,
        )
        delivery = body.get("deliveryId")
        return Delivery(session_id=session_id, delivery_id=delivery if isinstance(delivery, str) else None)

    async def _action(self, session_id: str, action: str, payload: Any, *, idempotent: bool) -> dict[str, Any]:
        _, body = await self._call(
            "POST", f"/eve/v1/session/{self._sid(session_id)}/{action}", route=action,
            json=payload, idempotent=idempotent,
        )
        return body

    @staticmethod
    def _accepted(body: Mapping[str, Any]) -> Accepted:
        """0.80 says ``status``; 1.x answers 202 with a receipt (``deliveryId``) instead."""
        status = body.get("status")
        if isinstance(status, str) and status:
            return Accepted(status=status)
        delivery = body.get("deliveryId")
        return Accepted(status="accepted", delivery_id=delivery if isinstance(delivery, str) else None)

    async def cancel(self, session_id: str, *, turn_id: str | None = None) -> Accepted:
        """``POST …/cancel``: cancel the running turn (by the ``turnId`` seen on the stream)."""
        body = await self._action(session_id, "cancel", {"turnId": turn_id} if turn_id else {}, idempotent=True)
        return self._accepted(body)

    async def compact(self, session_id: str) -> Accepted:
        """``POST …/compact``: eve answers 202 before the summary runs (PROTOCOL.md §5)."""
        body = await self._action(session_id, "compact", {}, idempotent=False)
        return self._accepted(body)

    async def clear(self, session_id: str) -> Accepted:
        """``POST …/clear``: drop the history, keep the session."""
        body = await self._action(session_id, "clear", {}, idempotent=False)
        return self._accepted(body)

    async def end(self, session_id: str, *, reason: str | None = None) -> Accepted:
        """Retire the session: ``POST …/end`` on eve 1.x (its history is deleted: read what you
        need first), ``…/reset`` on 0.80. Later sends get ``session_not_active``."""
        route = "end" if self._wire() >= 27 else "reset"
        body = await self._action(session_id, route, {"reason": reason} if reason else {}, idempotent=True)
        return self._accepted(body)

    # -- the stream -------------------------------------------------------------------------

    def _params(self, start_line: int, follow: bool) -> dict[str, str]:
        params = {"startIndex": str(start_line)}
        if not follow:
            # the tail's header; on eve 1.x ``includeTailIndex`` alone also ends the read at the
            # tail (PROTOCOL-27.md §3), so a followed stream never asks for it
            params.update(follow="false", includeTailIndex="1")
        return params

    async def read(self, session_id: str, cursor: Position = START) -> StreamPage:
        """Read the stream from ``cursor`` to its current tail (``follow=false``)."""
        events: list[Event] = []
        tail: int | None = None
        version = 0
        async for attempt in self._retry.retrying(idempotent=True):
            with attempt:
                events.clear()
                async with self._open(session_id, cursor, follow=False, idle=None) as opened:
                    tail, version = opened.tail, opened.version
                    async for item in self._records(session_id, opened, self._reader(session_id, opened.version),
                                                    learn=False):
                        if isinstance(item, Transport):
                            if item.kind == "stream.ended":
                                break
                            continue
                        if item.position >= cursor:
                            events.append(item)
        return StreamPage(events=tuple(events), tail_index=tail, version=version)

    async def stream(self, session_id: str, cursor: Position = START) -> AsyncIterator[Event]:
        """Follow the stream from ``cursor``; a dropped connection, or eve's lease end, resumes.

        Ends after the session ended (``stream.ended``, or its last event on version 26). A
        dropped or silent connection is reopened from the cursor; after ``attempts`` failures in
        a row without progress the transport error is raised, and the caller resumes later from
        its cursor. A lease end or a heartbeat is no failure (V2).
        """
        failures = 0
        reader: Reader26 | Reader27 | None = None
        while True:
            progressed = leased = False
            try:
                async with self._open(session_id, cursor, follow=True, idle=self._stream_idle) as opened:
                    if reader is None or reader.version != opened.version:
                        reader = self._reader(session_id, opened.version)
                    async for item in self._records(session_id, opened, reader):
                        if isinstance(item, Transport):
                            if item.kind == "stream.ended":
                                return
                            leased = leased or item.kind == "stream.lease-ended"
                            continue
                        if isinstance(item, SessionBegan) and \
                                implied_stream_version(item.eve_version) not in (None, opened.version):
                            # V2, V5: the session was built by an eve of another wire (a 0.80 session
                            # served converted by 1.x: stranded, PROTOCOL-27.md §11), whatever the
                            # cursor says (a cursor still at the start was read on no version)
                            raise StreamVersionChanged(
                                f"stream: the session was built by eve {item.eve_version}, eve now speaks "
                                f"{opened.version} (an upgrade: the session cannot go on)", route="stream",
                                status=409, code="stream_version_changed")
                        if item.position < cursor:
                            continue  # the rest of a line read before
                        cursor = item.after
                        progressed = True
                        yield item
                        if isinstance(item, SessionEnded) and opened.version < 27:
                            return
                failure: EveError | None = None
            except EveTransportError as exc:
                failure = exc
            if failure is None and (leased or progressed):
                failures = 0
                log.debug("eve_stream_resumed", extra={"session_id": session_id, "cursor": str(cursor)})
                continue
            failures = 1 if progressed else failures + 1
            if failure is not None and failures >= self._retry.attempts:
                raise failure
            log.info("eve_stream_reconnect", extra={"session_id": session_id, "cursor": str(cursor)})
            await asyncio.sleep(self._retry.backoff(failures))

    def _reader(self, session_id: str, version: int) -> Reader26 | Reader27:
        return Reader27(session_id) if version >= 27 else Reader26()

    def _open(self, session_id: str, cursor: Position, *, follow: bool, idle: float | None) -> _StreamContext:
        return _StreamContext(self, session_id, cursor, follow, idle)

    async def _records(
        self, session_id: str, opened: _Opened, reader: Reader26 | Reader27, *, learn: bool = True
    ) -> AsyncIterator[Event | Transport]:
        number = opened.first
        async for line in opened.lines:
            if not line.strip():
                continue
            parsed = reader.line(line, number)
            if isinstance(parsed, Transport):
                if parsed.kind == "position" and parsed.next is not None:
                    number = parsed.next
                yield parsed
                continue
            if isinstance(parsed, Malformed):
                # Not counted as a line: if it was one, the cursor lags and a resume reads it
                # again (harmless: positions and keys are stable); counting it could skip one.
                log.warning("eve_stream_malformed_line", extra={"session_id": session_id, "line": parsed.number,
                                                                "error": parsed.error})
                if self._on_malformed is not None:
                    self._on_malformed(session_id, parsed)
                continue
            number += 1
            for event in parsed:
                if learn and isinstance(event, SessionBegan) and \
                        implied_stream_version(event.eve_version) == opened.version:
                    # the eve a session was started on, if it is the eve serving it (a session 0.80
                    # started, read on 1.x after an upgrade, says 0.80.1)
                    self.eve_version = event.eve_version
                yield event


@dataclass(frozen=True, slots=True)
class _Opened:
    first: int
    lines: AsyncIterator[bytes]
    tail: int | None
    version: int


class _StreamContext:
    """Opens one stream response: the first line's number, its complete lines, the tail, the
    version (refused unless this client reads it, V1; refused when the cursor was read on
    another version, V2)."""

    def __init__(self, client: EveClient, session_id: str, cursor: Position, follow: bool, idle: float | None):
        self._client = client
        self._session_id = session_id
        self._path = f"/eve/v1/session/{client._sid(session_id)}/stream"
        self._params = client._params(cursor.line, follow)
        self._cursor = cursor
        self._idle = idle
        self._cm: Any = None

    async def __aenter__(self) -> _Opened:
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
        named = response.headers.get("x-eve-stream-version", "")
        version = int(named) if named.isdigit() else 26  # 0.80 names 26; an eve before it named nothing
        if version not in STREAM_VERSIONS:
            await response.aclose()
            raise self._client._refused(version)
        self._client._learned(version)
        if self._cursor.version and self._cursor.version != version:
            await response.aclose()
            raise StreamVersionChanged(
                f"stream: the cursor {self._cursor} was read on stream version {self._cursor.version}, eve now "
                f"speaks {version} (an upgrade: the session cannot go on)", route="stream", status=409,
                code="stream_version_changed")
        tail_header = response.headers.get("x-eve-stream-tail-index")
        tail = int(tail_header) if tail_header and tail_header.lstrip("-").isdigit() else None
        first = self._cursor.line
        if first < 0:
            if tail is None:
                await response.aclose()
                raise EveProtocolError("stream: a negative startIndex needs the tail index header", route="stream")
            first = max(0, tail + 1 + first)
        return _Opened(first, self._lines(response), tail, version)

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
