"""What ``iva status`` and the health checks read, and the messages given up on (F6).

:func:`read_status` and :func:`clear_dead` open their own short connection beside a running
daemon (read-only for the report); :class:`StatusStore` is the daemon's side: the health
figures, and the dead messages it buries."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskqueue import Database, Message

from .schema import beside_daemon

__all__ = ["StatusStore", "clear_dead", "read_status"]


class StatusStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def health(self, *, overdue_before: float) -> tuple[int, float | None]:
        """(busy chats without progress since ``overdue_before`` and not waiting on the person,
        the creation time of the oldest reply still pending)."""
        overdue = await self.db.fetchone(
            "SELECT count(*) FROM chats WHERE status = 'busy' AND waiting_input = 0 AND progress_at < ?",
            (overdue_before,),
        )
        oldest = await self.db.fetchone("SELECT min(created_at) FROM outbox WHERE state = 'pending'")
        return (int(overdue[0]) if overdue else 0), (float(oldest[0]) if oldest and oldest[0] is not None else None)

    async def bury(self, address: str, messages: Sequence[Message], reason: str) -> None:
        """Messages given up on (F6), kept to be listed and cleared by ``iva status``."""
        now = time.time()
        for m in messages:
            await self.db.execute(
                "INSERT INTO dead_messages (id, address, payload, attempts, reason, enqueued_at, died_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (m.id, address, json.dumps(m.payload, ensure_ascii=False), m.attempts, reason[:200], m.enqueued_at,
                 now))

    async def dead_count(self) -> int:
        row = await self.db.fetchone("SELECT count(*) FROM dead_messages")
        return int(row[0]) if row else 0


def clear_dead(path: Path) -> int:
    """``iva status --clear-dead``: the given-up messages forgotten (and their warning with them),
    in one short write transaction beside a running daemon. Returns how many. Raises
    :class:`sqlite3.Error`, or :class:`SchemaMismatch` for another Iva's schema."""
    with beside_daemon(path, write=True) as conn:
        return int(conn.execute("DELETE FROM dead_messages").rowcount)


def read_status(path: Path, *, now: float | None = None) -> dict[str, Any]:
    """What ``iva status`` shows, read from the state database at ``path`` without ever writing
    or locking it: a read-only connection (``mode=ro``), one read transaction (a consistent
    snapshot under WAL, taken while the daemon writes), no migration. Raises
    :class:`sqlite3.Error` (e.g. ``unable to open database file``) for the caller to name.

    Per chat that has anything to show (busy, messages waiting, replies pending, or a recorded
    error): its state, the queue and outbox counts, and the last error the store keeps —
    blocked (and why), the last reply given up on, failed compactions, a failed notebook rebuild."""
    now = time.time() if now is None else now
    snap = _snapshot(path)

    def age(at: float | None) -> float | None:
        return None if at is None else round(max(0.0, now - at), 1)

    rows = [row for chat in snap.chats if (row := _chat_row(chat, snap, age)) is not None]
    upcoming = [r["next_at"] for r in snap.reminders if not r["paused"] and r["next_at"] is not None]
    return {
        "dead": [_dead_message(d) for d in snap.dead],
        "reminders": {
            "active": len(snap.reminders), "next_at": min(upcoming) if upcoming else None,
            "due": [_reminder(r, age) for r in snap.reminders if not r["paused"] and r["next_at"] is not None
                    and r["next_at"] <= now],
            "paused": [_reminder(r, age) for r in snap.reminders if r["paused"]],
        },
        "database": str(path), "at": now, "chats_known": len(snap.chats),
        "busy_chats": sum(r["status"] == "busy" for r in rows),
        "queued": sum(r["queued"] for r in rows), "replies_pending": sum(r["replies_pending"] for r in rows),
        "chats": rows,
    }


@dataclass(frozen=True, slots=True)
class _Snapshot:
    queue: dict[str, tuple[int, int]]
    outbox: dict[str, sqlite3.Row]
    chats: list[sqlite3.Row]
    dead: list[sqlite3.Row]
    reminders: list[sqlite3.Row]


