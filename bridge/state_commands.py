"""The commands that read the state database, never Telegram or eve, and need no configuration:
``iva status`` (read-only, beside a running bridge), ``iva sessions`` (the chats an eve upgrade
stranded, V5; ``--renew-stranded``'s one write) and ``iva restore-notes`` (from a moved-aside
database)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from . import disk
from .config import DEFAULT_BUSY_TIMEOUT, state_dir_of
from .log import one_line
from .notebook.service import salvage_notes
from .people import pairing_note
from .storage import stranded
from .storage.store import SchemaMismatch, clear_dead, read_status
from .web.listener import OVERDUE_FACTOR

__all__ = ["restore_notes", "sessions", "status"]


def restore_notes(args: argparse.Namespace) -> int:
    """``iva restore-notes FILE``: the notebooks of a quarantined state database back into the live one."""
    path = state_dir_of(args.state or os.environ.get("IVA_STATE_DIR") or os.environ.get("STATE_DIRECTORY")) \
        / "iva.sqlite3"
    source = Path(args.file)
    if not path.exists() or not source.exists():
        missing = path if not path.exists() else source
        print(f"iva restore-notes: no database at {missing}", file=sys.stderr)
        return 1
    try:
        notes, archives = salvage_notes(source, path)
    except sqlite3.Error as exc:
        print(f"iva restore-notes: cannot read the notes of {source}: {one_line(str(exc))}", file=sys.stderr)
        return 1
    print(f"iva restore-notes: {notes} note(s) and {archives} archived notebook(s) restored into {path}")
    return 0


def status(args: argparse.Namespace) -> int:
    """``iva status``: the state database as the daemon left it, read-only (works while it runs) —
    but for one thing: while the bot has no owner, a fresh one-time pairing link (P1)."""
    path = state_dir_of(args.state or os.environ.get("IVA_STATE_DIR") or os.environ.get("STATE_DIRECTORY")) \
        / "iva.sqlite3"
    if not path.exists():
        print(f"iva status: no state database at {path} (set IVA_STATE_DIR or --state DIR)", file=sys.stderr)
        return 1
    if args.clear_dead:
        try:
            cleared = clear_dead(path)
        except (sqlite3.Error, SchemaMismatch) as exc:
            print(f"iva status: cannot clear the dead messages in {path}: {one_line(str(exc))}", file=sys.stderr)
            return 1
        print(f"cleared {cleared} message(s) given up on")
        return 0
    try:
        snapshot = read_status(path)
    except (sqlite3.Error, SchemaMismatch) as exc:
        print(f"iva status: cannot read {path}: {one_line(str(exc))}", file=sys.stderr)
        if (storage := disk.full(path.parent)) is not None:
            print(f"iva status: {storage}", file=sys.stderr)
        return 1
    if args.dead and not args.json:
        if not snapshot["dead"]:
            print("no message was given up on")
        for d in snapshot["dead"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(d["died_at"]))
            print(f"dead {d['id']}  chat {d['address']}  {when}  {d['reason']}  {d['text']}")
        return 0
    try:
        busy_timeout = float(os.environ.get("IVA_BUSY_TIMEOUT") or DEFAULT_BUSY_TIMEOUT)
    except ValueError:
        busy_timeout = DEFAULT_BUSY_TIMEOUT
    for chat in snapshot["chats"]:
        quiet = chat["no_progress_for_s"]
        chat["overdue"] = bool(quiet is not None and not chat["waiting_on_person"]
                               and quiet > busy_timeout * OVERDUE_FACTOR)
    note = pairing_note(path, os.environ)  # P1: no owner yet → a fresh link (the one write)
    storage = disk.full(path.parent)  # F2: the daemon waits on storage; say why
    if args.json:
        eve_seen: dict[str, Any] | None = None
        with contextlib.suppress(sqlite3.Error, SchemaMismatch):
            found = stranded.read(path)
            eve_seen = {"version": found.eve_version, "stream_version": found.stream_version,
                        "stranded": len(found.chats)}
        print(json.dumps({**snapshot, "pairing": note, "storage": storage, "eve": eve_seen}, ensure_ascii=False,
                         indent=2))
        return 0
    if note is not None:
        print(note, file=sys.stderr)  # beside the table, never in its lines
    if storage is not None:
        print(f"STORAGE: {storage}")
    print(f"{path}: {snapshot['chats_known']} chats, {snapshot['busy_chats']} busy, "
          f"{snapshot['queued']} messages waiting, {snapshot['replies_pending']} replies pending")
    with contextlib.suppress(sqlite3.Error, SchemaMismatch):
        found = stranded.read(path)
        print(_eve_line(found) + (" — `iva sessions` lists them" if found.chats else ""))
    _reminders(snapshot["reminders"])
    _chats(snapshot["chats"])
    return 0


def _chats(chats: list[dict[str, Any]]) -> None:
    """``iva status``'s table: a line per chat with something to show."""
    if not chats:
        print("nothing busy, waiting or failing")
        return
    head = ("chat", "state", "for", "queued", "replies", "last error")
    table = [head]
    for chat in chats:
        if chat["status"] == "busy":
            what = chat["kind"] or "busy"
            if chat["origin"]:
                what += f" ({chat['origin']})"
            if chat["waiting_on_person"]:
                what += ", asking"
            if chat["overdue"]:
                what += ", OVERDUE"
            since = _duration(chat["busy_for_s"])
        else:
            what, since = "idle", ""
        queued = str(chat["queued"]) + (f" +{chat['in_flight']} in turn" if chat["in_flight"] else "")
        replies = str(chat["replies_pending"]) + (
            f" (oldest {_duration(chat['oldest_pending_reply_s'])})" if chat["replies_pending"] else "")
        table.append((chat["address"], what, since, queued, replies, chat["last_error"] or ""))
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])


