"""The SQL of the model each chat answers on (D1): the ``chat_models`` table (schema step 15 in
:mod:`bridge.storage.store`), one row per address whose owner chose a model with ``/model``; no
row, the operator's default. The name is kept as chosen, even after the operator took it out of
``IVA_MODELS``: what that means (the default, said in /status) is :mod:`bridge.chat.models`'."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from diskqueue import Database

__all__ = ["ChatModel", "ModelStore"]


@dataclass(frozen=True, slots=True)
class ChatModel:
    """A chat's choice: the model's short name, who chose it (a Telegram user id) and when."""

    address: str
    name: str
    set_by: int | None
    set_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> ChatModel:
        set_by = row["set_by"]
        return cls(address=str(row["address"]), name=str(row["name"]),
                   set_by=None if set_by is None else int(set_by), set_at=float(row["set_at"]))


class ModelStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def choice(self, address: str) -> ChatModel | None:
        row = await self.db.fetchone("SELECT address, name, set_by, set_at FROM chat_models WHERE address = ?",
                                     (address,))
        return None if row is None else ChatModel.from_row(row)

    async def choose(self, address: str, name: str, *, set_by: int | None, now: float) -> None:
        """The chat's model from its next turn on (in the caller's transaction)."""
        await self.db.execute(
            "INSERT INTO chat_models (address, name, set_by, set_at) VALUES (?, ?, ?, ?) ON CONFLICT (address) "
            "DO UPDATE SET name = excluded.name, set_by = excluded.set_by, set_at = excluded.set_at",
            (address, name, set_by, now))
