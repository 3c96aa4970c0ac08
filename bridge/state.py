"""Opening the state database, checked (R5): a file that fails the check is moved aside, never
deleted, and a fresh one takes its place so the service keeps running."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from diskqueue import Database, DatabaseError, DiskQueue

from . import log
from .store import Store

__all__ = ["OpenedState", "open_state"]

logger = log.get("bridge.state")


@dataclass(frozen=True, slots=True)
class OpenedState:
    db: Database
    queue: DiskQueue
    store: Store
    quarantined: Path | None  # where a bad file was moved, if one was
    problem: str | None


async def _open(path: Path) -> tuple[Database, DiskQueue, Store]:
    db = await Database(path).open()
    try:
        problems = await db.integrity_check()
        if problems:
            raise DatabaseError("; ".join(problems[:3]))
        queue, store = DiskQueue(db), Store(db)
        await queue.migrate()
        await store.migrate()
    except BaseException:
        await db.close()
        raise
    return db, queue, store


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


async def open_state(path: Path) -> OpenedState:
    try:
        db, queue, store = await _open(path)
        return OpenedState(db, queue, store, None, None)
    except (DatabaseError, sqlite3.DatabaseError) as exc:
        problem = str(exc)
    target = _quarantine(path)
    logger.error("state_database_quarantined", path=str(path), moved_to=str(target), problem=problem)
    db, queue, store = await _open(path)
    return OpenedState(db, queue, store, target, problem)
