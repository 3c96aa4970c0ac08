"""F2: only a corrupt state database is quarantined; a locked one is waited on, then refused
loudly, and nothing is moved."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bridge.storage.state import StateUnavailable, corrupt, open_state


async def _fresh(path: Path) -> None:
    state = await open_state(path)
    await state.db.close()


async def test_a_locked_database_is_not_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "iva.sqlite3"
    await _fresh(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # an operator's shell holding the write lock
    try:
        with pytest.raises(StateUnavailable):
            await open_state(path, attempts=2, busy_timeout_ms=100)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert sorted(p.name for p in tmp_path.iterdir() if "quarantined" in p.name) == []
    state = await open_state(path)  # once the lock is gone, the same file, as it was
    try:
        assert state.quarantined is None
    finally:
        await state.db.close()


async def test_a_corrupt_database_is_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "iva.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    state = await open_state(path, attempts=1)
    try:
        assert state.quarantined is not None and state.quarantined.exists()
    finally:
        await state.db.close()


def test_what_counts_as_corrupt() -> None:
    def error(code: int, text: str) -> sqlite3.DatabaseError:
        exc = sqlite3.DatabaseError(text)
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        return exc

    assert corrupt(error(sqlite3.SQLITE_NOTADB, "file is not a database"))
    assert corrupt(error(sqlite3.SQLITE_CORRUPT, "database disk image is malformed"))
    for code, text in ((sqlite3.SQLITE_BUSY, "database is locked"), (sqlite3.SQLITE_READONLY, "readonly"),
                       (sqlite3.SQLITE_FULL, "database or disk is full"), (sqlite3.SQLITE_IOERR, "disk I/O error"),
                       (sqlite3.SQLITE_CANTOPEN, "unable to open database file")):
        assert not corrupt(error(code, text))
