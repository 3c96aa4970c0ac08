"""The people tables (P1-P4, S7): who paired or was invited (beside the environment's ids), the
pairing and invitation codes (only their SHA-256), the wrong guesses per person, and the few
facts kept beside them (``people_meta``: the bot's username, the clock's anchor). The functions
at the end are ``iva status`` / ``iva check``'s, on their own short connection beside a running
daemon."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from diskqueue import Database

from .schema import SCHEMA_VERSION

__all__ = ["LiveCode", "Misses", "PeopleStore", "PersonRecord", "mint_pairing_code", "owners_of", "people_meta"]


@dataclass(frozen=True, slots=True)
class PersonRecord:
    """A person the database knows (paired or invited), not the environment's."""

    user_id: int
    role: str  # "owner" | "allowed"
    name: str
    added_by: int | None
    added_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> PersonRecord:
        return cls(user_id=int(row["user_id"]), role=row["role"], name=row["name"], added_by=row["added_by"],
                   added_at=row["added_at"])


@dataclass(frozen=True, slots=True)
class LiveCode:
    """A pairing or invitation code not used and not expired: its digest, its kind (the role it
    gives) and who made it."""

    digest: str
    kind: str
    created_by: int | None


@dataclass(frozen=True, slots=True)
class Misses:
    """A person's wrong codes: how many since ``first_at``, and until when their codes are ignored."""

    user_id: int
    misses: int
    first_at: float
    locked_until: float | None


class PeopleStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def person(self, user_id: int) -> PersonRecord | None:
        row = await self.db.fetchone("SELECT * FROM people WHERE user_id = ?", (user_id,))
        return None if row is None else PersonRecord.from_row(row)

    async def people(self, role: str | None = None) -> list[PersonRecord]:
        """The people of the database (of one role), in the order they came."""
        if role is None:
            rows = await self.db.fetchall("SELECT * FROM people ORDER BY added_at, user_id")
        else:
            rows = await self.db.fetchall("SELECT * FROM people WHERE role = ? ORDER BY added_at, user_id", (role,))
        return [PersonRecord.from_row(r) for r in rows]

    async def add_person(self, user_id: int, role: str, name: str, added_by: int | None, at: float) -> None:
        await self.db.execute(
            "INSERT INTO people (user_id, role, name, added_by, added_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (user_id) DO UPDATE SET role = excluded.role, name = excluded.name",
            (user_id, role, name, added_by, at))

    async def remove_person(self, user_id: int) -> int:
        return await self.db.execute("DELETE FROM people WHERE user_id = ?", (user_id,))

    async def add_code(self, code_digest: str, kind: str, created_by: int | None, at: float, expires: float) -> None:
        await self.db.execute(
            "INSERT INTO pairing_codes (digest, kind, created_by, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
            (code_digest, kind, created_by, at, expires))

    async def live_codes(self, now: float) -> list[LiveCode]:
        """Codes not used and not expired at ``now``."""
        rows = await self.db.fetchall(
            "SELECT digest, kind, created_by FROM pairing_codes WHERE used_by IS NULL AND expires_at > ?", (now,))
        return [LiveCode(str(r["digest"]), str(r["kind"]), None if r["created_by"] is None else int(r["created_by"]))
                for r in rows]

    async def use_code(self, code_digest: str, user_id: int, at: float) -> None:
        await self.db.execute("UPDATE pairing_codes SET used_by = ?, used_at = ? WHERE digest = ?",
                              (user_id, at, code_digest))

    async def drop_unused_codes(self, kind: str) -> None:
        await self.db.execute("DELETE FROM pairing_codes WHERE kind = ? AND used_by IS NULL", (kind,))

    async def clock_anchor(self) -> str | None:
        """The last process's clock anchor (bridge/clock.py), kept beside the people's meta keys."""
        row = await self.db.fetchone("SELECT value FROM people_meta WHERE key = 'clock_anchor'")
        return None if row is None else str(row["value"])

    async def set_people_meta(self, key: str, value: str) -> None:
        await self.db.execute("INSERT INTO people_meta (key, value) VALUES (?, ?) "
                              "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    async def pairing_misses(self, user_id: int) -> Misses | None:
        row = await self.db.fetchone("SELECT * FROM pairing_misses WHERE user_id = ?", (user_id,))
        return None if row is None else Misses(int(row["user_id"]), int(row["misses"]), float(row["first_at"]),
                                               row["locked_until"])

    async def record_misses(self, user_id: int, misses: int, first_at: float, locked_until: float | None) -> None:
        await self.db.execute(
            "INSERT INTO pairing_misses (user_id, misses, first_at, locked_until) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (user_id) DO UPDATE SET misses = excluded.misses, first_at = excluded.first_at, "
            "locked_until = excluded.locked_until", (user_id, misses, first_at, locked_until))

    async def clear_misses(self, user_id: int) -> None:
        await self.db.execute("DELETE FROM pairing_misses WHERE user_id = ?", (user_id,))



def mint_pairing_code(path: Path, code_digest: str, *, now: float, seconds: float) -> str:
    """``iva status`` / ``iva check`` beside a running daemon (P1-P4, S7): an owner pairing code's
    digest written into the state database at ``path`` in one short write transaction, when the
    bot has no owner. Returns "minted", "owned" (an owner, or a daemon that never said it has
    none: no code), or "schema" (not this Iva's schema yet). Raises :class:`sqlite3.Error`."""
    conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                return "schema"
            meta = {r["key"]: r["value"] for r in conn.execute("SELECT key, value FROM people_meta")}
            owned = conn.execute("SELECT 1 FROM people WHERE role = 'owner'").fetchone()
            if owned is not None or meta.get("env_owners") != "0":
                return "owned"
            conn.execute("INSERT INTO pairing_codes (digest, kind, created_by, created_at, expires_at) "
                         "VALUES (?, 'owner', NULL, ?, ?)", (code_digest, now, now + seconds))
            conn.execute("COMMIT")
            return "minted"
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()



def people_meta(path: Path) -> dict[str, str]:
    """What the daemon wrote down for ``iva status`` (the bot's username), read-only."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)
    try:
        return {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM people_meta")}
    finally:
        conn.close()



def owners_of(quarantined: Path) -> set[int]:
    """The paired owners a quarantined state file still names, if it can be read at all (best
    effort: it failed its check; R5 tells them too when no fresh store can be made)."""
    try:
        conn = sqlite3.connect(f"{quarantined.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            rows = conn.execute("SELECT user_id FROM people WHERE role = 'owner'").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return set()
    return {int(r[0]) for r in rows if isinstance(r[0], int)}

