"""The one way the tests wait: poll a condition until it holds (never a fixed sleep), and the
one settled condition — what the bridge still has to do as the outside sees it — shared by the
in-process harness (tests/harness.py) and the daemon fixture (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from diskqueue import State


async def until(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition", *,
                every: float = 0.02, detail: Callable[[], str] | None = None) -> Any:
    """Wait until ``predicate()`` (or the coroutine it returns) is truthy and return its value;
    an AssertionError naming ``what`` (and ``detail()``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(every)  # polling the condition, not a fixed wait
    raise AssertionError(f"timed out waiting for {what}" + (f"; {detail()}" if detail is not None else ""))


# What a row in the state still waiting means, and the SQL that counts such rows.
PENDING_SQL: dict[str, str] = {
    "a chat busy": "SELECT count(*) FROM chats WHERE status != 'idle'",
    "a /new waiting": "SELECT count(*) FROM chats WHERE reset_requested = 1",
    "a released compaction watched": "SELECT count(*) FROM chats WHERE compact_phase IS NOT NULL",
    "a message in the queue or in flight": f"SELECT count(*) FROM diskqueue_messages WHERE state IN "
                                           f"({int(State.QUEUED)}, {int(State.INFLIGHT)})",
    "a reply in the outbox": "SELECT count(*) FROM outbox WHERE state = 'pending'",
}


class Telegram(Protocol):  # the fake Bot API or the emulator's adapter
    def all_confirmed(self) -> bool: ...
    def in_flight(self, method: str | None = None) -> int: ...
    async def nudge(self, timeout: float = 15.0) -> None: ...


class Eve(Protocol):
    def quiet(self) -> bool: ...


def pending(db_path: Path) -> list[str]:
    """What the state still has to do, read on its own read-only connection."""
    if not db_path.exists():
        return []
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return [what for what, sql in PENDING_SQL.items() if conn.execute(sql).fetchone()[0]]
    finally:
        conn.close()


def unsettled(db_path: Path, tg: Telegram, eve: Eve | None) -> list[str]:
    """Everything still to do: an update not confirmed, a Telegram call being answered, a row
    of :data:`PENDING_SQL`, and (with ``eve``) the fake eve not quiet; [] when nothing."""
    why = []
    if not tg.all_confirmed():
        why.append("an update not yet confirmed")
    if tg.in_flight():
        why.append("a Telegram call being answered")
    why += pending(db_path)
    if eve is not None and not eve.quiet():
        why.append("the fake eve busy")
    return why


async def settle(why_not: Callable[[], list[str]], tg: Telegram, timeout: float, *,
                 died: Callable[[], str | None] = lambda: None) -> None:
    """Wait until ``why_not()`` is empty twice in a row around a polling round (a nudge: a task
    spawned on the way has started by then). ``died()`` names a reason to stop waiting at once."""
    why: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            while True:
                while why := why_not():
                    if (reason := died()) is not None:
                        raise AssertionError(reason)
                    await asyncio.sleep(0.02)  # polling the condition, not a fixed wait
                await tg.nudge(timeout)
                if not (why := why_not()):
                    return
    except TimeoutError:
        raise AssertionError(f"not settled in {timeout} s: {', '.join(why)}") from None
