"""The bridge in process (arq's "burst" idea): the real store on a temp file, the real ingest,
workers, consumer and transitions, the HTTP fakes on loopback — no subprocess.

``Harness.start()`` builds what ``bridge.app`` builds; ``settled()`` waits until nothing is
left to do (every update confirmed, no chat busy, queue and outbox empty, no worker running,
the fakes quiet) so a test can then assert absence without sleeping.

A crash is simulated two ways: ``crash()`` cancels every task and closes the store without a
graceful stop (what was not committed is lost, as with SIGKILL), and :class:`KillingDatabase`
"kills the process" at its Nth statement: the files are copied as they are at that instant —
the image a SIGKILL would leave, uncommitted WAL frames included and ignored on reopening —
and the harness restarts from that image.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterator, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
from aiogram import Bot
from aiogram.types import User

from bridge.app import Seams, open_bridge
from bridge.chat.services import PeriodClock, Services
from bridge.chat.worker import Scheduler
from bridge.clock import CLOCK, Clock
from bridge.config import Settings
from bridge.intake.ingest import Ingest
from bridge.log import Redactor
from bridge.push.reminders import Reminders
from bridge.push.turns import Pushes
from bridge.storage.state import OpenedState, open_state
from bridge.storage.store import Chat, Store
from diskqueue import Database, DiskQueue
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, UNPACED, FakeTelegram
from tests.fakes.waiting import settle, unsettled, until

T = TypeVar("T")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

OWNER = 1
FRIEND = 2


class Killed(sqlite3.OperationalError):
    """The simulated SIGKILL, as the bridge meets it: from the kill on, every statement fails
    (the bridge treats it like a disk or lock fault, so nothing more becomes durable and no
    update is confirmed), until the harness stops every task and restarts from the image."""


class KillingDatabase(Database):
    """A :class:`Database` that is "killed" at its ``kill_at``-th statement (1-based): before the
    statement runs, the database files are copied to ``image`` and :class:`Killed` is raised."""

    def __init__(self, path: Path, *, kill_at: int | None = None, image: Path | None = None) -> None:
        super().__init__(path)
        self.kill_at = kill_at
        self.image = image
        self.statements = 0
        self.killed = asyncio.Event()
        self.failing: dict[str, int] = {}  # SQL prefix → the next N such statements fail (a lock, a full disk)
        self.failure: sqlite3.Error = sqlite3.OperationalError("database is locked")  # what they raise

    def _maybe_fail(self, sql: str) -> None:
        for prefix, left in self.failing.items():
            if left and sql.startswith(prefix):
                self.failing[prefix] = left - 1
                raise self.failure

    async def execute(self, sql: str, params: Any = ()) -> int:
        self._maybe_fail(sql)
        return await super().execute(sql, params)

    async def fetchall(self, sql: str, params: Any = ()) -> list[sqlite3.Row]:
        self._maybe_fail(sql)
        return await super().fetchall(sql, params)

    async def _run(self, fn: Callable[..., T], *, fsync: bool = False) -> T:
        self.statements += 1
        if self.killed.is_set():
            raise Killed("the process is dead")
        if self.kill_at is not None and self.statements == self.kill_at:
            assert self.image is not None
            self.image.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-wal", "-shm"):
                part = Path(f"{self.path}{suffix}")
                if part.exists():
                    shutil.copyfile(part, self.image / f"{self.path.name}{suffix}")
            self.killed.set()
            raise Killed(f"killed at statement {self.statements}")
        return await super()._run(fn, fsync=fsync)


async def open_store(path: Path, **kwargs: Any) -> tuple[Database, DiskQueue, Store]:
    db = await KillingDatabase(path, **kwargs).open()
    queue, store = DiskQueue(db, clock=CLOCK.now), Store(db)  # as bridge/storage/state.py
    await queue.migrate()
    await store.migrate()
    return db, queue, store


async def close_bot(bot: Bot) -> None:
    """aiogram's ``session.close()`` less its 250 ms sleep, which lets TLS connections close: the
    fakes speak plain HTTP on loopback, and every test's teardown paid it."""
    session = getattr(bot.session, "_session", None)  # AiohttpSession's aiohttp.ClientSession
    if session is not None and not session.closed:
        await session.close()