def sessions(args: argparse.Namespace) -> int:
    """``iva sessions``: the chats an eve upgrade stranded (V5), and ``--renew-stranded``."""
    path = state_dir_of(args.state or os.environ.get("IVA_STATE_DIR") or os.environ.get("STATE_DIRECTORY")) \
        / "iva.sqlite3"
    if not path.exists():
        print(f"iva sessions: no state database at {path} (set IVA_STATE_DIR or --state DIR)", file=sys.stderr)
        return 1
    try:
        if args.renew_stranded:
            moved, busy = stranded.renew(path)
            print(f"{moved} chat(s) moved: each starts a new session at its next message, the person told once"
                  + (f"; {busy} busy chat(s) meet it in their turn" if busy else ""))
            return 0
        found = stranded.read(path)
    except (sqlite3.Error, SchemaMismatch, LookupError) as exc:
        print(f"iva sessions: {one_line(str(exc))}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"eve_version": found.eve_version, "stream_version": found.stream_version,
                          "stranded": [dataclasses.asdict(c) for c in found.chats]}, indent=2))
        return 0
    print(_eve_line(found))
    for chat in found.chats:
        print(f"stranded {chat.address}  session {chat.session}  built by eve {chat.built_by or '0.80.x'}"
              + ("  (busy)" if chat.busy else ""))
    if found.chats:
        print("`iva sessions --renew-stranded` moves the idle ones now (docs/operating.md, \"Upgrading eve\")")
    return 0


def _eve_line(found: stranded.Stranded) -> str:
    if found.eve_version is None:
        return "eve: not seen yet by the bridge (or its token cannot read /info)"
    return (f"eve {found.eve_version} (stream version {found.stream_version or '?'}, as the bridge last saw it); "
            f"{len(found.chats)} chat(s) on a session another eve built (stranded)")


def _reminders(reminders: dict[str, Any]) -> None:
    """W7: how many reminders, the next, and each one due and not fired or paused."""
    if not reminders["active"]:
        return
    upcoming = reminders["next_at"]
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(upcoming)) if upcoming is not None else "none"
    print(f"reminders: {reminders['active']} active, next {when}, {len(reminders['due'])} due, "
          f"{len(reminders['paused'])} paused")
    for r in reminders["due"]:
        print(f"  due    {r['id']}  chat {r['address']}  for {_duration(r['due_for_s']) or '0s'}  {r['text']}")
    for r in reminders["paused"]:
        print(f"  paused {r['id']}  chat {r['address']}  (the chat blocked the bot or is gone)  {r['text']}")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h{s % 3600 // 60:02d}m"
