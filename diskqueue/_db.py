"""One SQLite file, one writer connection, explicit transactions.

WAL with ``synchronous=FULL``: a commit is on disk (fsync'd) before it returns, so an
acknowledged message survives a power cut, not only a crash. Every statement goes through one
lock; ``transaction()`` holds it for the whole ``BEGIN IMMEDIATE … COMMIT`` and is re-entrant
for the task that opened it, so helpers can be composed into one atomic unit.

Statements run on the event loop's own thread: one takes tens of microseconds, while a hop to a
worker thread and back costs more than the statement itself and about a dozen happen per turn
(``docs/benchmarks.md``, benchmarks 1, 2 and 6). Two things can take long:

- **the fsync.** A ``COMMIT`` (or a write outside a transaction, which commits by itself) is the
  only statement that waits for the disk; a WAL checkpoint happens inside it. On a healthy disk
  it takes ~0.2 ms and runs on the loop like the rest: a commit on a thread holds the lock across
  a suspension, and the hop plus the contention it causes cost more (benchmark 9: with every
  commit on a thread, 1.3–1.8× the CPU per turn, and about half the ingest rate). When commits take
  more than ``slow_commit_s`` (5 ms) on average, or one takes ``slow_spike_s`` (20 ms), the disk
  is slow: commits run on the connection's one worker thread, while the loop goes on, for
  ``slow_hold_s`` (10 s); then one commit on the loop looks again. The lock stays held until
  the commit is done, so transactions stay serialized. (Benchmark 9, 50 ms per fsync, 16
  concurrent turns: with every commit on the loop, it stalled for up to 1.9 s.)
- **another process's lock** (an operator's ``sqlite3`` shell, a backup): the connection's
  ``busy_timeout`` is 0, and a statement that meets ``SQLITE_BUSY`` is retried on that worker
  thread with the real timeout.

What must follow a commit and never precede it (sending a reply written in the transaction)
is registered with ``after_commit()``: run, in order, once the outermost transaction has
committed and released the lock; dropped when it rolls back. Outside a transaction a write has
committed by itself, so the callback runs at once.

Reads that must not queue behind the writer (``/healthz``, the notebook's MCP gate) run inside
``committed()``: on a second, read-only connection that sees the last committed state, which WAL
lets read while the writer writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["Database", "DatabaseError"]

logger = logging.getLogger("diskqueue")

_owner: contextvars.ContextVar[tuple[int, asyncio.Task[Any] | None] | None] = contextvars.ContextVar(
    "diskqueue_tx_owner", default=None
)
_committed_reads: contextvars.ContextVar[int | None] = contextvars.ContextVar("diskqueue_committed", default=None)

DEFAULT_BUSY_TIMEOUT_MS = 10_000

T = TypeVar("T")


class DatabaseError(Exception):
    """The database could not be opened or failed its integrity check."""


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _begin(conn: sqlite3.Connection) -> sqlite3.Cursor:
    return conn.execute("BEGIN IMMEDIATE")


def _commit(conn: sqlite3.Connection) -> sqlite3.Cursor:
    return conn.execute("COMMIT")


def _reads_only(sql: str) -> bool:
    """A ``SELECT`` or a ``PRAGMA`` that sets nothing: outside a transaction it never commits."""
    verb = sql.lstrip()[:6].upper()
    return verb == "SELECT" or (verb == "PRAGMA" and "=" not in sql)


class Database:
    """A sqlite3 connection with the pragmas, a lock, and composable transactions."""

    # The disk is slow when commits on the loop take longer than slow_commit_s on average (a
    # running mean, so one hiccup of a shared disk does not count) or one takes slow_spike_s;
    # then commits run on the worker thread for slow_hold_s, and one on the loop looks again.
    slow_commit_s = 0.005
    slow_spike_s = 0.02
    slow_hold_s = 10.0

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None  # committed(): read-only, never locked
        self._lock = asyncio.Lock()
        self._thread: ThreadPoolExecutor | None = None  # the writer connection's one worker thread
        self.clock: Callable[[], float] = time.monotonic
        self._slow_until = -math.inf  # commits go to the thread until then
        self._slow = False  # the disk was found slow (logged on a change)
        self._commit_mean = 0.0  # the running mean of commits on the loop, seconds
        # after_commit(): the open transaction's callbacks, by key (one per key, in the order first
        # registered); run after its COMMIT, dropped on its ROLLBACK
        self._after: dict[Hashable, Callable[[], Awaitable[object]]] = {}

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
            reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0)
            reader.execute("PRAGMA query_only=ON")
        except sqlite3.Error as exc:
            conn.close()
            raise DatabaseError(f"cannot use {self.path}: {exc}") from exc
        reader.row_factory = sqlite3.Row
        self._conn, self._reader = conn, reader
        return self

    async def close(self) -> None:
        if self._reader is not None:  # first: the writer, closing last, checkpoints the WAL as before
            reader, self._reader = self._reader, None
            reader.close()
        if self._conn is not None:
            async with self._lock:
                conn, self._conn = self._conn, None
                conn.close()
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

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

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, fsync: bool = False) -> T:
        """Run ``fn`` on the connection; the caller holds ``self._lock``.

        A statement runs now, on the loop's thread; if another process holds the lock, it is
        retried on the worker thread with the busy timeout, so the loop never waits on a lock.
        ``fsync=True`` says it commits (a ``COMMIT``, a write outside a transaction): it waits
        for the disk, so while the disk is slow it runs on the worker thread instead."""
        conn = self.conn
        timeout = int(self._busy_timeout_ms)

        def patient() -> T:
            conn.execute(f"PRAGMA busy_timeout={timeout}")
            try:
                return fn(conn)
            finally:
                conn.execute("PRAGMA busy_timeout=0")

        def now_or_patient() -> T:
            try:
                return fn(conn)
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or timeout <= 0:
                    raise
            return patient()

        if fsync and self.clock() < self._slow_until:
            return await self._on_thread(now_or_patient)
        started = self.clock() if fsync else 0.0
        try:
            result = fn(conn)
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or timeout <= 0:
                raise
            return await self._on_thread(patient)
        if fsync:
            self._timed(self.clock() - started)
        return result

    def _timed(self, seconds: float) -> None:
        """A commit that ran on the loop took ``seconds``: is the disk slow?"""
        if self._slow:  # the look after a hold: afresh
            self._commit_mean = seconds
        else:
            self._commit_mean += (seconds - self._commit_mean) / 4
        slow = seconds > self.slow_spike_s or self._commit_mean > self.slow_commit_s
        if slow:
            self._slow_until = self.clock() + self.slow_hold_s
        if slow != self._slow:
            self._slow = slow
            if slow:
                logger.warning("slow_commit: commits take %.1f ms (the last %.1f ms): a slow disk, or large "
                               "writes; they run off the event loop for %g s, then one on it looks again",
                               self._commit_mean * 1000, seconds * 1000, self.slow_hold_s)
            else:
                logger.info("disk_fast_again: a commit took %.1f ms; commits run on the event loop",
                            seconds * 1000)

    async def _on_thread(self, job: Callable[[], T]) -> T:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite")
        future = asyncio.get_running_loop().run_in_executor(self._thread, job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The thread still uses the connection: keep the lock until it is done with it, even
            # when cancelled again meanwhile (asyncio.wait never cancels what it waits for).
            while not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([future])
            if not future.cancelled():
                future.exception()  # its outcome is the caller's to see in the state, not here
            raise

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the read-only connection, on the loop (a WAL read never waits for the disk's
        fsync nor for the writer); a rare ``SQLITE_BUSY`` (another process recovering the WAL) is
        retried every 10 ms up to the busy timeout."""
        if self._reader is None:
            raise RuntimeError("Database is not open")
        reader = self._reader
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._busy_timeout_ms / 1000
        while True:
            try:
                return fn(reader)
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or loop.time() >= deadline:
                    raise
            await asyncio.sleep(0.01)

    @asynccontextmanager
    async def committed(self) -> AsyncIterator[None]:
        """In this block, ``fetchall``/``fetchone`` outside a transaction read the last committed
        state on a second, read-only connection and never wait for the writer's lock — which a
        queue of transactions, each ending in an fsync, can hold for seconds on a slow disk.
        For readers that must answer in time (``/healthz``, the notebook's MCP gate); writes and
        transactions in the block are not affected."""
        token = _committed_reads.set(id(self))
        try:
            yield
        finally:
            _committed_reads.reset(token)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Database]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; rolls back on any exception, cancellation included.
        On a slow disk the ``COMMIT`` runs on the worker thread, the lock held until it is done.
        A nested block is part of the outermost one; after the outermost ``COMMIT`` (the lock
        released) the :meth:`after_commit` callbacks run, in order, in the committing task."""
        if self._in_transaction():
            yield self
            return
        async with self._lock:
            token = _owner.set((id(self), asyncio.current_task()))
            self._after = {}
            try:
                await self._run(_begin)
                try:
                    yield self
                except BaseException:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
                try:
                    await self._run(_commit, fsync=True)
                except BaseException:
                    # A COMMIT that failed (a full disk, an I/O error, a lock held past the
                    # timeout) can leave the transaction open: never let the next one run in it.
                    # (Cancelled while the thread committed: it finished, nothing is open.)
                    if self._conn is not None and self._conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self._conn.execute("ROLLBACK")
                    raise
                committed = list(self._after.values())
            finally:
                self._after = {}  # rolled back or committed: nothing of it is left to run
                _owner.reset(token)
        for callback in committed:
            await callback()

    async def after_commit(self, callback: Callable[[], Awaitable[object]], *, key: Hashable | None = None) -> None:
        """Run ``callback`` once what this task just wrote is committed, never before: inside a
        transaction, after the outermost one's ``COMMIT`` (dropped if it rolls back); outside
        one, at once (the write committed by itself). ``key``: one callback per key and
        transaction (the first one registered keeps its place)."""
        if not self._in_transaction():
            await callback()
            return
        self._after.setdefault(object() if key is None else key, callback)

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
            return await self._run(run, fsync=True)  # alone, a write commits: an fsync

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        batch = list(rows)
        alone = not self._in_transaction()
        async with self._locked():
            await self._run(lambda c: c.executemany(sql, batch), fsync=alone)

    async def fetchall(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        def run(c: sqlite3.Connection) -> list[sqlite3.Row]:
            return c.execute(sql, params).fetchall()

        if self._in_transaction():
            return await self._run(run)
        reads_only = _reads_only(sql)
        if reads_only and _committed_reads.get() == id(self):
            return await self._read(run)
        async with self._lock:
            return await self._run(run, fsync=not reads_only)  # INSERT … RETURNING alone commits

    async def fetchone(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def executescript(self, script: str) -> None:
        async with self._locked():
            await self._run(lambda c: c.executescript(script), fsync=True)  # it commits

    async def integrity_check(self) -> list[str]:
        """``PRAGMA quick_check``: an empty list means the file is sound."""
        rows = await self.fetchall("PRAGMA quick_check")
        problems = [str(r[0]) for r in rows]
        return [] if problems == ["ok"] else problems
