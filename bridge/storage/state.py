"""Opening the state database, checked (R5, F2).

Only a file that is corrupt — it fails ``PRAGMA quick_check``, or SQLite says it is not a
database or is malformed — is moved aside (quarantined, never deleted) and a fresh one takes its
place, so the service keeps running. A database that is locked by another process, read-only,
on a full or failing disk, or not permitted is not corrupt: the bridge waits and tries again a
few times, then fails loudly, moving nothing (a live service must never start over on an empty
store because an operator's ``sqlite3`` shell held a lock).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from diskqueue import Database, DatabaseError, DiskQueue

from .. import backoff, log
from ..clock import CLOCK
from ..errors import BridgeError
from .store import Store

__all__ = ["OpenedState", "StateCorrupt", "StateUnavailable", "corrupt", "open_state"]

logger = log.get(__name__)

OPEN_ATTEMPTS = 5
_CORRUPT = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class StateUnavailable(BridgeError):
    """The state database could not be used (locked, read-only, full, not permitted), and is
    not corrupt: nothing was moved; the operator must look. ``quarantined``: a corrupt file was
    moved there and the fresh one could not be made (a full disk) — the owners must hear it."""

    def __init__(self, message: str, *, quarantined: Path | None = None) -> None:
        super().__init__(message)
        self.quarantined = quarantined


class StateCorrupt(BridgeError):
    """SQLite found the state database corrupt while the bridge ran. Nothing more can be made
    durable: the bridge stops (exit 5) without confirming what it could not store, and the
    start-up check moves the file aside on the restart (Telegram redelivers what was lost)."""


class _Corrupt(DatabaseError):
    pass


@dataclass(frozen=True, slots=True)
class OpenedState:
    db: Database
    queue: DiskQueue
    store: Store
    quarantined: Path | None  # where a bad file was moved, if one was
    problem: str | None


async def _open(path: Path, busy_timeout_ms: int) -> tuple[Database, DiskQueue, Store]:
    db = await Database(path, busy_timeout_ms=busy_timeout_ms).open()
    try:
        problems = await db.integrity_check()
        if problems:
            raise _Corrupt("; ".join(problems[:3]))
        queue, store = DiskQueue(db, clock=CLOCK.now), Store(db)  # F9: stamps a clock step does not move
        await queue.migrate()
        await store.migrate()
    except BaseException:
        await db.close()
        raise
    return db, queue, store


def corrupt(exc: BaseException) -> bool:
    """Whether an error opening the database says the file itself is bad (not the lock, the
    disk or the permissions)."""
    if isinstance(exc, _Corrupt):
        return True
    for error in (exc, exc.__cause__):
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None:
            return int(code) & 0xFF in _CORRUPT
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def _quarantine(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    target = path.with_name(f"{path.name}.quarantined-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.quarantined-{stamp}-{n}")
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.exists():
            part.rename(Path(f"{target}{suffix}"))
    return target


async def open_state(path: Path, *, attempts: int = OPEN_ATTEMPTS,
                     busy_timeout_ms: int = 10_000) -> OpenedState:
    """The database at ``path``, checked; a corrupt one quarantined; anything else retried
    ``attempts`` times and then :class:`StateUnavailable`."""
    for attempt in range(1, attempts + 1):
        try:
            db, queue, store = await _open(path, busy_timeout_ms)
            return OpenedState(db, queue, store, None, None)
        except (DatabaseError, sqlite3.DatabaseError) as exc:
            if corrupt(exc):
                problem = str(exc)
                break
            if attempt == attempts:
                logger.error("state_database_unavailable", path=str(path), error=str(exc), attempts=attempts)
                raise StateUnavailable(f"{path}: {exc}") from exc
            wait = backoff.STARTUP.delay(attempt)
            logger.warning("state_database_busy", path=str(path), error=str(exc), wait=round(wait, 1))
            await asyncio.sleep(wait)
    target = _quarantine(path)
    logger.error("state_database_quarantined", path=str(path), moved_to=str(target), problem=problem)
    try:
        db, queue, store = await _open(path, busy_timeout_ms)
    except (DatabaseError, sqlite3.DatabaseError) as exc:
        # The file is aside, and the disk takes no fresh one: the next start finds no file and
        # quarantines nothing, so this start is the one that can tell the owners (app.py).
        logger.error("state_database_unavailable", path=str(path), error=str(exc), quarantined=str(target))
        raise StateUnavailable(f"{path}: {exc}", quarantined=target) from exc
    return OpenedState(db, queue, store, target, problem)
