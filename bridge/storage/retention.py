"""Retention (F7): finished rows older than ``IVA_RETENTION_DAYS`` are deleted.

What goes, once it finished before the window: queue rows that are done or dropped (the
message texts with them, and the dedupe marks of updates handled on the spot), sent or failed
outbox rows (reply texts, notifications and their keys), closed prompts, done or cancelled
reminders; a pushed turn's key is its queue row's dedupe key and goes with the row. What stays,
whatever its age: every queued or in-flight message, every pending reply, every open prompt, and
whatever a busy period that is still running may read — the queue rows under its claim, the outbox
rows written since it began, the prompts of its session; and the tables that are state rather than
history (chats, the notebook, spend).

Why that is enough for dedupe and recovery: an update's dedupe mark (``tg:<chat>:<message>``,
``cb:<query>``) only has to outlive Telegram's redelivery, and Telegram keeps an unconfirmed
update for 24 hours — hence a window of at least one day. An outbox key stops a reply from
going twice only while eve's stream can be replayed past it, and a stream is only ever read from
the busy record's cursor, which moves in the same commit as the reply's row: a finished row's
event is behind every cursor. Recovery reads only busy records, their claims and pending rows.
The one reader of older history is the notebook rebuild's context (S5): it sees the window.

Deletes run in batches of :data:`BATCH` rows, one short transaction each, so the writer lock is
never held for long; the file does not shrink (SQLite reuses the freed pages), unless it was
made with ``auto_vacuum=INCREMENTAL``, in which case the freed pages are given back a batch at a
time. The file is never VACUUMed here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from diskqueue import DiskQueue

from .. import log
from ..clock import CLOCK
from .pushes import PushStore
from .state import StateCorrupt, corrupt
from .store import Store

__all__ = ["BATCH", "DAY", "INTERVAL", "Pruned", "prune", "run"]

logger = log.get(__name__)

DAY = 86_400.0
BATCH = 500  # rows per transaction
INTERVAL = 3_600.0  # seconds between two prunes
MIN_DAYS = 1  # Telegram's redelivery horizon (24 h) is the floor: see the module's text


@dataclass(frozen=True, slots=True)
class Pruned:
    queue: int = 0
    outbox: int = 0
    prompts: int = 0
    freed_pages: int = 0
    reminders: int = 0

    @property
    def rows(self) -> int:
        return self.queue + self.outbox + self.prompts + self.reminders


async def prune(queue: DiskQueue, store: Store, *, days: float, now: float | None = None,
                batch: int = BATCH) -> Pruned:
    """Delete what finished more than ``days`` before ``now``, ``batch`` rows per transaction."""
    if days < MIN_DAYS:
        raise ValueError(f"retention of {days} days is below the {MIN_DAYS}-day floor")
    before = (CLOCK.bounded() if now is None else now) - days * DAY  # F9: no forward step prunes more
    db = store.db

    async def queue_batch() -> int:
        return await queue.prune(before=before, limit=batch, keep_claims=await store.busy_claims())

    async def outbox_batch() -> int:
        return await store.prune_outbox(before=before, limit=batch)

    async def prompts_batch() -> int:
        return await store.prune_prompts(before=before, limit=batch)

    async def reminders_batch() -> int:
        return await PushStore(db).prune_reminders(before=before, limit=batch)

    counts: list[int] = []
    for step in (queue_batch, outbox_batch, prompts_batch, reminders_batch):
        total = 0
        while True:
            async with db.transaction():  # the busy claims are read in the same transaction
                deleted = await step()
            total += deleted
            if deleted < batch:
                break
            await asyncio.sleep(0)  # let the bridge's own commits in between batches
        counts.append(total)
    freed = 0
    if sum(counts):
        freed = await store.give_back_free_pages(batch)
    return Pruned(queue=counts[0], outbox=counts[1], prompts=counts[2], freed_pages=freed, reminders=counts[3])


async def run(queue: DiskQueue, store: Store, *, days: int, interval: float = INTERVAL,
              clock: Callable[[], float] = CLOCK.bounded) -> None:
    """Prune at once, then every ``interval`` seconds, forever. A failure (a lock held for long,
    a full disk) is logged and tried again next time: retention never stops the bridge — except
    on a file SQLite finds corrupt, which stops it as anywhere else (:class:`StateCorrupt`, F2)."""
    while True:
        started = time.monotonic()
        try:
            pruned = await prune(queue, store, days=days, now=clock())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if corrupt(exc):  # F2: a bad file stops the bridge; the restart's check moves it aside
                logger.error("state_database_corrupt", error=str(exc), during="retention")
                raise StateCorrupt(str(exc)) from exc
            logger.warning("retention_failed", error=str(exc), retry_in_s=int(interval))
        else:
            if pruned.rows:
                logger.info("retention_pruned", days=days, queue_rows=pruned.queue, outbox_rows=pruned.outbox,
                            prompts=pruned.prompts, reminders=pruned.reminders, freed_pages=pruned.freed_pages,
                            seconds=round(time.monotonic() - started, 3))
        await asyncio.sleep(interval)
