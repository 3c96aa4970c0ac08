"""The chats table: a chat's record (the busy record, R1), its enums, and the statements over it.

The busy record is the one source of truth for a chat: status, kind, origin, eve session,
stream cursor and the delivery ids in flight. It changes in the same transactions as the queue
rows it claims or acknowledges; only :mod:`bridge.chat.transitions` writes it (test_chat_layout).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from diskqueue import Database
from eve_client import Position

from .payloads import Kind, Origin

__all__ = ["CancelMark", "Chat", "ChatStatus", "ChatStore", "CompactPhase"]


class ChatStatus(enum.StrEnum):
    IDLE = "idle"
    BUSY = "busy"


class CompactPhase(enum.StrEnum):
    """Where a compaction of ours stands (None on the record: no compaction)."""

    WANTED = "wanted"  # the chat is held for it; the request is not sent yet
    POSTED = "posted"  # POST …/compact sent; eve has not answered
    ACCEPTED = "accepted"  # eve answered accepted or announced it (compaction.requested)
    RELEASED = "released"  # eve did not answer within the ack window: the chat was let go (C6)


class CancelMark(enum.StrEnum):
    """C4: a message wants the running compaction cancelled."""

    WANTED = "wanted"  # sent once eve has the compaction (a cancel before that cancels nothing)
    SENT = "sent"


@dataclass(frozen=True, slots=True)
class Chat:
    address: str
    chat_id: int
    thread_id: int | None
    lang: str
    eve_session: str | None
    status: ChatStatus
    kind: Kind | None
    origin: Origin | None
    cursor: Position
    claim: str | None
    deliveries: tuple[str, ...]
    busy_since: float | None
    progress_at: float | None
    measurement: int | None
    compaction_disabled: bool
    reset_mark: bool
    reset_requested: bool
    reset_reply_to: int | None
    reset_dropped: int
    blocked: bool
    turns: int
    compact_notified: bool = False
    compact_before: int | None = None
    after_pending: bool = False
    last_after: int | None = None
    compact_failures: int = 0
    compact_retry_at: float | None = None
    compactions: int = 0
    waiting_input: bool = False
    notes_mode: str = "inline"
    notes_nudged_upto: int = 0
    wrap_nudged_upto: int = -1
    notes_version: int = 0
    notes_rebuild_failed: int | None = None
    owner_turn: bool = False
    compact_phase: CompactPhase | None = None
    compact_cancel: CancelMark | None = None
    compact_reply_to: int | None = None
    compact_lang: str | None = None
    after_report: bool = False
    stop_wanted: bool = False
    session_eve: str | None = None
    upgraded_from: str | None = None

    @property
    def busy(self) -> bool:
        return self.status is ChatStatus.BUSY

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Chat:
        """One column per field, of the same name; flags are stored as 0/1."""
        values = {name: row[name] for name in _CHAT_FIELDS}
        for name in _CHAT_FLAGS:
            values[name] = bool(values[name])
        values["status"] = ChatStatus(values["status"])
        for name, kind in _CHAT_ENUMS.items():
            if values[name] is not None:
                values[name] = kind(values[name])
        values["deliveries"] = tuple(json.loads(values["deliveries"]))
        values["cursor"] = Position(row["cursor"], row["cursor_fact"], row["stream_version"])
        return cls(**values)


_CHAT_FIELDS = tuple(f.name for f in dataclasses.fields(Chat))
_CHAT_FLAGS = tuple(f.name for f in dataclasses.fields(Chat) if f.type == "bool")
_CHAT_ENUMS: dict[str, type[enum.StrEnum]] = {"kind": Kind, "origin": Origin, "compact_phase": CompactPhase,
                                              "compact_cancel": CancelMark}


_CHAT_COLUMNS = frozenset(
    {
        "lang", "eve_session", "session_eve", "upgraded_from", "status", "kind", "origin", "cursor", "cursor_fact",
        "stream_version", "claim",
        "deliveries",
        "busy_since", "progress_at", "measurement", "measured_at", "compaction_disabled",
        "reset_mark", "reset_requested", "reset_reply_to", "reset_dropped", "blocked",
        "blocked_reason", "turns", "chat_id", "thread_id", "compact_notified", "compact_before",
        "after_pending", "last_after", "compact_failures", "compact_retry_at", "compactions",
        "waiting_input", "notes_mode", "notes_nudged_upto", "wrap_nudged_upto", "notes_version",
        "notes_rebuild_failed", "owner_turn", "compact_phase", "compact_cancel", "compact_reply_to",
        "compact_lang", "after_report", "stop_wanted",
    }
)


class ChatStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def touch_chat(self, address: str, chat_id: int, thread_id: int | None, lang: str) -> None:
        """Create the chat row on first contact; keep its language fresh; a new message unblocks."""
        now = time.time()
        await self.db.execute(
            "INSERT INTO chats (address, chat_id, thread_id, lang, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (address) DO UPDATE SET lang = excluded.lang, "
            "blocked = 0, blocked_reason = NULL, updated_at = excluded.updated_at",
            (address, chat_id, thread_id, lang, now, now),
        )

    async def chat(self, address: str) -> Chat | None:
        row = await self.db.fetchone("SELECT * FROM chats WHERE address = ?", (address,))
        return Chat.from_row(row) if row else None

    async def update_chat(self, address: str, **fields: Any) -> int:
        """Write chat fields; only :mod:`bridge.chat.transitions` calls this (test_chat_layout)."""
        return await self.update_chat_if(address, {}, **fields)

    async def update_chat_if(self, address: str, guard: dict[str, Any], **fields: Any) -> int:
        """Write chat fields only where the record matches ``guard`` (column = value, None = NULL);
        the number of rows changed says whether it applied."""
        unknown = (set(fields) | set(guard)) - _CHAT_COLUMNS
        if unknown:
            raise ValueError(f"not chat columns: {sorted(unknown)}")
        if isinstance(cursor := fields.pop("cursor", None), Position):
            # the position's three columns move together (V2)
            fields.update(cursor=cursor.line, cursor_fact=cursor.index, stream_version=cursor.version)
        elif cursor is not None:
            raise TypeError(f"a cursor is a Position, not {cursor!r}")
        values = [self._encode(k, v) for k, v in fields.items()]
        assignments = ", ".join(f"{k} = ?" for k in fields)
        conditions = "".join(f" AND {k} IS NULL" if v is None else f" AND {k} = ?" for k, v in guard.items())
        guards = [self._encode(k, v) for k, v in guard.items() if v is not None]
        return await self.db.execute(
            f"UPDATE chats SET {assignments}, updated_at = ? WHERE address = ?{conditions}",
            (*values, time.time(), address, *guards),
        )

    @staticmethod
    def _encode(column: str, value: Any) -> Any:
        if column == "deliveries":
            return json.dumps(list(value))
        if isinstance(value, bool):
            return int(value)
        return str(value) if isinstance(value, enum.Enum) else value

    async def block_chat(self, chat_id: int, reason: str) -> int:
        """Every address of a Telegram chat (its topics too) is blocked: nothing more is sent."""
        return await self.db.execute(
            "UPDATE chats SET blocked = 1, blocked_reason = ?, updated_at = ? WHERE chat_id = ?",
            (reason[:200], time.time(), chat_id),
        )

    async def busy_by_kind(self) -> dict[str, int]:
        rows = await self.db.fetchall("SELECT kind, count(*) AS n FROM chats WHERE status = 'busy' GROUP BY kind")
        return {str(r["kind"]): int(r["n"]) for r in rows}

    async def released_chats(self) -> list[str]:
        rows = await self.db.fetchall(
            "SELECT address FROM chats WHERE status = 'idle' AND compact_phase IS NOT NULL"
        )
        return [str(r["address"]) for r in rows]

    async def is_blocked(self, address: str) -> bool:
        row = await self.db.fetchone("SELECT blocked FROM chats WHERE address = ?", (address,))
        return bool(row and row[0])

    async def busy_chats(self) -> list[Chat]:
        rows = await self.db.fetchall("SELECT * FROM chats WHERE status = 'busy' ORDER BY busy_since")
        return [Chat.from_row(r) for r in rows]

    async def chats_wanting_reset(self) -> list[str]:
        rows = await self.db.fetchall("SELECT address FROM chats WHERE reset_requested = 1")
        return [r["address"] for r in rows]

    async def chat_by_session(self, session: str) -> Chat | None:
        row = await self.db.fetchone("SELECT * FROM chats WHERE eve_session = ?", (session,))
        return Chat.from_row(row) if row else None

    async def busy_claims(self) -> list[str]:
        """The claims of the busy periods now running: their queue rows are not history yet."""
        rows = await self.db.fetchall("SELECT claim FROM chats WHERE status = 'busy' AND claim IS NOT NULL")
        return [str(r["claim"]) for r in rows]

    async def topic_gone(self, address: str, reason: str) -> bool:
        """A topic found deleted or not there (P1-P4, S7): remembered, and from now on the
        address's pending replies and its record's sends go to the chat's root. True the first
        time (the person is told once), False when it was known."""
        async with self.db.transaction():
            fresh = bool(await self.db.fetchall(
                "INSERT INTO topics_gone (address, reason, gone_at) VALUES (?, ?, ?) "
                "ON CONFLICT (address) DO NOTHING RETURNING address", (address, reason[:200], time.time())))
            await self.db.execute("UPDATE outbox SET thread_id = NULL WHERE address = ? AND state = 'pending'",
                                  (address,))
            await self.db.execute("UPDATE chats SET thread_id = NULL, updated_at = ? WHERE address = ?",
                                  (time.time(), address))
        return fresh

