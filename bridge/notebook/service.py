"""The notebook's storage and operations, on the bridge's own SQLite state (N1–N9).

Every write is one transaction that also bumps ``chats.notes_version``, so a rebuild can tell
whether the notebook changed under it. Everything that may refuse raises :class:`NoteError`
with a message that says what to do instead.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from diskqueue import Database

from .. import log
from ..storage.store import Chat, Store
from .rules import (
    INDEX,
    LIMITS,
    Limits,
    Mode,
    Note,
    NoteError,
    PressureTexts,
    Window,
    check_note,
    check_pins,
    mode_for,
    state_block,
    window_line,
)

__all__ = ["DEFAULT_VIEWER", "Change", "Notebook", "NotebookConfig", "salvage_notes"]

logger = log.get(__name__)

DEFAULT_VIEWER = "owner"  # one server-side seen mark that Telegram and every API client share


@dataclass(frozen=True, slots=True)
class NotebookConfig:
    enabled: bool = True
    connection: str = "notebook"  # the eve connection's name: tools reach the model as <connection>__<tool>
    texts: PressureTexts = field(default_factory=PressureTexts)
    limits: Limits = LIMITS
    inturn_percent: float | None = None  # IVA_INTURN_PERCENT (N6′)

    @property
    def tool_prefix(self) -> str:
        return f"{self.connection}__"


# What a model's turn did to a note, as told to the owner (seed 000: every write is visible).
Change = tuple[str, str]  # (name, "new" | "changed" | "pinned" | "unpinned" | "deleted")


def _merged(changes: list[Change], name: str, action: str) -> list[Change]:
    """One entry per note, the latest action; a note born in this turn stays "new" until deleted."""
    before = dict(changes)
    if before.get(name) == "new" and action != "deleted":
        action = "new"
    return [(n, a) for n, a in changes if n != name] + [(name, action)]


class _Columns(Protocol):
    """A row read by column name (what the database gives; never handed out of this module)."""

    def __getitem__(self, key: str, /) -> Any: ...


def _note(row: _Columns) -> Note:
    return Note(name=row["name"], description=row["description"], body=row["body"], pinned=bool(row["pinned"]),
                created_at=row["created_at"], updated_at=row["updated_at"], prev_body=row["prev_body"], id=row["id"])


class Notebook:
    def __init__(self, db: Database, store: Store, config: NotebookConfig) -> None:
        self.db = db
        self.store = store
        self.config = config
        self.limits = config.limits
        # N5: the notes read in the current turn of each chat, keyed by the turn's claim. In memory on
        # purpose: after a restart the model simply reads again.
        self._reads: dict[str, tuple[str | None, set[str]]] = {}

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # -- reading ----------------------------------------------------------------------------

    async def notes(self, address: str) -> list[Note]:
        rows = await self.db.fetchall("SELECT * FROM notes WHERE address = ? ORDER BY created_at, id", (address,))
        return [_note(r) for r in rows]

    async def note(self, address: str, name: str) -> Note | None:
        row = await self.db.fetchone("SELECT * FROM notes WHERE address = ? AND name = ?", (address, name))
        return _note(row) if row else None

    async def count(self, address: str) -> int:
        row = await self.db.fetchone("SELECT count(*) FROM notes WHERE address = ?", (address,))
        return int(row[0]) if row else 0

    # -- N5 bookkeeping ---------------------------------------------------------------------

    def mark_read(self, chat: Chat, name: str) -> None:
        claim, names = self._reads.get(chat.address, (None, set()))
        if claim != chat.claim:
            names = set()
        names.add(name)
        self._reads[chat.address] = (chat.claim, names)

    def was_read(self, chat: Chat, name: str) -> bool:
        claim, names = self._reads.get(chat.address, (None, set()))
        return claim == chat.claim and name in names

    # -- writing ----------------------------------------------------------------------------

    async def _bump(self, address: str) -> None:
        await self.db.execute("UPDATE chats SET notes_version = notes_version + 1 WHERE address = ?", (address,))

    async def save(self, address: str, name: str, body: str, *, description: str | None = None,
                   pinned: bool | None = None, author: str = "model", guard: Chat | None = None) -> tuple[Note, bool]:
        """Create or overwrite a note; returns (the note, created). ``guard`` is the chat of a
        model's turn: in index mode it must have read a note in this turn before overwriting it."""
        async with self.db.transaction():
            current = await self.note(address, name)
            description = (description if description is not None else (current.description if current else "")).strip()
            check_note(name, description, body, self.limits)
            if current is None and not description:
                raise NoteError("A new note needs a description: one short line saying what it is about.")
            if current is not None and guard is not None and guard.notes_mode == INDEX \
                    and not self.was_read(guard, name):
                raise NoteError(f"A note named '{name}' exists and its body is not shown in index mode. Call "
                                f"{self.config.tool_prefix}chat_note_read first, then save the whole new body.")
            notes = await self.notes(address)
            if current is None and len(notes) >= self.limits.max_notes:
                raise NoteError(f"The notebook holds {len(notes)} notes, the most it can. Merge or delete notes "
                                "you no longer need, then save again.")
            pin = current.pinned if pinned is None and current is not None else bool(pinned)
            candidate = Note(name=name, description=description, body=body, pinned=pin)
            check_pins(notes, candidate, self.limits)
            now = time.time()
            if current is None:
                await self.db.execute(
                    "INSERT INTO notes (address, name, description, body, pinned, prev_body, author, created_at, "
                    "updated_at) VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?)",
                    (address, name, description, body, int(pin), author, now, now),
                )
            else:
                await self.db.execute(
                    "UPDATE notes SET description = ?, body = ?, pinned = ?, author = ?, updated_at = ?, "
                    "prev_body = CASE WHEN body != ? THEN body ELSE prev_body END WHERE address = ? AND name = ?",
                    (description, body, int(pin), author, now, body, address, name),
                )
            await self._bump(address)
            if guard is not None:
                await self._changed(guard, name, "new" if current is None else "changed")
            saved = await self.note(address, name)
        assert saved is not None
        if guard is not None:
            self.mark_read(guard, name)  # it knows what it just wrote
        logger.info("note_saved", address=address, note=name, chars=len(body), created=current is None,
                    author=author, pinned=pin)
        return saved, current is None

    async def set_pinned(self, address: str, name: str, pinned: bool, *, guard: Chat | None = None) -> Note:
        async with self.db.transaction():
            current = await self.note(address, name)
            if current is None:
                raise NoteError(f"There is no note named '{name}'.")
            if current.pinned != pinned:
                check_pins(await self.notes(address), Note(name, current.description, current.body, pinned=pinned),
                           self.limits)
                await self.db.execute("UPDATE notes SET pinned = ?, updated_at = ? WHERE address = ? AND name = ?",
                                      (int(pinned), time.time(), address, name))
                await self._bump(address)
                if guard is not None:
                    await self._changed(guard, name, "pinned" if pinned else "unpinned")
            note = await self.note(address, name)
        assert note is not None
        return note

    async def delete(self, address: str, name: str, *, guard: Chat | None = None) -> bool:
        async with self.db.transaction():
            gone = await self.db.execute("DELETE FROM notes WHERE address = ? AND name = ?", (address, name))
            if gone:
                await self._bump(address)
                if guard is not None:
                    await self._changed(guard, name, "deleted")
        if gone:
            logger.info("note_deleted", address=address, note=name)
        return bool(gone)

    async def delete_chat(self, chat_id: int) -> int:
        """N8: the bot is out of the group: its notes go with it — to the archive first, so the
        owner can still restore them through the API."""
        async with self.db.transaction():
            rows = await self.db.fetchall("SELECT address FROM chats WHERE chat_id = ?", (chat_id,))
            addresses = [r["address"] for r in rows]
            gone = 0
            for address in addresses:
                notes = await self.notes(address)
                if notes:
                    await self._archive(address, notes, "chat gone")
                gone += await self.db.execute("DELETE FROM notes WHERE address = ?", (address,))
                await self.db.execute("DELETE FROM notes_seen WHERE address = ?", (address,))
                await self.db.execute("DELETE FROM notes_turn WHERE address = ?", (address,))
                await self._bump(address)
        logger.info("chat_notes_deleted", chat_id=chat_id, notes=gone)
        return gone

    # -- every write visible (seed 000) ----------------------------------------------------

    async def _changed(self, guard: Chat, name: str, action: str) -> None:
        """In the write's transaction: the model's turn (``guard.claim``) did ``action`` to ``name``."""
        row = await self.db.fetchone("SELECT claim, changes FROM notes_turn WHERE address = ?", (guard.address,))
        changes: list[Change] = []
        if row is not None and row["claim"] == guard.claim:
            changes = [(n, a) for n, a in json.loads(row["changes"])]
        await self.db.execute(
            "INSERT INTO notes_turn (address, claim, changes) VALUES (?, ?, ?) ON CONFLICT (address) "
            "DO UPDATE SET claim = excluded.claim, changes = excluded.changes",
            (guard.address, guard.claim or "", json.dumps(_merged(changes, name, action), ensure_ascii=False)),
        )

    async def turn_over(self, address: str, claim: str) -> list[Change]:
        """The owner turn ``claim`` is over: what it changed (told once, with its answer). A turn
        that changed nothing leaves nothing marked: the marks are the last turn's."""
        row = await self.db.fetchone("SELECT claim, changes FROM notes_turn WHERE address = ?", (address,))
        if row is not None and row["claim"] == claim:
            return [(n, a) for n, a in json.loads(row["changes"])]
        if row is not None:
            await self.db.execute("UPDATE notes_turn SET claim = ?, changes = '[]' WHERE address = ?",
                                  (claim, address))
        return []

    async def last_turn(self, address: str) -> list[Change]:
        """What the last owner turn changed (``/notes`` marks it)."""
        row = await self.db.fetchone("SELECT changes FROM notes_turn WHERE address = ?", (address,))
        return [(n, a) for n, a in json.loads(row["changes"])] if row is not None else []

    # -- N7: the archive and the swap -------------------------------------------------------

    async def _archive(self, address: str, notes: Sequence[Note], reason: str) -> None:
        await self.db.execute(
            "INSERT INTO notes_archive (address, records, reason, archived_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (address) DO UPDATE SET records = excluded.records, reason = excluded.reason, "
            "archived_at = excluded.archived_at",
            (address, json.dumps([n.as_record() for n in notes], ensure_ascii=False), reason, time.time()),
        )

    async def _replace(self, address: str, notes: Sequence[Note]) -> None:
        await self.db.execute("DELETE FROM notes WHERE address = ?", (address,))
        for n in notes:
            await self.db.execute(
                "INSERT INTO notes (address, name, description, body, pinned, prev_body, author, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, 'rebuild', ?, ?)",
                (address, n.name, n.description, n.body, int(n.pinned), n.prev_body, n.created_at, n.updated_at),
            )
        await self._bump(address)

    async def rebuild_failed(self, address: str, version: int) -> None:
        """N7: the rebuild gave up on this version of the notebook; not again until it changes."""
        await self.db.execute(
            "UPDATE chats SET notes_rebuild_failed = ? WHERE address = ? AND notes_version = ?",
            (version, address, version),
        )

    async def swap(self, address: str, notes: Sequence[Note], *, version: int) -> bool:
        """The rebuild's result replaces the notebook, the old one going whole to the archive first;
        False (nothing changed) when the notebook was written meanwhile."""
        async with self.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or chat.notes_version != version:
                return False
            await self._archive(address, await self.notes(address), "rebuild")
            await self._replace(address, notes)
            await self.db.execute("UPDATE chats SET notes_rebuild_failed = NULL WHERE address = ?", (address,))
        return True

    async def archive(self, address: str) -> tuple[list[Note], float, str] | None:
        row = await self.db.fetchone("SELECT * FROM notes_archive WHERE address = ?", (address,))
        if row is None:
            return None
        return [Note.from_record(r) for r in json.loads(row["records"])], row["archived_at"], row["reason"]

    async def restore(self, address: str) -> int | None:
        """Bring the archived notebook back exactly; the current one takes its place in the archive,
        so a restore can itself be undone. None when there is no archive."""
        async with self.db.transaction():
            archived = await self.archive(address)
            if archived is None:
                return None
            records, _, _ = archived
            await self._archive(address, await self.notes(address), "restore")
            await self._replace(address, records)
            # N7: the owner chose this notebook: no rebuild undoes it until it changes again (held
            # as the negative of the version, apart from a failed rebuild's positive mark).
            await self.db.execute("UPDATE chats SET notes_rebuild_failed = -notes_version WHERE address = ?",
                                  (address,))
        logger.info("notes_restored", address=address, notes=len(records))
        return len(records)

    # -- seen marks -------------------------------------------------------------------------

    async def seen_at(self, address: str, viewer: str = DEFAULT_VIEWER) -> float | None:
        row = await self.db.fetchone("SELECT seen_at FROM notes_seen WHERE address = ? AND viewer = ?",
                                     (address, viewer))
        return row["seen_at"] if row else None

    async def mark_seen(self, address: str, viewer: str = DEFAULT_VIEWER) -> float:
        now = time.time()
        await self.db.execute(
            "INSERT INTO notes_seen (address, viewer, seen_at) VALUES (?, ?, ?) "
            "ON CONFLICT (address, viewer) DO UPDATE SET seen_at = excluded.seen_at", (address, viewer, now),
        )
        return now

    # -- turns ------------------------------------------------------------------------------

    async def mode_at_entry(self, chat: Chat) -> Mode:
        """N2: computed once at turn entry (the caller persists it with the claim)."""
        return mode_for(chat.notes_mode, await self.notes(chat.address), self.limits)

    async def block(self, chat: Chat, *, threshold: int, window: int | None) -> tuple[str, dict[str, int]]:
        """The ``[state]`` block of an owner turn and the one-shot marks to persist once it went."""
        line, marks = window_line(
            Window(measurement=None if chat.reset_mark or not chat.eve_session else chat.measurement,
                   threshold=threshold, window=window, parking=not chat.compaction_disabled,
                   compactions=chat.compactions, nudged_upto=chat.notes_nudged_upto,
                   wrapped_upto=chat.wrap_nudged_upto, inturn_percent=self.config.inturn_percent),
            self.config.texts, self.limits,
        )
        notes = await self.notes(chat.address)
        mode: Mode = INDEX if chat.notes_mode == INDEX else "inline"
        return state_block(notes, mode, line, tool_prefix=self.config.tool_prefix, limits=self.limits), marks


