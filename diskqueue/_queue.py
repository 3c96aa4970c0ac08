"""DiskQueue: a durable per-address FIFO of messages on SQLite.

States: ``QUEUED → INFLIGHT → DONE``, plus ``DROPPED`` (taken off on purpose). Every transition
is one guarded ``UPDATE … WHERE state = ?`` that says whether it applied. A claim takes an
address's next messages in one statement. Knows nothing of Telegram or eve.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._db import Database

__all__ = ["DiskQueue", "Message", "State"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS diskqueue_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS diskqueue_messages (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    address     TEXT    NOT NULL,
    dedupe_key  TEXT    UNIQUE,
    payload     TEXT    NOT NULL,
    state       INTEGER NOT NULL DEFAULT 0,
    attempts    INTEGER NOT NULL DEFAULT 0,
    claim       TEXT,
    enqueued_at REAL    NOT NULL,
    claimed_at  REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS diskqueue_by_address ON diskqueue_messages (address, state, id);
CREATE INDEX IF NOT EXISTS diskqueue_by_state ON diskqueue_messages (state, id);
"""


def _glob_literal(text: str) -> str:
    """``text`` matched literally by GLOB (its wildcards each in a one-character class)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


class State(enum.IntEnum):
    QUEUED = 0
    INFLIGHT = 1
    DONE = 2
    DROPPED = 3


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    address: str
    dedupe_key: str | None
    payload: Mapping[str, Any] = field(repr=False)
    state: State
    attempts: int
    claim: str | None
    enqueued_at: float
    claimed_at: float | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Message:
        return cls(
            id=row["id"],
            address=row["address"],
            dedupe_key=row["dedupe_key"],
            payload=json.loads(row["payload"]),
            state=State(row["state"]),  # raises on an unknown state
            attempts=row["attempts"],
            claim=row["claim"],
            enqueued_at=row["enqueued_at"],
            claimed_at=row["claimed_at"],
        )


class DiskQueue:
    """The queue on an open :class:`Database`; compose calls with ``db.transaction()``."""

    def __init__(self, db: Database, *, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the time written in ``enqueued_at``, ``claimed_at`` and ``finished_at`` (the
        bridge gives its steady wall time, one a clock step does not move)."""
        self.db = db
        self.clock = clock

    async def migrate(self) -> None:
        """Create the tables; refuse a file written by a newer diskqueue."""
        async with self.db.transaction():
            for statement in filter(str.strip, _SCHEMA.split(";")):
                await self.db.execute(statement)
            row = await self.db.fetchone("SELECT value FROM diskqueue_meta WHERE key = 'schema'")
            version = int(row["value"]) if row else 0
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"diskqueue schema {version} is newer than this code ({SCHEMA_VERSION})")
            if version < SCHEMA_VERSION:
                await self.db.execute(
                    "INSERT INTO diskqueue_meta (key, value) VALUES ('schema', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(SCHEMA_VERSION),),
                )

    async def enqueue(
        self, address: str, payload: Mapping[str, Any], *, dedupe_key: str | None = None
    ) -> int | None:
        """Add a message; returns its id, or None when ``dedupe_key`` was seen before."""
        rows = await self.db.fetchall(
            "INSERT INTO diskqueue_messages (address, dedupe_key, payload, enqueued_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (dedupe_key) DO NOTHING RETURNING id",
            (address, dedupe_key, json.dumps(payload, ensure_ascii=False, separators=(",", ":")), self.clock()),
        )
        return rows[0]["id"] if rows else None

    async def remember(self, address: str, payload: Mapping[str, Any], *, dedupe_key: str) -> bool:
        """Record an item handled on the spot (DONE at once), only for its dedupe key.

        Returns False when the key was seen before: the caller must not act again.
        """
        now = self.clock()
        rows = await self.db.fetchall(
            "INSERT INTO diskqueue_messages (address, dedupe_key, payload, state, enqueued_at, finished_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (dedupe_key) DO NOTHING RETURNING id",
            (address, dedupe_key, json.dumps(payload, ensure_ascii=False), State.DONE, now, now),
        )
        return bool(rows)

    async def claim(self, address: str, *, limit: int = 1, claim: str | None = None) -> list[Message]:
        """Move the address's next ``limit`` queued messages to INFLIGHT, oldest first."""
        rows = await self.db.fetchall(
            "UPDATE diskqueue_messages SET state = ?, claim = ?, claimed_at = ? "
            "WHERE id IN (SELECT id FROM diskqueue_messages WHERE address = ? AND state = ? ORDER BY id LIMIT ?) "
            "RETURNING *",
            (State.INFLIGHT, claim, self.clock(), address, State.QUEUED, limit),
        )
        return sorted((Message.from_row(r) for r in rows), key=lambda m: m.id)

    async def replace(self, message_id: int, payload: Mapping[str, Any], *, state: State,
                      claim: str | None = None) -> bool:
        """A message's payload, rewritten only while it is still in ``state`` (and, when given,
        under ``claim``): one guarded statement; says whether it applied."""
        sql = "UPDATE diskqueue_messages SET payload = ? WHERE id = ? AND state = ?"
        params: list[Any] = [json.dumps(payload, ensure_ascii=False, separators=(",", ":")), message_id, state]
        if claim is not None:
            sql += " AND claim = ?"
            params.append(claim)
        return bool(await self.db.execute(sql, params))

    async def history(self, dedupe_key: str) -> list[Message]:
        """The message with ``dedupe_key`` and those keyed after it (``<key>:<suffix>``: its
        revisions), oldest first, whatever their state."""
        rows = await self.db.fetchall(
            "SELECT * FROM diskqueue_messages WHERE dedupe_key = ? OR dedupe_key GLOB ? ORDER BY id",
            (dedupe_key, _glob_literal(dedupe_key) + ":*"),
        )
        return [Message.from_row(r) for r in rows]

    async def _move(self, ids: Sequence[int], src: State, dst: State, *, claim: str | None = None) -> int:
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        sql = f"UPDATE diskqueue_messages SET state = ?, finished_at = ? WHERE state = ? AND id IN ({marks})"
        params: list[Any] = [dst, self.clock() if dst in (State.DONE, State.DROPPED) else None, src, *ids]
        if claim is not None:
            sql += " AND claim = ?"
            params.append(claim)
        return await self.db.execute(sql, params)

    async def count_failure(self, ids: Sequence[int], *, claim: str) -> int:
        """One more failed attempt for these in-flight messages; returns the highest count.

        Counted by the caller for the failures it means to bound (a claim alone counts nothing:
        a message given back because its consumer was unreachable has not failed)."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        rows = await self.db.fetchall(
            f"UPDATE diskqueue_messages SET attempts = attempts + 1 WHERE state = ? AND claim = ? AND id IN ({marks}) "
            "RETURNING attempts",
            [State.INFLIGHT, claim, *ids],
        )
        return max((int(r["attempts"]) for r in rows), default=0)

    async def reassign(self, ids: Sequence[int], *, claim: str, to: str) -> int:
        """In-flight messages under ``claim`` move to the claim ``to`` (still in flight)."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        return await self.db.execute(
            f"UPDATE diskqueue_messages SET claim = ? WHERE state = ? AND claim = ? AND id IN ({marks})",
            [to, State.INFLIGHT, claim, *ids],
        )

    async def ack(self, ids: Sequence[int], *, claim: str | None = None) -> int:
        """INFLIGHT → DONE; returns how many rows it applied to (0: not in flight, or another claim)."""
        return await self._move(ids, State.INFLIGHT, State.DONE, claim=claim)

    async def nack(self, ids: Sequence[int], *, claim: str | None = None) -> int:
        """INFLIGHT → QUEUED (give back, keep order)."""
        count = await self._move(ids, State.INFLIGHT, State.QUEUED, claim=claim)
        return count

    async def drop(self, ids: Sequence[int], *, state: State = State.QUEUED) -> int:
        """QUEUED (or the given state) → DROPPED."""
        return await self._move(ids, state, State.DROPPED)

    async def drop_queued(self, address: str) -> int:
        """Drop every queued message of an address; returns how many."""
        return await self.db.execute(
            "UPDATE diskqueue_messages SET state = ?, finished_at = ? WHERE address = ? AND state = ?",
            (State.DROPPED, self.clock(), address, State.QUEUED),
        )

    async def requeue_inflight(self, address: str | None = None) -> int:
        """Recovery: every INFLIGHT message (of one address, or all) goes back to QUEUED."""
        sql = "UPDATE diskqueue_messages SET state = ?, claim = NULL WHERE state = ?"
        params: list[Any] = [State.QUEUED, State.INFLIGHT]
        if address is not None:
            sql += " AND address = ?"
            params.append(address)
        return await self.db.execute(sql, params)

    async def inflight(self, address: str) -> list[Message]:
        rows = await self.db.fetchall(
            "SELECT * FROM diskqueue_messages WHERE address = ? AND state = ? ORDER BY id",
            (address, State.INFLIGHT),
        )
        return [Message.from_row(r) for r in rows]

    async def queued(self, address: str, *, limit: int = 100) -> list[Message]:
        rows = await self.db.fetchall(
            "SELECT * FROM diskqueue_messages WHERE address = ? AND state = ? ORDER BY id LIMIT ?",
            (address, State.QUEUED, limit),
        )
        return [Message.from_row(r) for r in rows]

    async def get(self, message_id: int) -> Message | None:
        row = await self.db.fetchone("SELECT * FROM diskqueue_messages WHERE id = ?", (message_id,))
        return Message.from_row(row) if row else None

    async def depth(self, address: str | None = None) -> int:
        """How many messages wait (QUEUED), for one address or in all."""
        if address is None:
            row = await self.db.fetchone("SELECT count(*) FROM diskqueue_messages WHERE state = ?", (State.QUEUED,))
        else:
            row = await self.db.fetchone(
                "SELECT count(*) FROM diskqueue_messages WHERE address = ? AND state = ?", (address, State.QUEUED)
            )
        return int(row[0]) if row else 0

    async def addresses_with(self, *states: State) -> list[str]:
        """Addresses that have messages in any of ``states`` (default: QUEUED or INFLIGHT)."""
        wanted = states or (State.QUEUED, State.INFLIGHT)
        marks = ",".join("?" * len(wanted))
        rows = await self.db.fetchall(
            f"SELECT address, min(id) AS first FROM diskqueue_messages WHERE state IN ({marks}) "
            "GROUP BY address ORDER BY first",
            [int(s) for s in wanted],
        )
        return [r["address"] for r in rows]

    async def prune(self, *, before: float, limit: int = 500, keep_claims: Sequence[str] = ()) -> int:
        """Delete at most ``limit`` DONE/DROPPED rows finished before ``before`` (a ``self.clock()``),
        lowest id first, except rows under one of ``keep_claims``; returns how many. QUEUED and
        INFLIGHT rows are never touched.

        Their dedupe keys go with them, so keep ``before`` further back than any redelivery can
        come. One call is one statement: the caller bounds its transaction with ``limit``.
        """
        keep = sorted(set(keep_claims))
        spared = f" AND (claim IS NULL OR claim NOT IN ({','.join('?' * len(keep))}))" if keep else ""
        return await self.db.execute(
            "DELETE FROM diskqueue_messages WHERE id IN (SELECT id FROM diskqueue_messages "
            f"WHERE state IN (?, ?) AND finished_at < ?{spared} ORDER BY id LIMIT ?)",
            (State.DONE, State.DROPPED, before, *keep, limit),
        )
