"""The bridge in process with an event-loop stall probe — the daemon side of ``bench.slowdisk``.

Run as a script (``python bench/loop_probe.py OUT.json [MODEL]``) with ``PYTHONPATH`` naming the
tree whose ``bridge`` and ``diskqueue`` are measured, so the same probe runs against a worktree
of an older commit. It runs ``bridge.app.run`` exactly as ``iva run`` does, plus one task that
sleeps 10 ms at a time and records how late each wake-up is (the loop's stall), and writes
``{"ticks": [[monotonic start, lateness s], ...]}`` to ``OUT.json`` when SIGTERM stops the bridge.

``MODEL`` swaps how ``diskqueue.Database`` uses its connection, to compare designs in one run:

- ``as-is``: the tree's own code;
- ``no-snapshot``: the tree's own code, but ``Database.committed()`` does nothing, so /healthz and
  the MCP gate read through the writer's lock like every other statement;
- ``thread-always``: the tree's own code, but every commit after the first runs on the worker
  thread, however fast the disk (no 5 ms test);
- ``aiosqlite``: every statement (the COMMIT included) on aiosqlite's connection thread, one
  trip per statement (``aiosqlite.Connection._execute``: what the project did before benchmark 2's
  round); aiosqlite must be importable (``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any


def _no_snapshot() -> None:
    from diskqueue import Database

    @contextlib.asynccontextmanager
    async def committed(self: Any) -> AsyncIterator[None]:
        yield

    Database.committed = committed  # type: ignore[method-assign]


def _thread_always() -> None:
    from diskqueue import Database

    Database.slow_commit_s = -1.0
    Database.slow_hold_s = float("inf")


def _aiosqlite() -> None:
    import aiosqlite

    from diskqueue import Database

    opened, closed = Database.open, Database.close

    async def open_(self: Any) -> Any:
        await opened(self)
        conn = self._conn
        self._aio = aiosqlite.Connection(lambda: conn, iter_chunk_size=64)
        await self._aio  # starts aiosqlite's thread; its "connection" is ours
        return self

    async def run(self: Any, fn: Callable[[Any], Any], **_: Any) -> Any:
        return await self._aio._execute(fn, self.conn)

    async def close(self: Any) -> None:
        aio = getattr(self, "_aio", None)
        if aio is not None:
            aio._connection = None  # ours to close; only stop the thread
            await aio.stop()
        await closed(self)

    Database.open = open_  # type: ignore[method-assign]
    Database._run = run  # type: ignore[method-assign]
    Database.close = close  # type: ignore[method-assign]


MODELS: dict[str, Callable[[], None]] = {"as-is": lambda: None, "no-snapshot": _no_snapshot,
                                         "thread-always": _thread_always, "aiosqlite": _aiosqlite}


def main() -> int:
    out, model = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "as-is")
    from bridge import log
    from bridge.app import run
    from bridge.config import Settings

    settings = Settings.from_env(os.environ)
    log.configure(settings.log_level, secrets=[settings.telegram.token, settings.eve.token])
    MODELS[model]()
    ticks: list[tuple[float, float]] = []

    async def probe() -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(0.01)
            ticks.append((start, time.monotonic() - start - 0.01))

    async def both() -> int:
        task = asyncio.create_task(probe())
        try:
            return await run(settings)
        finally:
            task.cancel()

    code = asyncio.run(both())
    with open(out, "w") as f:
        json.dump({"model": model, "ticks": ticks}, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
