"""The state database's schema: the numbered migrations (``PRAGMA user_version``), the version
checks and their errors, and whose state it is (the bot's id). A step is one transaction; a
database written by a newer Iva is refused, never touched."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from diskqueue import Database

from ..errors import BridgeError

__all__ = ["SCHEMA_VERSION", "OtherBot", "SchemaMismatch", "SchemaTooNew", "beside_daemon", "claim_bot", "migrate"]

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


class SchemaMismatch(BridgeError):
    """The state database's schema is not this Iva's (``iva status`` never migrates)."""

    def __init__(self, version: int) -> None:
        self.version = version
        if version < SCHEMA_VERSION:
            why = f"schema {version}, older than this Iva's {SCHEMA_VERSION}: start the bridge once to migrate it"
        else:
            why = f"schema {version}, newer than this Iva's {SCHEMA_VERSION}: run the Iva that wrote it"
        super().__init__(why)


async def migrate(db: Database) -> None:
    """Every step past the database's version, each in its own transaction (raises
    :class:`SchemaTooNew` for a newer Iva's state)."""
    row = await db.fetchone("PRAGMA user_version")
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(version)
    for step in range(version + 1, SCHEMA_VERSION + 1):
        async with db.transaction():
            for statement in filter(str.strip, _MIGRATIONS[step].split(";")):
                await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {step}")


async def claim_bot(db: Database, bot_id: int) -> None:
    """The state is this bot's: written at the first start, checked at every one after
    (raises :class:`OtherBot`)."""
    async with db.transaction():
        await db.execute("INSERT INTO iva_meta (key, value) VALUES ('bot_id', ?) ON CONFLICT (key) DO NOTHING",
                         (str(bot_id),))
        row = await db.fetchone("SELECT value FROM iva_meta WHERE key = 'bot_id'")
    stored = int(row[0]) if row is not None else bot_id
    if stored != bot_id:
        raise OtherBot(stored, bot_id)


@contextlib.contextmanager
def beside_daemon(path: Path, *, write: bool = False) -> Iterator[sqlite3.Connection]:
    """One short transaction on the state database from another process while the daemon may run
    (the operator's commands): read-only (``mode=ro``, a WAL snapshot, never a lock) or, with
    ``write``, ``BEGIN IMMEDIATE`` — committed when the block ends, rolled back on any error.
    Raises :class:`SchemaMismatch` for a schema this Iva does not read (not migrated yet, or newer)."""
    if write:
        conn = sqlite3.connect(path, timeout=5.0, isolation_level=None)
    else:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                raise SchemaMismatch(version)
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()
