"""The outbox table: the replies and notices on their way to Telegram (T6, T7), each row keyed so
a replay writes nothing twice.

Commit, then send, once: a row written inside a transaction is sent after that transaction
commits, never before (:meth:`diskqueue.Database.after_commit`: the outermost commit runs
:attr:`OutboxStore.on_written`, which the chat's :class:`~bridge.chat.outbox.Outbox` sets to its
send; a rollback drops it). A row written outside a transaction commits alone, and is sent then.
Inside :func:`detached` (ingest, a push, a reminder) the writer does not wait for the send;
elsewhere (a chat's worker) it does, so the chat's order holds."""

from __future__ import annotations

import contextvars
import functools
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from diskqueue import Database

__all__ = ["Exchange", "OutboxStore", "Outgoing", "Written", "detached"]

Written = Callable[[str, bool], Awaitable[None]]  # (the address written to, whether the writer waits for the send)

_detached: contextvars.ContextVar[bool] = contextvars.ContextVar("outbox_detached", default=False)


@contextmanager
def detached() -> Iterator[None]:
    """In this block, what is written into the outbox is sent after its commit in a task of its
    own: the writer (ingest, a push, a reminder) never waits on Telegram."""
    token = _detached.set(True)
    try:
        yield
    finally:
        _detached.reset(token)


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


@dataclass(frozen=True, slots=True)
class Exchange:
    """One line of a chat's owner-authored exchange (S5): when, who ('owner' | 'assistant'), what."""

    at: float
    who: str
    text: str | None


class OutboxStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.on_written: Written | None = None  # the send, after the commit (bridge.chat.outbox)

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
        if self.on_written is not None:  # a duplicate too: a row of it may still be pending (T7)
            await self.db.after_commit(functools.partial(self.on_written, address, not _detached.get()),
                                       key=("outbox", address))
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

    async def recent_exchange(self, address: str, *, limit: int) -> list[Exchange]:
        """The chat's owner-authored exchange, newest first: (at, who = 'owner' | 'assistant',
        text) — S5, the notebook rebuild's only context.

        'owner': the text of a handled message whose queue payload says ``owner: true``; nobody
        else's words, ever. 'assistant': a reply sent during a turn whose every message was the
        owner's (a turn's messages share the claim and are acked at its end, and a chat runs one
        turn at a time, so the reply's time places it in its turn); replies to turns that anyone
        else took part in, prompts and the bridge's own notices are left out.
        """
        rows = await self.db.fetchall(
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
        return [Exchange(at=r["at"], who=r["who"], text=r["text"]) for r in rows]

    async def fail_outgoing_of_address(self, address: str) -> int:
        return await self.db.execute(
            "UPDATE outbox SET state = 'failed', sent_at = ? WHERE address = ? AND state = 'pending'",
            (time.time(), address),
        )

