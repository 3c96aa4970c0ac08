"""The one error tree of eve_client.

    EveError
    ├── EveTransportError          connect/read/timeout failures and 5xx answers (retryable)
    │   ├── EveConnectError        the request never reached eve (safe to retry any route)
    │   └── EveServerError         eve answered 5xx
    ├── EveProtocolError           an answer we cannot make sense of (bad JSON, missing fields)
    └── EveRejected                eve answered 4xx (not retryable unless said otherwise)
        ├── EveUnauthorized        401: the token is wrong or missing
        ├── SessionNotReady        409 session_not_ready (retryable: the session is still starting)
        └── SessionGone            the session cannot go on: a new one is needed
            ├── SessionNotFound    404: eve does not know the session
            ├── SessionNotActive   409 session_not_active (the session was reset or never existed)
            ├── SessionExpired     410 session_expired (the stream of a reset session is gone)
            └── SessionStranded    409 session_stranded (the session belongs to another eve version)

httpx errors are translated in exactly one place, :func:`map_response` / :func:`map_transport`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = [
    "EveConnectError",
    "EveError",
    "EveProtocolError",
    "EveRejected",
    "EveServerError",
    "EveTransportError",
    "EveUnauthorized",
    "SessionExpired",
    "SessionGone",
    "SessionNotActive",
    "SessionNotFound",
    "SessionNotReady",
    "SessionStranded",
    "StreamVersionChanged",
    "UnsupportedStream",
]


class EveError(Exception):
    """Root of every error eve_client raises."""

    def __init__(self, message: str, *, route: str | None = None) -> None:
        super().__init__(message)
        self.route = route


class EveTransportError(EveError):
    """eve could not be reached or did not answer in time; worth retrying."""


class EveConnectError(EveTransportError):
    """The connection could not be made: eve did not see the request."""


class EveServerError(EveTransportError):
    """eve answered with a 5xx status."""

    def __init__(self, message: str, *, route: str | None = None, status: int, body: Any = None):
        super().__init__(message, route=route)
        self.status = status
        self.body = body


class EveProtocolError(EveError):
    """eve answered something that does not follow the protocol."""


class EveRejected(EveError):
    """eve refused the request (4xx)."""

    def __init__(
        self,
        message: str,
        *,
        route: str | None = None,
        status: int,
        code: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message, route=route)
        self.status = status
        self.code = code
        self.body = body


class EveUnauthorized(EveRejected):
    """401: the bearer token is missing or wrong."""


class SessionGone(EveRejected):
    """eve no longer has the session, or it cannot go on there: the caller needs a new one."""


class SessionNotFound(SessionGone):
    """404: eve does not know this session."""


class SessionNotReady(EveRejected):
    """409 session_not_ready: the session is still being set up; retry shortly."""


class SessionNotActive(SessionGone):
    """409 session_not_active: the session was reset or is unknown."""


class SessionExpired(SessionGone):
    """410 session_expired: eve no longer keeps this session's history (it was reset)."""


class SessionStranded(SessionGone):
    """409 session_stranded: the session was started by another eve version."""

    @property
    def eve_version(self) -> str | None:
        return self.body.get("eveVersion") if isinstance(self.body, dict) else None


_BY_CODE: dict[str, type[EveRejected]] = {
    "session_not_ready": SessionNotReady,
    "session_not_active": SessionNotActive,
    "session_stranded": SessionStranded,
    "session_expired": SessionExpired,
    "unauthorized": EveUnauthorized,
}


def _decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:500]


def map_response(response: httpx.Response, route: str) -> EveError:
    """The error for a non-2xx answer of eve."""
    body = _decode(response)
    status = response.status_code
    message = body.get("error") if isinstance(body, dict) else None
    message = f"{route}: {status} {message or body!r}"
    if status >= 500:
        return EveServerError(message, route=route, status=status, body=body)
    code = body.get("code") if isinstance(body, dict) else None
    if isinstance(code, str) and code in _BY_CODE:
        return _BY_CODE[code](message, route=route, status=status, code=code, body=body)
    if status == 401:
        return EveUnauthorized(message, route=route, status=status, code=code, body=body)
    if status == 404:
        return SessionNotFound(message, route=route, status=status, code=code, body=body)
    if status == 410:
        return SessionExpired(message, route=route, status=status, code=code, body=body)
    return EveRejected(message, route=route, status=status, code=code, body=body)


def map_transport(exc: httpx.HTTPError, route: str) -> EveError:
    """The error for a failure below HTTP (connect, read, timeout, broken chunking)."""
    message = f"{route}: {type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return EveConnectError(message, route=route)
    return EveTransportError(message, route=route)


class UnsupportedStream(EveError):
    """eve speaks a stream version this Iva cannot read (V1): one clear error, never a loop of
    malformed lines. Upgrade Iva (or run an eve it reads)."""

    def __init__(self, version: int, *, route: str = "stream") -> None:
        self.version = version
        super().__init__(f"eve speaks stream version {version}; this Iva reads versions 26 (eve 0.80.x) and 27 "
                         "(eve 0.84 and 1.x): upgrade Iva", route=route)


class StreamVersionChanged(SessionGone):
    """The cursor was read on another stream version than eve speaks now: eve was upgraded
    under the session (a 0.80 session on eve 1.x is stranded anyway, PROTOCOL-27.md §11)."""