class Harness:
    def __init__(self, state: Path, tg: FakeTelegram, fake_eve: FakeEve | None, *,
                 eve_url: str | None = None, eve_token: str | None = None,
                 eve_transport: httpx.AsyncBaseTransport | None = None,
                 clock: Any = None, busy_clock: PeriodClock | None = None, listen: bool = False,
                 **env: str) -> None:
        self.state = state
        self.listen = listen  # the listener (owner API, /mcp, /healthz, /metrics) on a free loopback port
        self.eve_transport = eve_transport  # eve_client's own seam, for faults below HTTP
        self.clock = clock  # a test's clock for the pacer's holds (tests/fakes/clock.py), or None: real time
        self.busy_clock = busy_clock  # a test's clock for the busy periods' time rules, or None: real time
        self.tg = tg
        # The fake eve, or None with ``eve_url``/``eve_token`` naming another eve (the real one,
        # tests/conftest.py's ``Backend``): settled() then checks Telegram and the state only.
        self.fake_eve = fake_eve
        eve_url = eve_url or (fake_eve.url if fake_eve is not None else None)
        eve_token = eve_token or (fake_eve.token if fake_eve is not None else None)
        assert eve_url and eve_token, "a fake eve, or the URL and token of an eve"
        self.env = {
            "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": eve_url,
            "IVA_EVE_TOKEN": eve_token, "IVA_STATE_DIR": str(state), "IVA_OWNER_IDS": str(OWNER),
            "IVA_ALLOWED_USER_IDS": str(FRIEND), "IVA_LANG": "en", "IVA_NOTES_ENABLED": "0", **UNPACED,
            **({"IVA_API_LISTEN": f"127.0.0.1:{free_port()}"} if listen else {}), **env,
        }
        self.settings = Settings.from_env(self.env)
        self.db: KillingDatabase | None = None
        self.services: Services | None = None
        self.scheduler: Scheduler | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stack: contextlib.AsyncExitStack | None = None  # what open_bridge opened, to close
        self.starts = 0
        self.ingest: asyncio.Task[Any] | None = None
        self.loop: Ingest | None = None  # the polling loop itself (its liveness, its storage report)
        self.failing_at_start: dict[str, int] = {}  # KillingDatabase.failing from the first statement
        # R5 at each start, when set: the product's opener (bridge/storage/state.py's open_state)
        # checks the file first — a corrupt one quarantined, a fresh one made — and the harness's
        # KillingDatabase then opens what it left.
        self.check_state = False
        # W1-W9: pushed turns and reminders; the reminders read a steady clock (bridge/clock.py,
        # F12) made at each start of these two (a test moves them: both for time passing, ``wall``
        # alone for a step; ``mono`` None: the same as ``wall``), and fire when the test calls
        # ``reminders.fire_due()``, or on their own loop when ``reminders_loop`` is set before start.
        self.wall: Callable[[], float] = time.time
        self.mono: Callable[[], float] | None = None
        self.reminders_loop = False
        self.pushes: Pushes | None = None
        self.reminders: Reminders | None = None
        self.pairing: str | None = None
        self.opened: Any = None  # what open_bridge built this start (bridge/app.py's Opened)

    @property
    def s(self) -> Services:
        assert self.services is not None
        return self.services

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self, *, kill_at: int | None = None, image: Path | None = None) -> None:
        """Build the bridge as the daemon does (bridge/app.py's ``open_bridge``: the store opened
        and repaired, the graph wired) with the harness's seams — a :class:`KillingDatabase`, the
        test's clock for the pacer, eve's transport, the reminders' wall clock, no listener — then
        run ingest (in webhook mode, O1, the webhook's loop, ready once it set its webhook) and
        recovery."""
        self.starts += 1
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)

        async def killing_state(path: Path) -> OpenedState:
            quarantined: Path | None = None
            problem: str | None = None
            if self.check_state:
                checked = await open_state(path)
                await checked.db.close()
                quarantined, problem = checked.quarantined, checked.problem
            db, queue, store = await open_store(path, kill_at=kill_at, image=image)
            assert isinstance(db, KillingDatabase)
            self.db = db
            db.failing.update(self.failing_at_start)
            return OpenedState(db, queue, store, quarantined, problem)

        async def get_me(bot: Bot) -> User:
            return await bot.get_me()

        seams = Seams(open_state=killing_state, eve_transport=self.eve_transport, clock=self._steady(),
                      pacer_clock=None if self.clock is None else self.clock,
                      pacer_sleep=None if self.clock is None else self.clock.sleep,
                      close_bot=close_bot, listen=self.listen,
                      period_clock=self.busy_clock)
        self._stack = contextlib.AsyncExitStack()
        opened = await open_bridge(self.settings, self._stack, spawn=self.spawn, get_me=get_me, seams=seams)
        assert opened is not None
        self.services, self.scheduler = opened.services, opened.scheduler
        self.pushes, self.reminders = opened.pushes, opened.reminders
        # Issue 24: with no owner in the settings, the pairing code this start printed.
        self.pairing = opened.pairing
        self.opened = opened
        self.loop = opened.ingest
        if opened.webhook is None:
            self.ingest = self.spawn(opened.ingest.run())
        else:  # O1, webhook mode: the webhook's run loop in place of polling, as Bridge.run does
            sets = len(self.tg.calls_of("setWebhook"))
            self.ingest = self.spawn(opened.webhook.run())
            # Ready, as tests/conftest.py's Daemon is, once it set its webhook (only once it serves).
            await self.until(lambda: len(self.tg.calls_of("setWebhook")) > sets or self.ingest.done(),
                             20, "the webhook set")
            if self.ingest.done():
                self.ingest.result()
        await self.scheduler.recover()
        if self.reminders_loop:
            self.spawn(self.reminders.run(look_every=0.2))

    def _steady(self) -> Clock:
        """The reminders' steady clock of this start, read off the test's ``wall`` and ``mono``."""
        return Clock(wall=lambda: self.wall(), mono=lambda: (self.mono or self.wall)(), boot="harness")

    async def daemon_steps(self) -> None:
        """What ``Bridge.run`` does after ``open_bridge`` and the harness does not: the command
        menu (setMyCommands in en and ru) and the context window learned from eve's /info (unless
        IVA_CONTEXT_WINDOW is set) — the daemon's own methods, awaited here to the end."""
        from bridge.app import Bridge

        assert self.opened is not None
        daemon = Bridge(self.settings)
        await daemon._commands(self.opened.bot)
        await daemon._learn_window(self.opened.client, self.s.window, self.s)

    async def crash(self) -> None:
        """Everything stops where it is; nothing is flushed or said (the store closes without a
        commit of anything in flight: an open transaction is never committed)."""
        if self.scheduler is not None:
            self.scheduler.halt()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._stack is not None:  # the scheduler's close (its workers awaited), eve's client, the bot, the store
            with contextlib.suppress(Exception):
                await self._stack.aclose()
        self._stack = None
        self.scheduler = None

    async def stop(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.close()
        await self.crash()

    async def restart_from(self, image: Path) -> None:
        """After a :class:`KillingDatabase` kill: the live files are replaced by the killed
        image, and the bridge starts again from it."""
        await self.crash()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.settings.db_path}{suffix}").unlink(missing_ok=True)
            part = image / f"{self.settings.db_path.name}{suffix}"
            if part.exists():
                shutil.copyfile(part, Path(f"{self.settings.db_path}{suffix}"))
        await self.start()

    # -- looking ----------------------------------------------------------------------------

    def observe(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Read the state as an outsider would (its own read-only connection): looking never
        counts as one of the bridge's statements, so a kill point is never the test's own."""
        conn = sqlite3.connect(f"file:{self.settings.db_path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    async def chat(self, address: str = str(OWNER)) -> Chat:
        chat = self.maybe_chat(address)
        assert chat is not None, f"no chat {address}"
        return chat

    def maybe_chat(self, address: str = str(OWNER)) -> Chat | None:
        rows = self.observe("SELECT * FROM chats WHERE address = ?", (address,))
        return Chat.from_row(rows[0]) if rows else None

    def _unsettled(self, eve_quiet: bool) -> list[str]:
        why = unsettled(self.settings.db_path, self.tg, self.fake_eve if eve_quiet and self.fake_eve else None)
        assert self.scheduler is not None
        if not self.scheduler.settled():
            why.append("a worker running")
        return why

    def quiet(self) -> bool:
        """Nothing left to do right now (the settled condition once, no nudge)."""
        try:
            return not self._unsettled(True)
        except Exception:  # the store's files mid-replacement, a kill
            return False

    async def settled(self, timeout: float = 20.0, *, eve_quiet: bool = True) -> None:
        """Wait until nothing is left to do (tests/fakes/waiting.py: the daemon's condition, and
        no worker running), twice in a row around a polling round."""
        await settle(lambda: self._unsettled(eve_quiet), self.tg, timeout)

    async def until(self, predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
        return await until(predicate, timeout, what, every=0.01)


class InProcess:
    """The harness as the daemon fixture's tests see a daemon (tests/conftest.py's ``Daemon``):
    ``chat(address)`` as a dict, ``db()``, ``settled()``, ``start()``; a scenario moved off the
    real process keeps its assertions word for word. A crash is :meth:`Harness.crash`."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.state = h.settings.state_dir
        self._events: list[MutableMapping[str, Any]] | None = None

    @contextlib.contextmanager
    def catching_logs(self) -> Iterator[None]:
        """Catch the bridge's log events from here on (structlog.testing.capture_logs, the bound
        context merged), for :meth:`logs`."""
        with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as events:
            self._events = events
            yield

    def logs(self) -> str:
        """The events caught by :meth:`catching_logs`, rendered as the daemon writes its stdout
        (bridge/log.py: every secret of the settings redacted, then one JSON line each): what a
        process test read from ``Daemon.logs()``. Every level, as the daemon fixtures' debug."""
        assert self._events is not None, "no logs caught: run the bridge inside catching_logs()"
        redact = Redactor(self.h.settings.secrets)
        render = structlog.processors.JSONRenderer(ensure_ascii=False)
        return "".join(f"{render(None, '', redact(None, '', dict(e)))}\n" for e in self._events)

    async def start(self) -> None:
        await self.h.start()

    async def crash(self) -> None:
        await self.h.crash()

    async def stop(self) -> None:
        """A graceful stop (what SIGTERM does to the daemon: the workers' close, then everything
        closed); :meth:`start` starts it again on the same state."""
        await self.h.stop()

    @property
    def env(self) -> dict[str, str]:
        return self.h.env

    @property
    def api_url(self) -> str:
        """The listener's base URL (a harness made with ``listen=True``)."""
        assert self.h.listen, "the harness was made without its listener (listen=True)"
        return "http://" + self.h.env["IVA_API_LISTEN"]

    def db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.h.settings.db_path)
        conn.row_factory = sqlite3.Row
        return conn

    def chat(self, address: str) -> dict[str, Any] | None:
        rows = self.h.observe("SELECT * FROM chats WHERE address = ?", (address,))
        return dict(rows[0]) if rows else None

    async def settled(self, timeout: float = 30, *, eve: bool = True) -> None:
        await self.h.settled(timeout, eve_quiet=eve)
