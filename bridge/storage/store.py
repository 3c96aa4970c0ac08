"""The bridge's own tables beside the diskqueue: chats (the busy record) and the outbox.

The busy record (R1) is the one source of truth for a chat: status, kind, origin, eve session,
stream cursor and the delivery ids in flight. It changes in the same transactions as the queue
rows it claims or acknowledges.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diskqueue import Database, Message
from eve_client import Position

from ..errors import BridgeError
from .payloads import Kind, Origin

__all__ = ["SCHEMA_VERSION", "CancelMark", "Chat", "ChatStatus", "CompactPhase", "Kind", "Origin", "OtherBot",
           "Outgoing", "SchemaMismatch", "SchemaTooNew", "Store", "clear_dead", "mint_pairing_code", "owners_of",
           "people_meta", "read_status"]

SCHEMA_VERSION = 16

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE chats (
        address       TEXT PRIMARY KEY,
        chat_id       INTEGER NOT NULL,
        thread_id     INTEGER,
        lang          TEXT    NOT NULL DEFAULT 'ru',
        eve_session   TEXT,
        status        TEXT    NOT NULL DEFAULT 'idle',
        kind          TEXT,
        origin        TEXT,
        cursor        INTEGER NOT NULL DEFAULT 0,
        claim         TEXT,
        deliveries    TEXT    NOT NULL DEFAULT '[]',
        busy_since    REAL,
        progress_at   REAL,
        measurement   INTEGER,
        measured_at   REAL,
        compaction_disabled INTEGER NOT NULL DEFAULT 0,
        reset_mark    INTEGER NOT NULL DEFAULT 0,
        reset_requested INTEGER NOT NULL DEFAULT 0,
        reset_reply_to INTEGER,
        reset_dropped INTEGER NOT NULL DEFAULT 0,
        blocked       INTEGER NOT NULL DEFAULT 0,
        blocked_reason TEXT,
        turns         INTEGER NOT NULL DEFAULT 0,
        created_at    REAL    NOT NULL,
        updated_at    REAL    NOT NULL
    );
    CREATE INDEX chats_busy ON chats (status);
    CREATE TABLE outbox (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        address     TEXT    NOT NULL,
        key         TEXT    NOT NULL UNIQUE,
        chat_id     INTEGER NOT NULL,
        thread_id   INTEGER,
        text        TEXT    NOT NULL,
        format      TEXT    NOT NULL DEFAULT 'markdown',
        reply_to    INTEGER,
        state       TEXT    NOT NULL DEFAULT 'pending',
        chunks_sent INTEGER NOT NULL DEFAULT 0,
        message_ids TEXT    NOT NULL DEFAULT '[]',
        created_at  REAL    NOT NULL,
        sent_at     REAL
    );
    CREATE INDEX outbox_pending ON outbox (address, state, id);
    """,
    # Parking-lot compaction (C3, C8, LESSONS #4-#5).
    2: """
    ALTER TABLE chats ADD COLUMN compact_notified INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE chats ADD COLUMN compact_before INTEGER;
    ALTER TABLE chats ADD COLUMN after_pending INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE chats ADD COLUMN last_after INTEGER;
    ALTER TABLE chats ADD COLUMN compact_failures INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE chats ADD COLUMN compact_retry_at REAL;
    ALTER TABLE chats ADD COLUMN compactions INTEGER NOT NULL DEFAULT 0
    """,
    # T5: prompts the turn waits on, shown with inline buttons.
    3: """
    ALTER TABLE chats ADD COLUMN waiting_input INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN markup TEXT;
    CREATE TABLE prompts (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        address     TEXT    NOT NULL,
        session     TEXT    NOT NULL,
        request_id  TEXT    NOT NULL,
        options     TEXT    NOT NULL DEFAULT '[]',
        state       TEXT    NOT NULL DEFAULT 'open',
        created_at  REAL    NOT NULL,
        UNIQUE (session, request_id)
    )
    """,
    # The notebook (seed 000, N1-N9) and spend by label. The tables exist in every schema;
    # with IVA_NOTES_ENABLED=0 nothing reads or writes the notebook's.
    4: """
    ALTER TABLE chats ADD COLUMN notes_mode TEXT NOT NULL DEFAULT 'inline';
    ALTER TABLE chats ADD COLUMN notes_nudged_upto INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE chats ADD COLUMN wrap_nudged_upto INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE chats ADD COLUMN notes_version INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE chats ADD COLUMN notes_rebuild_failed INTEGER;
    ALTER TABLE chats ADD COLUMN owner_turn INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX chats_session ON chats (eve_session);
    CREATE TABLE notes (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        address     TEXT    NOT NULL,
        name        TEXT    NOT NULL,
        description TEXT    NOT NULL DEFAULT '',
        body        TEXT    NOT NULL,
        pinned      INTEGER NOT NULL DEFAULT 0,
        prev_body   TEXT,
        author      TEXT    NOT NULL DEFAULT 'model',
        created_at  REAL    NOT NULL,
        updated_at  REAL    NOT NULL,
        UNIQUE (address, name)
    );
    CREATE TABLE notes_archive (
        address     TEXT PRIMARY KEY,
        records     TEXT NOT NULL,
        reason      TEXT NOT NULL,
        archived_at REAL NOT NULL
    );
    CREATE TABLE notes_seen (
        address     TEXT NOT NULL,
        viewer      TEXT NOT NULL,
        seen_at     REAL NOT NULL,
        PRIMARY KEY (address, viewer)
    );
    CREATE TABLE spend (
        address       TEXT    NOT NULL,
        label         TEXT    NOT NULL,
        calls         INTEGER NOT NULL DEFAULT 0,
        input_tokens  INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cache_read_tokens INTEGER NOT NULL DEFAULT 0,
        updated_at    REAL    NOT NULL,
        PRIMARY KEY (address, label)
    )
    """,
    # The compaction phase as persisted state (R1, R2): what a restart must know of a
    # compaction that is not in eve's stream — whether the request was sent, accepted, the chat
    # released (C6), a cancel wanted or sent (C4), and whom a manual one answers (M5).
    5: """
    ALTER TABLE chats ADD COLUMN compact_phase TEXT;
    ALTER TABLE chats ADD COLUMN compact_cancel TEXT;
    ALTER TABLE chats ADD COLUMN compact_reply_to INTEGER;
    ALTER TABLE chats ADD COLUMN compact_lang TEXT;
    ALTER TABLE chats ADD COLUMN after_report INTEGER NOT NULL DEFAULT 0;
    UPDATE chats SET compact_phase = 'posted' WHERE status = 'busy' AND kind = 'compact'
    """,
    # S3: a prompt's buttons answer only in its chat and for the people whose turn asked.
    6: """
    ALTER TABLE prompts ADD COLUMN chat_id INTEGER;
    ALTER TABLE prompts ADD COLUMN askers TEXT NOT NULL DEFAULT '[]'
    """,
    # L*: a stop asked for (the draft's stop button, /stop) — durable, so a restart right after
    # it cancels again instead of resuming the turn's output.
    7: """
    ALTER TABLE chats ADD COLUMN stop_wanted INTEGER NOT NULL DEFAULT 0
    """,
    # The assistant writes first (W1-W10, bridge/push): reminders, and how far the chat's eve was
    # told of the notifications sent without it (pushed turns and their keys are queue rows).
    8: """
    CREATE TABLE reminders (
        id          TEXT PRIMARY KEY,
        address     TEXT    NOT NULL,
        text        TEXT    NOT NULL,
        at          TEXT,
        cron        TEXT,
        tz          TEXT    NOT NULL,
        next_at     REAL,
        last_fired  REAL,
        state       TEXT    NOT NULL DEFAULT 'active',
        author      TEXT    NOT NULL,
        created_at  REAL    NOT NULL,
        updated_at  REAL    NOT NULL
    );
    CREATE INDEX reminders_due ON reminders (state, next_at);
    CREATE INDEX reminders_by_address ON reminders (address, state);
    CREATE TABLE push_told (
        address     TEXT PRIMARY KEY,
        upto        INTEGER NOT NULL
    )
    """,
    # People (P1-P3): who paired or was invited (beside the environment's ids), the
    # pairing and invitation codes (only their SHA-256), the wrong guesses per person, a few
    # facts `iva status` reads (the bot's username), and the private topics found gone.
    9: """
    CREATE TABLE people (
        user_id     INTEGER PRIMARY KEY,
        role        TEXT    NOT NULL,
        name        TEXT    NOT NULL DEFAULT '',
        added_by    INTEGER,
        added_at    REAL    NOT NULL
    );
    CREATE TABLE pairing_codes (
        digest      TEXT    PRIMARY KEY,
        kind        TEXT    NOT NULL,
        created_by  INTEGER,
        created_at  REAL    NOT NULL,
        expires_at  REAL    NOT NULL,
        used_by     INTEGER,
        used_at     REAL
    );
    CREATE TABLE pairing_misses (
        user_id     INTEGER PRIMARY KEY,
        misses      INTEGER NOT NULL,
        first_at    REAL    NOT NULL,
        locked_until REAL
    );
    CREATE TABLE people_meta (
        key         TEXT PRIMARY KEY,
        value       TEXT NOT NULL
    );
    CREATE TABLE topics_gone (
        address     TEXT PRIMARY KEY,
        reason      TEXT NOT NULL,
        gone_at     REAL NOT NULL
    );
    ALTER TABLE outbox ADD COLUMN receiver INTEGER
    """,
    # What the state belongs to: the bot's id (a dedupe key names a chat and a message id, and
    # another bot's message ids start over), written at the first start that knows it.
    10: """
    CREATE TABLE iva_meta (
        key         TEXT PRIMARY KEY,
        value       TEXT NOT NULL
    )
    """,
    # An answer for one person in a group that must never fall back to the group (a notebook):
    # where Telegram will not show it to them alone, their private chat, and one line in the
    # group ({"private", "sent", "unsent"}). And the messages given up on (F6), kept to be
    # listed and cleared by `iva status`.
    11: """
    ALTER TABLE outbox ADD COLUMN fallback TEXT;
    CREATE TABLE dead_messages (
        id          INTEGER PRIMARY KEY,
        address     TEXT    NOT NULL,
        payload     TEXT    NOT NULL,
        attempts    INTEGER NOT NULL,
        reason      TEXT    NOT NULL,
        enqueued_at REAL,
        died_at     REAL    NOT NULL
    )
    """,
    # Every notebook write is visible (seed 000): what the model's turn changed, by the turn's
    # claim — told with the answer, marked by /notes until the next owner turn changes something.
    12: """
    CREATE TABLE notes_turn (
        address     TEXT PRIMARY KEY,
        claim       TEXT NOT NULL,
        changes     TEXT NOT NULL DEFAULT '[]'
    )
    """,
    # S9: the turn in which the assistant set a reminder (what started it), told when it fires.
    13: """
    ALTER TABLE reminders ADD COLUMN set_in TEXT
    """,
    # V2: eve 1.x's positions are (line, index of the fact in its line); the cursor remembers the
    # stream version it was read on (a 0.80 cursor is never applied to a 1.x stream). Every cursor
    # written so far was read on version 26.
    14: """
    ALTER TABLE chats ADD COLUMN cursor_fact INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE chats ADD COLUMN stream_version INTEGER NOT NULL DEFAULT 0;
    UPDATE chats SET stream_version = 26 WHERE cursor > 0
    """,
    # V5: the eve version that built the chat's session (a session built by another eve is
    # stranded after an upgrade), and the session an upgrade left behind, until the person is
    # told once that the conversation starts afresh.
    15: """
    ALTER TABLE chats ADD COLUMN session_eve TEXT;
    ALTER TABLE chats ADD COLUMN upgraded_from TEXT
    """,
    # D1: the model a chat's owner chose with /model (its SQL: bridge/storage/models.py).
    16: """
    CREATE TABLE chat_models (
        address     TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        set_by      INTEGER,
        set_at      REAL NOT NULL
    )
    """,
}


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


