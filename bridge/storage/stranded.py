"""V5: the chats an eve upgrade stranded, for the operator (``iva status``, ``iva sessions``).

eve replays a session only on the eve version that built it ("Stranded sessions",
``concepts/execution-model-and-durability.mdx``): after any upgrade of eve, every session it
holds answers a send with ``409 session_stranded``. Iva records which eve built each chat's
session (``chats.session_eve``, from eve's ``/info`` when the session was made) and the eve it
talks to now (``iva_meta.eve_version``, written by the daemon at start). A session is stranded
when another eve built it; one made before Iva recorded that is stranded when its cursor was read
on stream version 26 (eve 0.80.x) and the eve now speaks 27.

Moving them (``iva sessions --renew-stranded``) marks each idle chat on a stranded session for a
new session: its next message starts one at once (no ``409`` first), and the person is told in
one line, once, that the conversation starts afresh. One short write transaction beside a running
daemon, as ``iva status --clear-dead``: a busy chat is left to meet it in its turn.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import eve_client as eve

from .schema import beside_daemon

__all__ = ["Stranded", "read", "renew"]

_WHERE = ("eve_session IS NOT NULL AND reset_mark = 0 AND ((session_eve IS NOT NULL AND session_eve != :eve) "
          "OR (session_eve IS NULL AND stream_version = 26 AND :stream = 27))")


@dataclass(frozen=True, slots=True)
class StrandedChat:
    address: str
    session: str
    built_by: str | None  # the eve version that built the session (None: before Iva recorded it)
    busy: bool


@dataclass(frozen=True, slots=True)
class Stranded:
    """The eve the daemon last saw (None: not yet, or its token may not read /info) and the chats
    whose session another eve built."""

    eve_version: str | None
    stream_version: int | None
    chats: tuple[StrandedChat, ...]


def read(path: Path) -> Stranded:
    """Read-only (works while the daemon runs). Raises :class:`sqlite3.Error`, :class:`SchemaMismatch`."""
    with beside_daemon(path) as conn:
        version, stream = _eve(conn)
        rows = [] if version is None else conn.execute(
            f"SELECT address, eve_session, session_eve, status FROM chats WHERE {_WHERE} ORDER BY address",
            {"eve": version, "stream": stream}).fetchall()
    return Stranded(version, stream, tuple(StrandedChat(r["address"], r["eve_session"], r["session_eve"],
                                                        r["status"] == "busy") for r in rows))


def renew(path: Path) -> tuple[int, int]:
    """Every idle chat on a stranded session marked for a new one (the person told at its next
    answer). Returns (moved, left busy). Raises :class:`sqlite3.Error`, :class:`SchemaMismatch`,
    or :class:`LookupError` when the daemon has not yet learned eve's version."""
    with beside_daemon(path, write=True) as conn:
        version, stream = _eve(conn)
        if version is None:
            raise LookupError("the daemon has not learned eve's version yet (start it once with eve up, or "
                              "give its token access to /info)")
        values = {"eve": version, "stream": stream}
        moved = conn.execute(
            f"UPDATE chats SET reset_mark = 1, upgraded_from = eve_session WHERE status = 'idle' AND {_WHERE}",
            values).rowcount
        busy = conn.execute(f"SELECT count(*) FROM chats WHERE status = 'busy' AND {_WHERE}", values).fetchone()[0]
    return int(moved), int(busy)


def _eve(conn: sqlite3.Connection) -> tuple[str | None, int | None]:
    row = conn.execute("SELECT value FROM iva_meta WHERE key = 'eve_version'").fetchone()
    version = str(row[0]) if row is not None else None
    return version, eve.implied_stream_version(version)
