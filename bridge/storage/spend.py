"""The spend table: model usage by chat and label ("turns", "notes"), added in the caller's
transaction."""

from __future__ import annotations

import time

from diskqueue import Database

__all__ = ["SpendStore"]


class SpendStore:
    def __init__(self, db: Database) -> None:
        self.db = db

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

