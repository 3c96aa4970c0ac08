"""The prompts table (T5): a question eve's turn waits on, shown with inline buttons, and whose
buttons may answer it (S3)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from diskqueue import Database

__all__ = ["Prompt", "PromptStore"]


@dataclass(frozen=True, slots=True)
class Prompt:
    id: int
    address: str
    session: str
    request_id: str
    options: tuple[str, ...]  # the option ids, in the buttons' order
    state: str  # "open" | "closed"
    chat_id: int | None  # S3: the chat whose buttons answer it (None: before schema 6, or shown in several: V6)
    askers: tuple[int, ...]  # S3: the people whose messages made the turn

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Prompt:
        return cls(id=row["id"], address=row["address"], session=row["session"], request_id=row["request_id"],
                   options=tuple(json.loads(row["options"])), state=row["state"], chat_id=row["chat_id"],
                   askers=tuple(json.loads(row["askers"] or "[]")))


class PromptStore:
    def __init__(self, db: Database) -> None:
        self.db = db

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

    async def prompt(self, prompt_id: int) -> Prompt | None:
        row = await self.db.fetchone("SELECT * FROM prompts WHERE id = ?", (prompt_id,))
        return None if row is None else Prompt.from_row(row)

    async def owners_prompt_open(self, session: str) -> bool:
        """A prompt only the owners may answer (a budget prompt, V6) is open in the session."""
        row = await self.db.fetchone("SELECT 1 FROM prompts WHERE session = ? AND state = 'open' AND askers = ?",
                                     (session, "[-1]"))
        return row is not None

    async def close_prompts(self, session: str, request_ids: tuple[str, ...] | None = None) -> None:
        if request_ids is None:
            await self.db.execute("UPDATE prompts SET state = 'closed' WHERE session = ? AND state = 'open'",
                                  (session,))
            return
        for request_id in request_ids:
            await self.db.execute(
                "UPDATE prompts SET state = 'closed' WHERE session = ? AND request_id = ?", (session, request_id)
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

