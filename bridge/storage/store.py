"""The bridge's tables beside the diskqueue, over one database: :class:`Store` composes one small
class per table, each in its module, each returning frozen rows —

- :mod:`.schema`: the numbered migrations, the version checks and their errors, whose state it is;
- :mod:`.chats`: a chat's record (the busy record, R1) and its enums;
- :mod:`.outbox`: the replies and notices on their way out (sent after the commit that wrote them);
- :mod:`.prompts`: the questions a turn waits on;
- :mod:`.people`: the paired and invited, their codes, their wrong guesses;
- :mod:`.spend`: model usage by label;
- :mod:`.status`: what ``iva status`` and the health checks read; the messages given up on.

(and, apart, :mod:`.pushes`: the pushed turns' and the reminders' SQL). The names below are
re-exported for the callers that knew them here.
"""

from __future__ import annotations

import asyncio

from diskqueue import Database

from . import schema
from .chats import CancelMark, Chat, ChatStatus, ChatStore, CompactPhase
from .outbox import Exchange, OutboxStore, Outgoing
from .payloads import Kind, Origin
from .people import (
    LiveCode,
    Misses,
    PeopleStore,
    PersonRecord,
    mint_pairing_code,
    owners_of,
    people_meta,
)
from .prompts import Prompt, PromptStore
from .schema import SCHEMA_VERSION, OtherBot, SchemaMismatch, SchemaTooNew
from .spend import SpendStore
from .status import StatusStore, clear_dead, read_status

__all__ = ["SCHEMA_VERSION", "CancelMark", "Chat", "ChatStatus", "CompactPhase", "Exchange", "Kind", "LiveCode",
           "Misses", "Origin", "OtherBot", "Outgoing", "PersonRecord", "Prompt", "SchemaMismatch", "SchemaTooNew",
           "Store", "clear_dead", "mint_pairing_code", "owners_of", "people_meta", "read_status"]


class Store(ChatStore, OutboxStore, PromptStore, PeopleStore, SpendStore, StatusStore):
    """Every table's statements over one database: each base is one table's class (usable alone,
    as :class:`~.pushes.PushStore` is); no two of them share a method name
    (tests/unit/test_tree_shape.py)."""

    def __init__(self, db: Database) -> None:
        OutboxStore.__init__(self, db)  # each base keeps only ``db``; the outbox its send as well

    async def claim_bot(self, bot_id: int) -> None:
        """The state is this bot's (raises :class:`OtherBot`): :func:`.schema.claim_bot`."""
        await schema.claim_bot(self.db, bot_id)

    async def set_meta(self, key: str, value: str) -> None:
        """What the daemon keeps for the operator's commands (``iva_meta``: eve's version, V5)."""
        await self.db.execute("INSERT INTO iva_meta (key, value) VALUES (?, ?) "
                              "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    async def migrate(self) -> None:
        await schema.migrate(self.db)

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
