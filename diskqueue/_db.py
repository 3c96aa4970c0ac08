"""One SQLite file, one writer connection, explicit transactions.

WAL with ``synchronous=FULL``: a commit is on disk (fsync'd) before it returns, so an
acknowledged message survives a power cut, not only a crash. Every statement goes through one
lock; ``transaction()`` holds it for the whole ``BEGIN IMMEDIATE … COMMIT`` and is re-entrant
for the task that opened it, so helpers can be composed into one atomic unit.

Statements run on the event loop's own thread. A statement here takes tens of microseconds and
a commit one fsync (~0.2 ms on this project's disks), while a hop to a worker thread and back
costs more than the statement itself and about a dozen happen per turn (``docs/benchmarks.md``,
benchmarks 1, 2 and 6). The one thing that could block the loop for long is waiting on a lock
held by another process (an operator's ``sqlite3`` shell, a backup): the connection's
``busy_timeout`` is therefore 0, and a statement that meets ``SQLITE_BUSY`` is retried on a
worker thread with the real timeout, so the loop never waits on a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["Database", "DatabaseError"]

_owner: contextvars.ContextVar[tuple[int, asyncio.Task[Any] | None] | None] = contextvars.ContextVar(
    "diskqueue_tx_owner", default=None
)

DEFAULT_BUSY_TIMEOUT_MS = 10_000

T = TypeVar("T")


class DatabaseError(Exception):
    """The database could not be opened or failed its integrity check."""


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


class Database:
    """A sqlite3 connection with the pragmas, a lock, and composable transactions."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._waiter: ThreadPoolExecutor | None = None

    async def open(self) -> Database:
        if self._conn is not None:
            raise RuntimeError("Database is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise DatabaseError(f"cannot open {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            # Opening may itself wait on another process's lock: do it with the real timeout.
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            row = conn.execute("PRAGMA journal_mode").fetchone()
            if row is None or str(row[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=0")
        except sqlite3.Error as exc:
            conn.close()
            raise DatabaseError(f"cannot use {self.path}: {exc}") from exc
        self._conn = conn
        return self

    async def close(self) -> None:
        if self._conn is not None:
            async with self._lock:
                conn, self._conn = self._conn, None
                conn.close()
        if self._waiter is not None:
            self._waiter.shutdown(wait=False)
            self._waiter = None

    async def __aenter__(self) -> Database:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("Database is not open")
        return self._conn

    def _in_transaction(self) -> bool:
        owner = _owner.get()
        return owner is not None and owner[0] == id(self) and owner[1] is asyncio.current_task()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the connection now; if another process holds the lock, wait for it on a
        worker thread (with the busy timeout) so the event loop never blocks on it. The caller
        holds ``self._lock``."""
        conn = self.conn
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or self._busy_timeout_ms <= 0:
                raise
        if self._waiter is None:
            self._waiter = ThreadPoolExecutor(1, thread_name_prefix="sqlite-wait")
        timeout = int(self._busy_timeout_ms)

        def patient() -> T:
            conn.execute(f"PRAGMA busy_timeout={timeout}")
            try:
                return fn(conn)
            finally:
                conn.execute("PRAGMA busy_timeout=0")

        future = asyncio.get_running_loop().run_in_executor(self._waiter, patient)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The thread still uses the connection: keep the lock until it is done with it.
            with contextlib.suppress(BaseException):
                await future
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; rolls back on any exception, cancellation included."""
        if self._in_transaction():
            yield self
            return
        async with self._lock:
            token = _owner.set((id(self), asyncio.current_task()))
            try:
                await self._run(lambda c: c.execute("BEGIN IMMEDIATE"))
                try:
                    yield self
                except BaseException:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
                await self._run(lambda c: c.execute("COMMIT"))
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
        """Run one statement; returns the number of rows it changed."""
        def run(c: sqlite3.Connection) -> int:
            return c.execute(sql, params).rowcount

        if self._in_transaction():  # the hot path, without a context manager's overhead
            return await self._run(run)
        async with self._lock:
            return await self._run(run)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = list(rows)
        async with self._locked():
            await self._run(lambda c: c.executemany(sql, batch))

    async def fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        def run(c: sqlite3.Connection) -> list[sqlite3.Row]:
            return c.execute(sql, params).fetchall()

        if self._in_transaction():
            return await self._run(run)
        async with self._lock:
            return await self._run(run)

    async def fetchone(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def executescript(self, script: str) -> None:
        async with self._locked():
            await self._run(lambda c: c.executescript(script))

    async def integrity_check(self) -> list[str]:
        """``PRAGMA quick_check``: an empty list means the file is sound."""
        rows = await self.fetchall("PRAGMA quick_check")
        problems = [str(r[0]) for r in rows]
        return [] if problems == ["ok"] else problems
