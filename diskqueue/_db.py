"""One SQLite file, one writer connection, explicit transactions.

WAL with ``synchronous=FULL``: a commit is on disk (fsync'd) before it returns, so an
acknowledged message survives a power cut, not only a crash. Every statement goes through one
lock; ``transaction()`` holds it for the whole ``BEGIN IMMEDIATE … COMMIT`` and is re-entrant
for the task that opened it, so helpers can be composed into one atomic unit.
"""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

__all__ = ["Database", "DatabaseError"]

_owner: contextvars.ContextVar[tuple[int, asyncio.Task[Any] | None] | None] = contextvars.ContextVar(
    "diskqueue_tx_owner", default=None
)

DEFAULT_BUSY_TIMEOUT_MS = 10_000


class DatabaseError(Exception):
    """The database could not be opened or failed its integrity check."""


class Database:
    """An aiosqlite connection with the pragmas, a lock, and composable transactions."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> Database:
        if self._conn is not None:
            raise RuntimeError("Database is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = await aiosqlite.connect(self.path, isolation_level=None)
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            await conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            row = await (await conn.execute("PRAGMA journal_mode")).fetchone()
            if row is None or str(row[0]).lower() != "wal":
                await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=FULL")
            await conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            await conn.close()
            raise DatabaseError(f"cannot use {self.path}: {exc}") from exc
        self._conn = conn
        return self

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def __aenter__(self) -> Database:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def conn(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError("Database is not open")
        return self._conn

    def _in_transaction(self) -> bool:
        owner = _owner.get()
        return owner is not None and owner[0] == id(self) and owner[1] is asyncio.current_task()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; rolls back on any exception, cancellation included."""
        if self._in_transaction():
            yield self
            return
        async with self._lock:
            token = _owner.set((id(self), asyncio.current_task()))
            try:
                await self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self
                except BaseException:
                    await asyncio.shield(self.conn.execute("ROLLBACK"))
                    raise
                # The commit is shielded: once the caller decided, a cancellation must not
                # leave it half-done.
                await asyncio.shield(self.conn.execute("COMMIT"))
            finally:
                _owner.reset(token)

    @asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        if self._in_transaction():
            yield
        else:
            async with self._lock:
                yield

    async def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one statement; returns the number of rows it changed (one trip to the thread)."""
        async with self._locked():
            cursor = await self.conn.execute(sql, params)
            return cursor.rowcount  # the cursor holds nothing more; closing it would cost a trip

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        async with self._locked():
            await self.conn.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        """Execute and fetch in one trip to the connection's thread."""
        async with self._locked():
            return list(await self.conn.execute_fetchall(sql, params))

    async def fetchone(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def executescript(self, script: str) -> None:
        async with self._locked():
            await self.conn.executescript(script)

    async def integrity_check(self) -> list[str]:
        """``PRAGMA quick_check``: an empty list means the file is sound."""
        rows = await self.fetchall("PRAGMA quick_check")
        problems = [str(r[0]) for r in rows]
        return [] if problems == ["ok"] else problems
