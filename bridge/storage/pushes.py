"""The SQL of the assistant writing first: pushed turns (queue rows of kind ``pushed``), the
notifications' outbox rows, the ``push_told`` mark and the ``reminders`` table (schema step 8 in
:mod:`bridge.storage.schema`). Statements only; what they mean is in :mod:`.turns` and :mod:`.reminders`."""

from __future__ import annotations

import sqlite3
from typing import Any

from diskqueue import Database, State

__all__ = ["PushStore"]

_REMINDERS = ("SELECT r.*, coalesce(c.blocked, 1) AS paused FROM reminders r "
              "LEFT JOIN chats c ON c.address = r.address")


class PushStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- pushed turns and notifications -----------------------------------------------------

    async def queue_id(self, dedupe_key: str) -> int | None:
        row = await self.db.fetchone("SELECT id FROM diskqueue_messages WHERE dedupe_key = ?", (dedupe_key,))
        return None if row is None else int(row["id"])

    async def queue_row(self, row_id: int) -> sqlite3.Row | None:
        return await self.db.fetchone(
            "SELECT id, address, payload, state, enqueued_at, claimed_at, finished_at FROM diskqueue_messages "
            "WHERE id = ?", (row_id,))

    async def queued_besides(self, address: str, kind: str) -> int:
        """The address's queued rows whose payload kind is not ``kind``."""
        row = await self.db.fetchone(
            "SELECT count(*) FROM diskqueue_messages WHERE address = ? AND state = ? AND "
            "coalesce(json_extract(payload, '$.kind'), 'message') != ?", (address, int(State.QUEUED), kind))
        return int(row[0]) if row else 0

    async def outbox_id(self, key: str) -> int | None:
        row = await self.db.fetchone("SELECT id FROM outbox WHERE key = ?", (key,))
        return None if row is None else int(row["id"])

    async def sent_since_told(self, address: str, prefix: str, limit: int) -> list[sqlite3.Row]:
        """The newest ``limit`` sent outbox rows of the address keyed ``prefix…`` after its told
        mark, newest first.

        Asked before every turn (W5), so it reads a range of the ``key`` index, the keys that
        begin with ``prefix`` (the ``+`` keeps SQLite off the ``(address, state, id)`` index,
        which would walk every answer the chat was ever sent that retention kept)."""
        after = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string past every ``prefix…``
        return await self.db.fetchall(
            "SELECT id, text, sent_at FROM outbox WHERE key >= ? AND key < ? AND +address = ? AND +state = 'sent' "
            "AND +id > coalesce((SELECT upto FROM push_told WHERE address = ?), 0) ORDER BY id DESC LIMIT ?",
            (prefix, after, address, address, limit))

    async def mark_told(self, address: str, upto: int) -> None:
        await self.db.execute("INSERT INTO push_told (address, upto) VALUES (?, ?) ON CONFLICT (address) DO UPDATE "
                              "SET upto = max(upto, excluded.upto)", (address, upto))

    # -- reminders ----------------------------------------------------------------------------

    async def reminders(self, address: str) -> list[sqlite3.Row]:
        return await self.db.fetchall(f"{_REMINDERS} WHERE r.address = ? AND r.state = 'active' "
                                      "ORDER BY r.next_at, r.created_at", (address,))

    async def reminder(self, address: str, reminder_id: str) -> sqlite3.Row | None:
        return await self.db.fetchone(f"{_REMINDERS} WHERE r.address = ? AND r.id = ?", (address, reminder_id))

    async def active_count(self, address: str) -> int:
        row = await self.db.fetchone("SELECT count(*) FROM reminders WHERE address = ? AND state = 'active'",
                                     (address,))
        return int(row[0]) if row else 0

    async def add_reminder(self, **fields: Any) -> None:
        columns = ("id", "address", "text", "at", "cron", "tz", "next_at", "author", "set_in", "created_at",
                   "updated_at")
        await self.db.execute(f"INSERT INTO reminders ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                              tuple(fields[c] for c in columns))

    async def assistants(self, address: str) -> list[sqlite3.Row]:
        """The chat's active reminders the assistant set (S9: what it may set on its own is bounded)."""
        return await self.db.fetchall("SELECT id, cron FROM reminders WHERE address = ? AND state = 'active' "
                                      "AND author = 'assistant'", (address,))

    async def cancel_reminder(self, address: str, reminder_id: str, now: float) -> int:
        return await self.db.execute(
            "UPDATE reminders SET state = 'cancelled', next_at = NULL, updated_at = ? "
            "WHERE address = ? AND id = ? AND state = 'active'", (now, address, reminder_id))

    async def due_reminders(self, now: float, limit: int) -> list[sqlite3.Row]:
        """Active reminders due at ``now`` whose chat is not blocked, the earliest first."""
        return await self.db.fetchall(
            f"{_REMINDERS} WHERE r.state = 'active' AND r.next_at <= ? AND coalesce(c.blocked, 1) = 0 "
            "ORDER BY r.next_at LIMIT ?", (now, limit))

    async def reminder_fired(self, reminder_id: str, *, last_fired: float, next_at: float | None, now: float) -> None:
        """The fire recorded: the next instant (None: a one-time reminder is done)."""
        await self.db.execute(
            "UPDATE reminders SET state = CASE WHEN ? IS NULL THEN 'done' ELSE state END, next_at = ?, "
            "last_fired = ?, updated_at = ? WHERE id = ?", (next_at, next_at, last_fired, now, reminder_id))

    async def recurring(self) -> list[sqlite3.Row]:
        """Every active cron reminder (paused ones too): their next instants checked after a
        correction of the clock (F12)."""
        return await self.db.fetchall(f"{_REMINDERS} WHERE r.state = 'active' AND r.cron IS NOT NULL")

    async def reminder_moved(self, reminder_id: str, *, next_at: float, now: float) -> None:
        """An active reminder's next instant, recomputed (F12)."""
        await self.db.execute("UPDATE reminders SET next_at = ?, updated_at = ? WHERE id = ? AND state = 'active'",
                              (next_at, now, reminder_id))

    async def reminder_broken(self, reminder_id: str, now: float) -> None:
        """A reminder that cannot fire any more (its zone gone): ``failed``, no next instant."""
        await self.db.execute("UPDATE reminders SET state = 'failed', next_at = NULL, updated_at = ? WHERE id = ?",
                              (now, reminder_id))

    async def next_due(self) -> float | None:
        row = await self.db.fetchone(
            "SELECT min(r.next_at) FROM reminders r JOIN chats c ON c.address = r.address "
            "WHERE r.state = 'active' AND c.blocked = 0")
        return None if row is None or row[0] is None else float(row[0])

    async def prune_reminders(self, *, before: float, limit: int) -> int:
        """Delete at most ``limit`` done or cancelled reminders finished before ``before`` (F7)."""
        return await self.db.execute(
            "DELETE FROM reminders WHERE id IN (SELECT id FROM reminders WHERE state != 'active' AND updated_at < ? "
            "ORDER BY updated_at LIMIT ?)", (before, limit))