def _snapshot(path: Path) -> _Snapshot:
    """One read transaction over what ``iva status`` shows."""
    with beside_daemon(path) as conn:  # a read snapshot, never a write lock
        queue = {r["address"]: (r["queued"], r["inflight"]) for r in conn.execute(
            "SELECT address, sum(state = 0) AS queued, sum(state = 1) AS inflight FROM diskqueue_messages "
            "WHERE state IN (0, 1) GROUP BY address")}
        outbox = {r["address"]: r for r in conn.execute(
            "SELECT address, sum(state = 'pending') AS pending, min(CASE WHEN state = 'pending' THEN created_at END) "
            "AS oldest_pending, max(CASE WHEN state = 'failed' THEN coalesce(sent_at, created_at) END) AS last_failed "
            "FROM outbox WHERE state IN ('pending', 'failed') GROUP BY address")}
        chats = conn.execute("SELECT * FROM chats ORDER BY address").fetchall()
        dead = conn.execute("SELECT * FROM dead_messages ORDER BY died_at, id").fetchall()
        # W7: the reminders due and not fired (is the daemon running?) and those paused by a
        # blocked or gone chat; how many are active, and the next instant.
        reminders = conn.execute(
            "SELECT r.id, r.address, r.text, r.next_at, coalesce(c.blocked, 1) AS paused FROM reminders r "
            "LEFT JOIN chats c ON c.address = r.address WHERE r.state = 'active' ORDER BY r.next_at").fetchall()
    return _Snapshot(queue, outbox, chats, dead, reminders)


def _chat_row(chat: sqlite3.Row, snap: _Snapshot, age: Callable[[float | None], float | None]) -> dict[str, Any] | None:
    """A chat's line of ``iva status``; None when it has nothing to show."""
    address = chat["address"]
    queued, inflight = snap.queue.get(address, (0, 0))
    box = snap.outbox.get(address)
    pending = int(box["pending"]) if box is not None else 0
    errors: list[str] = []
    if chat["blocked"]:
        errors.append(f"blocked: {chat['blocked_reason'] or 'no reason recorded'}")
    if box is not None and box["last_failed"] is not None:
        errors.append(f"a reply was given up on {age(box['last_failed']):.0f}s ago")
    if chat["compact_failures"]:
        errors.append(f"compaction failed {chat['compact_failures']}x in a row")
    if chat["notes_rebuild_failed"] is not None and chat["notes_rebuild_failed"] >= 0:  # < 0: a restore's hold
        errors.append("the notebook rebuild failed")
    if (buried := sum(d["address"] == address for d in snap.dead)):
        errors.append(f"{buried} message(s) given up on (iva status --dead; --clear-dead forgets them)")
    busy = chat["status"] == "busy"
    if not (busy or queued or inflight or pending or errors):
        return None
    return {
        "address": address, "status": chat["status"], "kind": chat["kind"] if busy else None,
        "origin": chat["origin"] if busy else None, "busy_for_s": age(chat["busy_since"]) if busy else None,
        "no_progress_for_s": age(chat["progress_at"]) if busy else None,
        "waiting_on_person": bool(chat["waiting_input"]) if busy else False,
        "compact_phase": chat["compact_phase"], "queued": int(queued or 0), "in_flight": int(inflight or 0),
        "replies_pending": pending,
        "oldest_pending_reply_s": age(box["oldest_pending"]) if box is not None else None,
        "last_error": errors[-1] if errors else None, "errors": errors,
    }


def _reminder(r: sqlite3.Row, age: Callable[[float | None], float | None]) -> dict[str, Any]:
    text = " ".join(str(r["text"]).split())
    return {"id": r["id"], "address": r["address"], "text": text if len(text) <= 60 else text[:59] + "…",
            "next_at": r["next_at"], "due_for_s": age(r["next_at"]) if r["next_at"] is not None else None}


def _dead_message(d: sqlite3.Row) -> dict[str, Any]:
    payload = json.loads(d["payload"])
    text = " ".join(str(payload.get("text") or "" if isinstance(payload, dict) else payload).split())
    return {"id": d["id"], "address": d["address"], "text": text if len(text) <= 60 else text[:59] + "…",
            "attempts": d["attempts"], "reason": d["reason"], "died_at": d["died_at"],
            "waited_s": None if d["enqueued_at"] is None else round(d["died_at"] - d["enqueued_at"], 1)}
