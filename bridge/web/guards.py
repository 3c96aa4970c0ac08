"""What every HTTP route of ours refuses before anything else (S1), each adapter in its own error
format: :func:`browser_origin` (403: nothing here is meant for a web page, and a page on another
site, or one that rebinds a name to 127.0.0.1, always sends ``Origin`` with a POST; eve and curl
send none), :func:`not_json` (415: a body that is not ``application/json``, e.g. the
``text/plain`` or form posts a page may send without asking first) and :func:`bearer_matches`."""

from __future__ import annotations

import hmac

from aiohttp import web

__all__ = ["bearer_matches", "browser_origin", "not_json"]


def browser_origin(request: web.BaseRequest) -> str | None:
    """The request's ``Origin`` header when it has one (every origin is refused), else None."""
    return request.headers.get("origin")


def not_json(request: web.BaseRequest) -> str | None:
    """The content type of a POST/PUT/PATCH body that is not ``application/json``, else None (no
    body at all is fine)."""
    if request.method not in ("POST", "PUT", "PATCH") or not request.body_exists:
        return None
    return None if request.content_type == "application/json" else request.content_type


def bearer_matches(request: web.BaseRequest, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time. A header that is not UTF-8
    (aiohttp hands its bytes over as surrogate escapes) is compared as its bytes: a mismatch, 401,
    never an encoding error's 500."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                                                              token.encode())