@dataclass(frozen=True, slots=True)
class Outgoing:
    id: int
    address: str
    key: str
    chat_id: int
    thread_id: int | None
    text: str
    format: str
    reply_to: int | None
    chunks_sent: int
    message_ids: tuple[int, ...]
    markup: Any = None  # inline keyboard rows: [[{"text", "callback_data"}]]
    created_at: float = 0.0
    receiver: int | None = None  # S7: in a group, shown to this person alone where Telegram allows
    fallback: dict[str, str] | None = None  # where Telegram will not: {"private", "sent", "unsent"} (S7, N9)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Outgoing:
        return cls(
            id=row["id"],
            address=row["address"],
            key=row["key"],
            chat_id=row["chat_id"],
            thread_id=row["thread_id"],
            text=row["text"],
            format=row["format"],
            reply_to=row["reply_to"],
            chunks_sent=row["chunks_sent"],
            message_ids=tuple(json.loads(row["message_ids"])),
            markup=json.loads(row["markup"]) if row["markup"] else None,
            created_at=row["created_at"],
            receiver=row["receiver"],
            fallback=json.loads(row["fallback"]) if row["fallback"] else None,
        )


_CHAT_COLUMNS = frozenset(
    {
        "lang", "eve_session", "session_eve", "upgraded_from", "status", "kind", "origin", "cursor", "cursor_fact",
        "stream_version", "claim", "deliveries",
        "busy_since", "progress_at", "measurement", "measured_at", "compaction_disabled",
        "reset_mark", "reset_requested", "reset_reply_to", "reset_dropped", "blocked",
        "blocked_reason", "turns", "chat_id", "thread_id", "compact_notified", "compact_before",
        "after_pending", "last_after", "compact_failures", "compact_retry_at", "compactions",
        "waiting_input", "notes_mode", "notes_nudged_upto", "wrap_nudged_upto", "notes_version",
        "notes_rebuild_failed", "owner_turn", "compact_phase", "compact_cancel", "compact_reply_to",
        "compact_lang", "after_report", "stop_wanted",
    }
)


