"""The composition root: open everything, run the loops in one TaskGroup, close in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import structlog
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramNetworkError,
    TelegramServerError,
    TelegramUnauthorizedError,
)
from aiogram.types import BotCommand, User
from aiohttp import web

import eve_client as eve

from . import backoff, log, systemd
from .chat.services import ContextWindow, PeriodClock, Services
from .chat.worker import Scheduler
from .clock import CLOCK, Clock
from .config import Settings, listener_problem
from .intake.commands import Commands
from .intake.ingest import Ingest
from .intake.webhook import Webhook
from .metrics import METRICS
from .models import ChatModels
from .notebook import Notebook, NotebookConfig, PressureTexts, Rebuilder
from .people import PAIRING_SECONDS, link
from .push.reminders import Reminders
from .push.turns import Pushes
from .storage import retention
from .storage.state import OpenedState, StateCorrupt, StateUnavailable, open_state
from .storage.store import OtherBot, SchemaTooNew, owners_of
from .telegram.pacing import Budget, Pacer
from .telegram.responses import ResponseTypes
from .telegram.sender import Sender, undecodable
from .telegram.texts import t
from .web.listener import Listener
from .web.mcp import McpServer
from .web.owner_api import OwnerApi
from .web.push_api import PushApi

__all__ = ["EXIT_OTHER_BOT", "EXIT_SCHEMA_NEWER", "Bridge", "Opened", "Seams", "make_bot", "open_bridge", "run"]

logger = log.get(__name__)

# Exit codes a restart cannot change: systemd's units list them in RestartPreventExitStatus=.
EXIT_SCHEMA_NEWER = 6  # the state was written by a newer Iva
EXIT_OTHER_BOT = 7  # the state is another bot's

WEDGED_AFTER = 120.0  # seconds without a round of the polling loop (long poll 25 s + backoff 30 s)


def make_bot(settings: Settings, *, clock: Callable[[], float] | None = None,
             sleep: Callable[[float], Awaitable[Any]] | None = None) -> Bot:
    """aiogram's Bot against ``IVA_TELEGRAM_API_URL`` (``{base}/bot{token}/{method}``), with the
    one pacer in front of every call that posts or edits a message (bridge/telegram/pacing.py; ``clock``
    and ``sleep`` time its 429 holds, a test's own clock)."""
    session = AiohttpSession(api=TelegramAPIServer.from_base(settings.telegram.api_url))
    session.middleware(ResponseTypes())
    session.middleware(Pacer(Budget.of(settings), clock=clock or time.monotonic, sleep=sleep or asyncio.sleep))
    return Bot(settings.telegram.token, session=session)


def settle_heap() -> int:
    """Start-up's objects (the modules, aiogram's pydantic models, the object graph) live as long
    as the process: moved out of the garbage collector's generations (``gc.freeze``), a full
    collection walks only what the chats made since — at 1 000 busy chats its pauses went from
    ~340 to ~150 ms (docs/benchmarks.md, section 18). No collection first: it would cost ~0.2 s
    of every start (and of recovery, which counts from the start) to free the few dozen objects
    of start-up's garbage, which stay. The objects frozen (the daemon logs it at ``bridge_ready``)."""
    gc.freeze()
    return gc.get_freeze_count()


class _Shutdown(Exception):
    pass


class Bridge:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A background task we keep a reference to (never fire-and-forget)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _get_me(self, bot: Bot) -> User:
        failures = 0
        while True:
            try:
                return await bot.get_me()
            except (TelegramNetworkError, TelegramServerError) as exc:
                failures += 1
                delay = backoff.STARTUP.delay(failures)
                logger.warning("telegram_unreachable_at_start", error=str(exc), retry_in=round(delay, 2))
                await asyncio.sleep(delay)
            except ClientDecodeError as exc:
                # Not a Bot API user (a proxy, an emulator): say which fields, keep trying.
                failures += 1
                delay = backoff.STARTUP.delay(failures)
                logger.error("telegram_getme_undecodable", problem=undecodable(exc), retry_in=round(delay, 2))
                await asyncio.sleep(delay)

    async def _open_state(self, path: Path) -> OpenedState:
        try:
            return await open_state(path)
        except StateUnavailable as exc:
            if exc.quarantined is not None:  # R5: told even with no fresh store to work on
                await tell_owners_without_state(self.settings, exc.quarantined, str(exc.__cause__ or exc))
            raise

    async def _learn_window(self, client: eve.EveClient, window: ContextWindow, services: Services) -> None:
        """eve's /info: the window (unless IVA_CONTEXT_WINDOW names it) and eve's version, kept
        for ``iva status`` and ``iva sessions`` (V5, V8: which chats an upgrade stranded)."""
        failures = 0
        while True:
            try:
                info = await client.info()
                if info.eve_version:
                    await services.store.set_meta("eve_version", info.eve_version)
                    logger.info("eve_version_learned", version=info.eve_version,
                                stream=eve.implied_stream_version(info.eve_version))
                if self.settings.compaction.context_window:
                    return
                window.learn(info.context_window_tokens)
                logger.info("eve_window_learned", window=window.tokens, threshold=await services.threshold())
                return
            except eve.EveRejected as exc:
                if exc.status != 403:
                    raise
                # V8: eve 1.x serves /info to service callers only (403 info_forbidden): said once;
                # the window is then IVA_CONTEXT_WINDOW's (iva check says so too).
                logger.error("eve_info_forbidden", error=str(exc),
                             fix="set IVA_CONTEXT_WINDOW, or make Iva's caller a service principal in the agent's "
                                 "eve channel (examples/eve-agent/channels/eve.ts)")
                return
            except eve.EveError as exc:
                failures += 1
                logger.warning("eve_info_failed", error=str(exc))
                await asyncio.sleep(backoff.STARTUP.delay(failures))

    async def _commands(self, bot: Bot) -> None:
        for lang in ("en", "ru"):
            commands = [
                BotCommand(command="new", description=t("cmd_new", lang)),
                BotCommand(command="stop", description=t("cmd_stop", lang)),
                BotCommand(command="compact", description=t("cmd_compact", lang)),
                BotCommand(command="status", description=t("cmd_status", lang)),
                BotCommand(command="reminders", description=t("cmd_reminders", lang)),
                *([BotCommand(command="model", description=t("cmd_model", lang))]
                  if self.settings.models else []),
                *([BotCommand(command="notes", description=t("cmd_notes", lang))]
                  if self.settings.notes.enabled else []),
                BotCommand(command="topic", description=t("cmd_topic", lang)),
                BotCommand(command="invite", description=t("cmd_invite", lang)),
                BotCommand(command="users", description=t("cmd_users", lang)),
                BotCommand(command="help", description=t("cmd_help", lang)),
            ]
            try:
                await bot.set_my_commands(commands, language_code=lang)
                if lang == self.settings.lang:
                    await bot.set_my_commands(commands)
            except Exception as exc:
                logger.warning("set_my_commands_failed", error=str(exc))

    async def _watchdog(self, ingest: Ingest) -> None:
        """Ping systemd only while the polling loop (in webhook mode: the webhook's run loop, with no
        commit stuck) goes round; a wedged loop gets restarted."""
        interval = systemd.watchdog_interval()
        if interval is None:
            return
        while True:
            if time.monotonic() - ingest.alive_at < WEDGED_AFTER:
                systemd.notify("WATCHDOG=1")
            else:
                logger.error("ingest_loop_wedged", seconds=int(time.monotonic() - ingest.alive_at))
            await asyncio.sleep(interval)

    async def run(self) -> None:
        s = self.settings
        corrupted: BaseException | None = None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        async with contextlib.AsyncExitStack() as stack:
            opened = await open_bridge(s, stack, spawn=self.spawn,
                                       get_me=lambda bot: self._until_stop(self._get_me(bot)),
                                       seams=Seams(open_state=self._open_state))
            if opened is None:
                logger.info("bridge_stopped_before_ready")
                return
            state, bot, client, me = opened.state, opened.bot, opened.client, opened.me
            services, sender, scheduler = opened.services, opened.sender, opened.scheduler
            ingest, webhook, reminders = opened.ingest, opened.webhook, opened.reminders
            queue, store = state.queue, state.store

            frozen = settle_heap()  # before any chat's own objects exist
            if state.quarantined is not None:
                # R5: the owners hear it from the bot itself, in their private chats.
                for owner in await services.people.owners():
                    self.spawn(sender.say(owner, None, t("state_quarantined", s.lang, path=str(state.quarantined))))
            recovered = await scheduler.recover()
            self.spawn(self._commands(bot))
            self.spawn(self._learn_window(client, services.window, services))
            systemd.notify("READY=1", f"STATUS=serving @{me.username}")
            logger.info("bridge_ready", recovering=recovered, frozen_objects=frozen,
                        mode="polling" if webhook is None else "webhook")
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(ingest.run() if webhook is None else webhook.run(), name="ingest")
                    group.create_task(self._watchdog(ingest), name="watchdog")
                    group.create_task(self._stop_watcher(), name="stop")
                    group.create_task(reminders.run(), name="reminders")  # W7: due ones at once, then on time
                    if s.retention_days is not None:  # F7: at once, then hourly, in small batches
                        group.create_task(retention.run(queue, store, days=s.retention_days), name="retention")
            except* _Shutdown:
                pass
            except* StateCorrupt as group:
                corrupted = group.exceptions[0]
            systemd.notify("STOPPING=1")
            logger.info("bridge_stopping")
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        logger.info("bridge_stopped")
        if corrupted is not None:
            raise corrupted

    async def _until_stop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a start-up step unless SIGTERM comes first (then None)."""
        step = asyncio.ensure_future(coro)
        stop = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if step.done():
            return step.result()
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await step
        return None

    async def _stop_watcher(self) -> None:
        await self.stop.wait()
        raise _Shutdown


@dataclass(frozen=True)
class Seams:
    """What a test puts in place of a part of the graph (tests/harness.py); the defaults are the
    product's: the state's opener, the pacer's clock and sleep, eve's HTTP transport, the
    reminders' steady clock, the busy periods' clock, how the bot's session is closed, and whether
    the listener listens."""

    open_state: Callable[[Path], Awaitable[OpenedState]] = open_state
    pacer_clock: Callable[[], float] | None = None
    pacer_sleep: Callable[[float], Awaitable[Any]] | None = None
    eve_transport: httpx.AsyncBaseTransport | None = None
    clock: Clock = CLOCK  # the reminders' time: steady (F12, bridge/clock.py)
    close_bot: Callable[[Bot], Awaitable[Any]] | None = None
    listen: bool = True
    period_clock: PeriodClock | None = None  # the busy periods' time (bridge/chat/services.py)


@dataclass(frozen=True)
class Opened:
    """The bridge's object graph, built by :func:`open_bridge`."""

    state: OpenedState
    bot: Bot
    client: eve.EveClient
    me: User
    sender: Sender
    notebook: Notebook
    rebuilder: Rebuilder
    services: Services
    scheduler: Scheduler
    pushes: Pushes
    reminders: Reminders
    commands: Commands
    ingest: Ingest
    routes: list[Callable[[web.Application], None]]
    webhook: Webhook | None
    listener: Listener
    requeued: int
    pairing: str | None


async def open_bridge(settings: Settings, stack: contextlib.AsyncExitStack, *,
                      spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
                      get_me: Callable[[Bot], Awaitable[User | None]],
                      seams: Seams = Seams()) -> Opened | None:
    """The one place the object graph is built (the daemon's ``Bridge.run`` and the tests'
    harness both call it): the state opened and repaired, the bot, eve's client, the services,
    the scheduler, pushes and reminders, ingest with its commands, the HTTP routes, the webhook
    and the listener (started when ``seams.listen``). What must be closed goes on ``stack`` in
    the order it closes in reverse. None when ``get_me`` gave up (a stop came first)."""
    s = settings
    state = await seams.open_state(s.db_path)
    db, queue, store = state.db, state.queue, state.store
    stack.push_async_callback(db.close)

    bot = make_bot(s, clock=seams.pacer_clock, sleep=seams.pacer_sleep)
    close_bot = seams.close_bot
    stack.push_async_callback(bot.session.close if close_bot is None else lambda: close_bot(bot))
    client = eve.EveClient(
        s.eve.url, token=s.eve.token, transport=seams.eve_transport,
        on_malformed=lambda _sid, _line: METRICS.malformed.inc(),
    )
    await stack.enter_async_context(client)

    me = await get_me(bot)
    if me is None:
        return None
    await store.claim_bot(me.id)  # another bot's state: its message ids would be taken for ours
    sender = Sender(bot, store, written_before=await store.last_outgoing_id())
    notebook = Notebook(db, store, notebook_config(s))
    models = ChatModels(db, s.models)  # D1: which model answers each chat
    rebuilder = Rebuilder(notebook, store, client, headers=models.rebuild_headers)
    services = Services.build(settings=s, eve_client=client, store=store, queue=queue, sender=sender,
                              spawn=spawn, notebook=notebook, rebuilder=rebuilder, clock=seams.period_clock,
                              models=models)
    requeued = await services.transitions.repair_at_start()
    pairing = await services.people.start_pairing(me.username)
    if pairing is not None:
        # P1: no owner yet. The link is the way in; it goes to the log (the journal), and
        # `iva status` / `iva check` make another while this one waits.
        logger.warning("pairing_link", link=link(me.username, pairing), code=pairing,
                       expires_in_s=int(PAIRING_SECONDS),
                       hint="open the link in Telegram: whoever opens it first becomes the bot's owner")
    structlog.contextvars.clear_contextvars()
    logger.info("bridge_starting", bot=me.username, policy=s.chat.turn_policy, state=str(s.db_path),
                retention_days=s.retention_days,
                requeued=requeued)
    scheduler = Scheduler(services)
    stack.push_async_callback(scheduler.close)
    # W1-W9: pushed turns, notifications and reminders, through the chat's queue and outbox.
    pushes = Pushes(db, queue, store, wake=scheduler.wake)
    reminders = Reminders(db, store, pushes, default_tz=s.tz, clock=seams.clock.now)
    commands = Commands(services, scheduler, reminders)
    ingest = Ingest(services=services, me=me, scheduler=scheduler, commands=commands)
    owner_api = OwnerApi(s.api.token, notebook, store)
    routes: list[Callable[[web.Application], None]] = [owner_api.routes,
                                                        PushApi(owner_api.guard, pushes, reminders).routes]
    if notebook.enabled:  # N8: disabled means no tools at all
        if not s.api.mcp_token:
            logger.warning("mcp_without_token", listen=s.api.listen,
                           fix="set IVA_MCP_TOKEN, and the same value as NOTEBOOK_MCP_TOKEN where eve builds")
        routes.append(McpServer(notebook, store, token=s.api.mcp_token, reminders=reminders).routes)
    webhook = None
    if s.webhook.url is not None:  # O1: Telegram calls us instead of being polled
        assert s.webhook.secret is not None  # Settings.from_env requires it
        webhook = Webhook(ingest, url=s.webhook.url, secret=s.webhook.secret, listen=s.webhook.listen)
    listener = Listener(s.api.listen, store=store, queue=queue, ingest=ingest, routes=routes,
                        busy_timeout=s.chat.busy_timeout, reply_stale_after=s.api.health_reply_seconds,
                        webhook=webhook, eve=client)
    if seams.listen:
        try:
            await listener.start()
            stack.push_async_callback(listener.stop)
        except OSError as exc:
            # A busy port must not keep the bridge from answering people.
            logger.error("http_listen_failed", listen=s.api.listen, error=str(exc))
    return Opened(state=state, bot=bot, client=client, me=me, sender=sender, notebook=notebook,
                  rebuilder=rebuilder, services=services, scheduler=scheduler, pushes=pushes,
                  reminders=reminders, commands=commands, ingest=ingest, routes=routes, webhook=webhook,
                  listener=listener, requeued=requeued, pairing=pairing)


async def tell_owners_without_state(settings: Settings, quarantined: Path, error: str) -> None:
    """R5 when the fresh database cannot be made (a full disk): the owners the environment and
    the quarantined file name hear it from the bot, sent directly (no outbox: nothing is durable);
    a failure to send is logged, never raised over the exit that says why."""
    owners = set(settings.people.owner_ids) | owners_of(quarantined)
    bot = make_bot(settings)
    try:
        for owner in sorted(owners):
            text = t("state_quarantined_no_fresh", settings.lang, path=str(quarantined), error=error[:200])
            try:
                await bot.send_message(owner, text, request_timeout=15)
            except Exception as exc:
                logger.error("owner_not_told", owner=owner, error=str(exc)[:300])
    finally:
        await bot.session.close()


def notebook_config(settings: Settings) -> NotebookConfig:
    defaults = PressureTexts()
    window, wrap, nudge = settings.notes.texts
    texts = PressureTexts(window=window or defaults.window, wrap=wrap or defaults.wrap, nudge=nudge or defaults.nudge)
    return NotebookConfig(enabled=settings.notes.enabled, connection=settings.notes.connection, texts=texts,
                          inturn_percent=settings.compaction.inturn_percent)


async def run(settings: Settings) -> int:
    if (problem := listener_problem(settings.api.listen, settings.notes.enabled, settings.api.mcp_token)) is not None:
        logger.error("start_refused", problem=problem)  # S1; Settings.from_env refuses it first
        return 2
    try:
        await Bridge(settings).run()
    except TelegramUnauthorizedError:
        logger.error("telegram_token_rejected")
        return 3
    except StateUnavailable:
        return 4  # logged by open_state: locked, read-only, full or not permitted; nothing moved
    except StateCorrupt:
        # Logged where it was found; the restart's check moves the file aside (R5).
        return 5
    except SchemaTooNew as exc:
        logger.error("state_schema_newer", path=str(settings.db_path), problem=str(exc))
        return EXIT_SCHEMA_NEWER
    except OtherBot as exc:
        logger.error("state_of_another_bot", path=str(settings.db_path), problem=str(exc))
        return EXIT_OTHER_BOT
    return 0