# -- a quarantined state database's notes ----------------------------------------------------

_NOTE_COLUMNS = ("address", "name", "description", "body", "pinned", "prev_body", "author", "created_at",
                 "updated_at")


def salvage_notes(source: Path, target: Path) -> tuple[int, int]:
    """Copy the notebooks of a moved-aside (quarantined) state database into the live one: every
    note row and archive row that still reads cleanly, never over a note of the same name written
    since. Returns (notes copied, archives copied). Raises :class:`sqlite3.Error` when ``source``
    has no readable notes table at all."""
    src = sqlite3.connect(f"file:{source}?mode=ro&immutable=1", uri=True)
    try:
        notes: list[tuple[Any, ...]] = []
        cursor = src.execute(f"SELECT {', '.join(_NOTE_COLUMNS)} FROM notes ORDER BY id")
        while True:
            try:
                row = cursor.fetchone()
            except sqlite3.DatabaseError as exc:  # the damage begins here: keep what was read
                logger.warning("notes_salvage_stopped", error=str(exc), read=len(notes))
                break
            if row is None:
                break
            notes.append(row)
        try:
            archives = src.execute("SELECT address, records, reason, archived_at FROM notes_archive").fetchall()
        except sqlite3.DatabaseError as exc:
            logger.warning("notes_archive_unreadable", error=str(exc))
            archives = []
    finally:
        src.close()
    dst = sqlite3.connect(target, timeout=30)
    try:
        with dst:
            copied = 0
            for row in notes:
                copied += dst.execute(
                    f"INSERT INTO notes ({', '.join(_NOTE_COLUMNS)}) VALUES ({', '.join('?' * len(_NOTE_COLUMNS))}) "
                    "ON CONFLICT (address, name) DO NOTHING", tuple(row)).rowcount
            kept = sum(dst.execute("INSERT INTO notes_archive (address, records, reason, archived_at) "
                                   "VALUES (?, ?, ?, ?) ON CONFLICT (address) DO NOTHING", tuple(a)).rowcount
                       for a in archives)
            dst.execute("UPDATE chats SET notes_version = notes_version + 1 WHERE address IN "
                        "(SELECT DISTINCT address FROM notes)")
    finally:
        dst.close()
    return copied, kept