class SchemaTooNew(BridgeError):
    """The state database was written by a newer Iva (its schema is past this one's): this Iva
    must not run on it, and a restart changes nothing (exit 6, which systemd does not restart)."""

    def __init__(self, version: int) -> None:
        self.version = version
        super().__init__(f"state schema {version} is newer than this Iva's {SCHEMA_VERSION}: run the Iva that "
                         "wrote it (or a newer one)")


class OtherBot(BridgeError):
    """The state directory is another bot's: its dedupe keys and chats are that bot's, and this
    one's message ids would collide with them (exit 7, not restarted)."""

    def __init__(self, stored: int, mine: int) -> None:
        self.stored, self.mine = stored, mine
        super().__init__(f"the state belongs to bot {stored}, not to this token's bot {mine}: give each bot its "
                         "own state directory (IVA_STATE_DIR; iva@.service does)")


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def set_meta(self, key: str, value: str) -> None:
        await self.db.execute("INSERT INTO iva_meta (key, value) VALUES (?, ?) "
                              "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    async def claim_bot(self, bot_id: int) -> None:
        """The state is this bot's: written at the first start, checked at every one after
        (raises :class:`OtherBot`)."""
        async with self.db.transaction():
            await self.db.execute("INSERT INTO iva_meta (key, value) VALUES ('bot_id', ?) ON CONFLICT (key) DO NOTHING",
                                  (str(bot_id),))
            row = await self.db.fetchone("SELECT value FROM iva_meta WHERE key = 'bot_id'")
        stored = int(row[0]) if row is not None else bot_id
        if stored != bot_id:
            raise OtherBot(stored, bot_id)

    async def migrate(self) -> None:
        row = await self.db.fetchone("PRAGMA user_version")
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(version)
        for step in range(version + 1, SCHEMA_VERSION + 1):
            async with self.db.transaction():
                for statement in filter(str.strip, _MIGRATIONS[step].split(";")):
                    await self.db.execute(statement)
                await self.db.execute(f"PRAGMA user_version = {step}")

    # -- chats ------------------------------------------------------------------------------

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

    async def health(self, *, overdue_before: float) -> tuple[int, float | None]:
        """(busy chats without progress since ``overdue_before`` and not waiting on the person,
        the creation time of the oldest reply still pending)."""
        overdue = await self.db.fetchone(
            "SELECT count(*) FROM chats WHERE status = 'busy' AND waiting_input = 0 AND progress_at < ?",
            (overdue_before,),
        )
        oldest = await self.db.fetchone("SELECT min(created_at) FROM outbox WHERE state = 'pending'")
        return (int(overdue[0]) if overdue else 0), (float(oldest[0]) if oldest and oldest[0] is not None else None)

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

    # -- outbox -----------------------------------------------------------------------------

    async def put_outgoing(
        self,
        address: str,
        key: str,
        chat_id: int,
        thread_id: int | None,
        text: str,
        *,
        format: str = "markdown",
        reply_to: int | None = None,
        markup: Any = None,
        receiver: int | None = None,
        fallback: dict[str, str] | None = None,
    ) -> bool:
        """Queue a text to send; False when ``key`` was queued before (T7: replays send nothing).

        A lone UTF-16 surrogate (JSON allows ``"\\ud83d"`` alone; SQLite and Telegram refuse
        it) becomes U+FFFD, so a model's broken emoji never costs the person the reply (F6)."""
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        rows = await self.db.fetchall(
            "INSERT INTO outbox (address, key, chat_id, thread_id, text, format, reply_to, markup, created_at, "
            "receiver, fallback) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING RETURNING id",
            (address, key, chat_id, thread_id, text, format, reply_to,
             json.dumps(markup) if markup is not None else None, time.time(), receiver,
             json.dumps(fallback) if fallback is not None else None),
        )
        return bool(rows)

    async def last_outgoing_id(self) -> int:
        """The newest outbox row's id (0: none). Ids only grow (AUTOINCREMENT): a row with a
        larger id was written after this was read."""
        row = await self.db.fetchone("SELECT coalesce(max(id), 0) FROM outbox")
        return int(row[0]) if row else 0

    async def pending_outgoing(self, address: str) -> list[Outgoing]:
        rows = await self.db.fetchall(
            "SELECT * FROM outbox WHERE address = ? AND state = 'pending' ORDER BY id", (address,)
        )
        return [Outgoing.from_row(r) for r in rows]

    async def addresses_with_pending_outgoing(self) -> list[str]:
        rows = await self.db.fetchall("SELECT DISTINCT address FROM outbox WHERE state = 'pending'")
        return [r["address"] for r in rows]

    async def record_chunk(self, outgoing_id: int, chunks_sent: int, message_ids: list[int]) -> None:
        await self.db.execute(
            "UPDATE outbox SET chunks_sent = ?, message_ids = ? WHERE id = ? AND state = 'pending'",
            (chunks_sent, json.dumps(message_ids), outgoing_id),
        )

    async def attempt_outgoing(self, outgoing_id: int) -> None:
        """F3 on a failing disk: a row pending since before this process is marked as tried (its
        ``sent_at`` while pending) before a part of it goes again. A disk that takes no write
        fails this, and the part is not sent: it is sent again only once a write succeeded, so a
        full disk across restarts cannot resend it once a restart (one labelled duplicate, at most)."""
        await self.db.execute("UPDATE outbox SET sent_at = ? WHERE id = ? AND state = 'pending'",
                              (time.time(), outgoing_id))

    async def finish_outgoing(self, outgoing_id: int, state: str = "sent", *, chunks_sent: int | None = None,
                              message_ids: list[int] | None = None) -> None:
        """pending → sent/failed, with the final progress in the same statement."""
        await self.db.execute(
            "UPDATE outbox SET state = ?, sent_at = ?, chunks_sent = coalesce(?, chunks_sent), "
            "message_ids = coalesce(?, message_ids) WHERE id = ? AND state = 'pending'",
            (state, time.time(), chunks_sent, json.dumps(message_ids) if message_ids is not None else None,
             outgoing_id),
        )

    async def add_prompt(self, address: str, session: str, request_id: str, options: list[str], *,
                         chat_id: int | None, askers: list[int]) -> int:
        rows = await self.db.fetchall(
            "INSERT INTO prompts (address, session, request_id, options, chat_id, askers, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (session, request_id) DO UPDATE SET state = state RETURNING id",
            (address, session, request_id, json.dumps(options), chat_id, json.dumps(sorted(set(askers))),
             time.time()),
        )
        return int(rows[0]["id"])

    async def prompt(self, prompt_id: int) -> sqlite3.Row | None:
        return await self.db.fetchone("SELECT * FROM prompts WHERE id = ?", (prompt_id,))

    async def owners_prompt_open(self, session: str) -> bool:
        """A prompt only the owners may answer (a budget prompt, V6) is open in the session."""
        row = await self.db.fetchone("SELECT 1 FROM prompts WHERE session = ? AND state = 'open' AND askers = ?",
                                     (session, "[-1]"))
        return row is not None

    async def close_prompts(self, session: str, request_ids: tuple[str, ...] | None = None) -> None:
        if request_ids is None:
            await self.db.execute("UPDATE prompts SET state = 'closed' WHERE session = ? AND state = 'open'", (session,))
            return
        for request_id in request_ids:
            await self.db.execute(
                "UPDATE prompts SET state = 'closed' WHERE session = ? AND request_id = ?", (session, request_id)
            )

    # -- retention (F7) -----------------------------------------------------------------------

    async def busy_claims(self) -> list[str]:
        """The claims of the busy periods now running: their queue rows are not history yet."""
        rows = await self.db.fetchall("SELECT claim FROM chats WHERE status = 'busy' AND claim IS NOT NULL")
        return [str(r["claim"]) for r in rows]

    async def prune_outbox(self, *, before: float, limit: int) -> int:
        """Delete at most ``limit`` sent or failed outbox rows finished before ``before``, lowest id
        first. A pending row is never touched, nor any row written during a busy period that is
        still running (its turn may still read it)."""
        return await self.db.execute(
            "DELETE FROM outbox WHERE id IN (SELECT o.id FROM outbox o WHERE o.state != 'pending' "
            "AND coalesce(o.sent_at, o.created_at) < ? AND NOT EXISTS (SELECT 1 FROM chats c "
            "WHERE c.address = o.address AND c.status = 'busy' AND o.created_at >= coalesce(c.busy_since, 0)) "
            "ORDER BY o.id LIMIT ?)",
            (before, limit),
        )

    async def prune_prompts(self, *, before: float, limit: int) -> int:
        """Delete at most ``limit`` closed prompts asked before ``before``, lowest id first. An open
        prompt is never touched, nor any prompt of a session a busy chat is in. A press on a
        deleted prompt's button is answered "This question is closed", as on a closed one."""
        return await self.db.execute(
            "DELETE FROM prompts WHERE id IN (SELECT p.id FROM prompts p WHERE p.state != 'open' "
            "AND p.created_at < ? AND NOT EXISTS (SELECT 1 FROM chats c WHERE c.status = 'busy' "
            "AND c.eve_session = p.session) ORDER BY p.id LIMIT ?)",
            (before, limit),
        )

    async def give_back_free_pages(self, batch: int) -> int:
        """With ``auto_vacuum=INCREMENTAL`` only: hand the free pages back to the file system,
        ``batch`` at a time (never a whole-file VACUUM); returns how many. 0 for any other file."""
        mode = await self.db.fetchone("PRAGMA auto_vacuum")
        if mode is None or int(mode[0]) != 2:
            return 0
        freed, free = 0, await self._free_pages()
        while free:
            await self.db.fetchall(f"PRAGMA incremental_vacuum({min(free, batch)})")  # stepped to the end
            left = await self._free_pages()
            if left >= free:
                break
            freed, free = freed + free - left, left
            await asyncio.sleep(0)
        return freed

    async def _free_pages(self) -> int:
        row = await self.db.fetchone("PRAGMA freelist_count")
        return int(row[0]) if row else 0

    # -- spend ------------------------------------------------------------------------------

    async def add_spend(self, address: str, label: str, *, calls: int, input_tokens: int, output_tokens: int,
                        cache_read_tokens: int) -> None:
        """Model usage by label ("turns", "notes"), in the caller's transaction."""
        if not calls:
            return
        await self.db.execute(
            "INSERT INTO spend (address, label, calls, input_tokens, output_tokens, cache_read_tokens, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (address, label) DO UPDATE SET "
            "calls = calls + excluded.calls, input_tokens = input_tokens + excluded.input_tokens, "
            "output_tokens = output_tokens + excluded.output_tokens, "
            "cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens, updated_at = excluded.updated_at",
            (address, label, calls, input_tokens, output_tokens, cache_read_tokens, time.time()),
        )

    async def spend(self, address: str) -> dict[str, dict[str, int | float]]:
        rows = await self.db.fetchall("SELECT * FROM spend WHERE address = ? ORDER BY label", (address,))
        return {r["label"]: {"calls": r["calls"], "input_tokens": r["input_tokens"],
                             "output_tokens": r["output_tokens"], "cache_read_tokens": r["cache_read_tokens"],
                             "updated_at": r["updated_at"]} for r in rows}

    async def recent_exchange(self, address: str, *, limit: int) -> list[sqlite3.Row]:
        """The chat's owner-authored exchange, newest first: rows of (at, who = 'owner' |
        'assistant', text) — S5, the notebook rebuild's only context.

        'owner': the text of a handled message whose queue payload says ``owner: true``; nobody
        else's words, ever. 'assistant': a reply sent during a turn whose every message was the
        owner's (a turn's messages share the claim and are acked at its end, and a chat runs one
        turn at a time, so the reply's time places it in its turn); replies to turns that anyone
        else took part in, prompts and the bridge's own notices are left out.
        """
        return await self.db.fetchall(
            "WITH done AS (SELECT claim, enqueued_at, claimed_at, finished_at, "
            "  CASE WHEN json_valid(payload) THEN coalesce(json_extract(payload, '$.kind'), 'message') END AS kind, "
            "  CASE WHEN json_valid(payload) THEN json_extract(payload, '$.owner') END AS owner, "
            "  CASE WHEN json_valid(payload) THEN json_extract(payload, '$.text') END AS text "
            "  FROM diskqueue_messages WHERE address = ? AND state = 2 AND claim IS NOT NULL), "
            "turns AS (SELECT min(claimed_at) AS began, max(finished_at) AS ended, "
            "  sum(CASE WHEN kind = 'input' OR (kind = 'message' AND owner = 1) THEN 0 ELSE 1 END) AS others "
            "  FROM done GROUP BY claim) "
            "SELECT enqueued_at AS at, 'owner' AS who, text FROM done "
            "WHERE kind = 'message' AND owner = 1 AND typeof(text) = 'text' "
            "UNION ALL SELECT o.created_at AS at, 'assistant' AS who, o.text FROM outbox o "
            "WHERE o.address = ? AND o.state = 'sent' AND o.format = 'markdown' AND o.markup IS NULL "
            "AND EXISTS (SELECT 1 FROM turns t WHERE t.others = 0 AND o.created_at BETWEEN t.began AND t.ended) "
            "ORDER BY at DESC LIMIT ?", (address, address, limit),
        )

    async def chat_by_session(self, session: str) -> Chat | None:
        row = await self.db.fetchone("SELECT * FROM chats WHERE eve_session = ?", (session,))
        return Chat.from_row(row) if row else None

    # -- people (P1-P4, S7): the paired and invited, their codes, wrong guesses ----------------

    async def person(self, user_id: int) -> sqlite3.Row | None:
        return await self.db.fetchone("SELECT * FROM people WHERE user_id = ?", (user_id,))

    async def people(self, role: str | None = None) -> list[sqlite3.Row]:
        """The people of the database (of one role), in the order they came."""
        if role is None:
            return await self.db.fetchall("SELECT * FROM people ORDER BY added_at, user_id")
        return await self.db.fetchall("SELECT * FROM people WHERE role = ? ORDER BY added_at, user_id", (role,))

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

    async def live_codes(self, now: float) -> list[sqlite3.Row]:
        """Codes not used and not expired at ``now``: digest, kind, created_by."""
        return await self.db.fetchall(
            "SELECT digest, kind, created_by FROM pairing_codes WHERE used_by IS NULL AND expires_at > ?", (now,))

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

    async def pairing_misses(self, user_id: int) -> sqlite3.Row | None:
        return await self.db.fetchone("SELECT * FROM pairing_misses WHERE user_id = ?", (user_id,))

    async def record_misses(self, user_id: int, misses: int, first_at: float, locked_until: float | None) -> None:
        await self.db.execute(
            "INSERT INTO pairing_misses (user_id, misses, first_at, locked_until) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (user_id) DO UPDATE SET misses = excluded.misses, first_at = excluded.first_at, "
            "locked_until = excluded.locked_until", (user_id, misses, first_at, locked_until))

    async def clear_misses(self, user_id: int) -> None:
        await self.db.execute("DELETE FROM pairing_misses WHERE user_id = ?", (user_id,))

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

    async def fail_outgoing_of_address(self, address: str) -> int:
        return await self.db.execute(
            "UPDATE outbox SET state = 'failed', sent_at = ? WHERE address = ? AND state = 'pending'",
            (time.time(), address),
        )


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


def clear_dead(path: Path) -> int:
    """``iva status --clear-dead``: the given-up messages forgotten (and their warning with them),
    in one short write transaction beside a running daemon. Returns how many. Raises
    :class:`sqlite3.Error`, or :class:`SchemaMismatch` for another Iva's schema."""
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                raise SchemaMismatch(version)
            cleared = conn.execute("DELETE FROM dead_messages").rowcount
            conn.execute("COMMIT")
            return int(cleared)
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


class SchemaMismatch(BridgeError):
    """The state database's schema is not this Iva's (``iva status`` never migrates)."""

    def __init__(self, version: int) -> None:
        self.version = version
        if version < SCHEMA_VERSION:
            why = f"schema {version}, older than this Iva's {SCHEMA_VERSION}: start the bridge once to migrate it"
        else:
            why = f"schema {version}, newer than this Iva's {SCHEMA_VERSION}: run the Iva that wrote it"
        super().__init__(why)


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


def read_status(path: Path, *, now: float | None = None) -> dict[str, Any]:
    """What ``iva status`` shows, read from the state database at ``path`` without ever writing
    or locking it: a read-only connection (``mode=ro``), one read transaction (a consistent
    snapshot under WAL, taken while the daemon writes), no migration. Raises
    :class:`sqlite3.Error` (e.g. ``unable to open database file``) for the caller to name.

    Per chat that has anything to show (busy, messages waiting, replies pending, or a recorded
    error): its state, the queue and outbox counts, and the last error the store keeps —
    blocked (and why), the last reply given up on, failed compactions, a failed notebook rebuild."""
    now = time.time() if now is None else now
    uri = f"{path.resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=5.0, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("BEGIN")  # deferred: a read snapshot, never a write lock
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            # Not migrated yet (an upgrade before the daemon's first start) or from a newer Iva:
            # its columns are not the ones read below.
            raise SchemaMismatch(version)
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
        conn.execute("COMMIT")
    finally:
        conn.close()

    def age(at: float | None) -> float | None:
        return None if at is None else round(max(0.0, now - at), 1)

    rows: list[dict[str, Any]] = []
    for chat in chats:
        address = chat["address"]
        queued, inflight = queue.get(address, (0, 0))
        box = outbox.get(address)
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
        if (buried := sum(d["address"] == address for d in dead)):
            errors.append(f"{buried} message(s) given up on (iva status --dead; --clear-dead forgets them)")
        busy = chat["status"] == "busy"
        if not (busy or queued or inflight or pending or errors):
            continue
        rows.append({
            "address": address, "status": chat["status"], "kind": chat["kind"] if busy else None,
            "origin": chat["origin"] if busy else None, "busy_for_s": age(chat["busy_since"]) if busy else None,
            "no_progress_for_s": age(chat["progress_at"]) if busy else None,
            "waiting_on_person": bool(chat["waiting_input"]) if busy else False,
            "compact_phase": chat["compact_phase"], "queued": int(queued or 0), "in_flight": int(inflight or 0),
            "replies_pending": pending,
            "oldest_pending_reply_s": age(box["oldest_pending"]) if box is not None else None,
            "last_error": errors[-1] if errors else None, "errors": errors,
        })
    def reminder(r: sqlite3.Row) -> dict[str, Any]:
        text = " ".join(str(r["text"]).split())
        return {"id": r["id"], "address": r["address"], "text": text if len(text) <= 60 else text[:59] + "…",
                "next_at": r["next_at"], "due_for_s": age(r["next_at"]) if r["next_at"] is not None else None}

    def dead_message(d: sqlite3.Row) -> dict[str, Any]:
        payload = json.loads(d["payload"])
        text = " ".join(str(payload.get("text") or "" if isinstance(payload, dict) else payload).split())
        return {"id": d["id"], "address": d["address"], "text": text if len(text) <= 60 else text[:59] + "…",
                "attempts": d["attempts"], "reason": d["reason"], "died_at": d["died_at"],
                "waited_s": None if d["enqueued_at"] is None else round(d["died_at"] - d["enqueued_at"], 1)}

    upcoming = [r["next_at"] for r in reminders if not r["paused"] and r["next_at"] is not None]
    return {
        "dead": [dead_message(d) for d in dead],
        "reminders": {
            "active": len(reminders), "next_at": min(upcoming) if upcoming else None,
            "due": [reminder(r) for r in reminders if not r["paused"] and r["next_at"] is not None
                    and r["next_at"] <= now],
            "paused": [reminder(r) for r in reminders if r["paused"]],
        },
        "database": str(path), "at": now, "chats_known": len(chats),
        "busy_chats": sum(r["status"] == "busy" for r in rows),
        "queued": sum(r["queued"] for r in rows), "replies_pending": sum(r["replies_pending"] for r in rows),
        "chats": rows,
    }
