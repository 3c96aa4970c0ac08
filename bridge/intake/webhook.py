"""Webhook mode (O1): Telegram POSTs each update to ``IVA_TELEGRAM_WEBHOOK_URL``; the
operator's reverse proxy ends TLS and passes it to this listener (``IVA_WEBHOOK_LISTEN``).

The promise is the polling loop's: an update is answered 200 only once it is durable
(:meth:`Ingest.commit_update`), so a crash before that makes Telegram deliver it again, and the
dedupe key absorbs a delivery of an update already stored.

- The secret (``X-Telegram-Bot-Api-Secret-Token``) is checked first, in constant time: a wrong or
  missing one is 401 and nothing of the body is read.
- A body over 1 MB is 413, one that is not a JSON object with an integer ``update_id`` is 400;
  both are logged. A well-formed update aiogram cannot validate (a newer Bot API) is logged,
  counted as ``undecodable`` and answered 200, as polling passes its offset over it: retrying
  could never make it decodable, and Telegram would hold every later update behind it.
- The commit runs as its own task, in arrival order (one at a time: per-chat order is the
  polling loop's). The request waits for it at most :data:`COMMIT_WAIT` seconds and answers 503
  when it is not durable by then (a locked or failing database), so Telegram retries; the commit
  itself is never cancelled halfway but goes on retrying, and the retried delivery joins it
  instead of starting a second one.
- ``setWebhook`` asks for ``max_connections=1``: Telegram then sends one update at a time, in
  order, and the next only after this one got its 2xx.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiogram.exceptions import (
    TelegramAPIError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.types import Update
from aiohttp import web

from .. import backoff, log
from ..clock import CLOCK
from ..metrics import METRICS
from ..storage.state import StateCorrupt
from .ingest import ALLOWED_UPDATES

if TYPE_CHECKING:
    from .ingest import Ingest

__all__ = ["SECRET_HEADER", "Webhook", "WebhookStatus"]

logger = log.get(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BODY = 1024 * 1024  # bytes; an update is a few KB, Telegram's largest well under this
COMMIT_WAIT = 10.0  # seconds a delivery waits for its commit before answering 503 (Telegram retries)
INFO_EVERY = 60.0  # seconds between two getWebhookInfo checks (what /healthz reports)
TICK = 5.0  # the run loop's round, which the systemd watchdog watches
STUCK_AFTER = 60.0  # a commit this old stops the watchdog pings (like a wedged polling loop)
RECENT_ERROR = 300.0  # a delivery error Telegram reports from this recently makes /healthz 503


class WebhookStatus:
    """The last getWebhookInfo answer, as /healthz reports it."""

    def __init__(self) -> None:
        self.checked_at: float | None = None  # steady time (bridge/clock.py) of the last answer
        self.url: str | None = None
        self.pending_update_count: int | None = None
        self.last_error_message: str | None = None
        self.last_error_at: float | None = None
        self.check_error: str | None = None  # why the last check failed, if it did

    def report(self, ours: str, now: float) -> tuple[bool, dict[str, Any]]:
        """(healthy, the /healthz part): Telegram has our URL set, was asked recently, and
        reports no delivery error in the last :data:`RECENT_ERROR` seconds."""
        fresh = self.checked_at is not None and now - self.checked_at < 3 * INFO_EVERY
        recent_error = self.last_error_at is not None and now - self.last_error_at < RECENT_ERROR
        ok = fresh and self.url == ours and not recent_error
        body = {"url_set": self.url == ours, "pending_update_count": self.pending_update_count,
                "last_error_message": self.last_error_message,
                "last_error_age_s": None if self.last_error_at is None else round(now - self.last_error_at),
                "checked_age_s": None if self.checked_at is None else round(now - self.checked_at, 1),
                "check_error": self.check_error}
        return ok, body


class Webhook:
    def __init__(self, ingest: Ingest, *, url: str, secret: str, listen: str,
                 commit_wait: float = COMMIT_WAIT, retry: backoff.Backoff = backoff.WEBHOOK) -> None:
        self.ingest = ingest
        self.bot = ingest.bot
        self.url = url
        self.path = urlsplit(url).path or "/"
        self.secret = secret.encode()
        host, _, port = listen.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.commit_wait = commit_wait
        self.retry = retry  # a busy port or a refused setWebhook: tried again, slowly
        self.status = WebhookStatus()
        self.delivered_at: float | None = None  # steady time of the last delivery taken (/metrics)
        self._order = asyncio.Lock()  # commits one at a time, in arrival order
        self._inflight: dict[int, tuple[asyncio.Task[None], float]] = {}  # update id → (commit, started)
        self._fatal: asyncio.Future[BaseException] | None = None
        self._runner: web.AppRunner | None = None

    # -- the run loop (in the bridge's TaskGroup, in place of the polling loop) ---------------

    async def run(self) -> None:
        """Serve, set the webhook, then check Telegram's view of it every minute; a corrupt
        database found by a commit ends it (the bridge stops, exit 5, as in polling mode)."""
        self._fatal = asyncio.get_running_loop().create_future()
        try:
            await self._serve()
            await self._set()
            self.ingest.transitions.caught_up()  # what Telegram held comes from now on (albums)
            next_check = 0.0
            while True:
                self._tick()
                if time.monotonic() >= next_check:
                    await self.check()
                    next_check = time.monotonic() + INFO_EVERY
                done, _ = await asyncio.wait({self._fatal}, timeout=TICK)
                if done:
                    raise self._fatal.result()
        finally:
            await self._close()

    def _tick(self) -> None:
        """The watchdog's sign of life: the loop goes round and no commit is stuck."""
        now = time.monotonic()
        if all(now - started < STUCK_AFTER for _, started in self._inflight.values()):
            self.ingest.alive_at = now

    async def _wait(self, seconds: float) -> None:
        """A retry's wait that feeds the watchdog: a port held by another process or a URL
        Telegram refuses is the operator's to fix, not a wedged loop a restart would cure (a
        restart only fails the same way, every two minutes)."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            self._tick()
            await asyncio.sleep(min(TICK, left))
        self._tick()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(self.path, self.receive)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        failures = 0
        while True:
            try:
                await web.TCPSite(self._runner, self.host, self.port).start()
                logger.info("webhook_listening", host=self.host, port=self.port, path=self.path)
                return
            except OSError as exc:
                # Nothing can arrive without it; keep trying (a port still held by the old process).
                failures += 1
                wait = self.retry.delay(failures)
                logger.error("webhook_listen_failed", host=self.host, port=self.port, error=str(exc),
                             wait=round(wait, 2))
                await self._wait(wait)

    async def _set(self) -> None:
        """setWebhook: our URL and secret, the polling loop's update types, one connection (order),
        and nothing dropped (what Telegram holds from polling mode is delivered here)."""
        failures = 0
        while True:
            try:
                await self.bot.set_webhook(self.url, secret_token=self.secret.decode(),
                                           allowed_updates=ALLOWED_UPDATES, max_connections=1,
                                           drop_pending_updates=False, request_timeout=30)
                logger.info("telegram_webhook_set", url=self.url)
                return
            except TelegramRetryAfter as exc:
                await self._wait(exc.retry_after)
                continue
            except (TelegramNetworkError, TelegramServerError) as exc:
                error = str(exc)
            except TelegramAPIError as exc:
                # Refused (not https, a port Telegram does not call): nothing arrives until the
                # operator fixes it; /healthz and `iva check` say so too. Keep trying, slowly.
                error = exc.message
            failures += 1
            wait = self.retry.delay(failures)
            logger.error("telegram_webhook_set_failed", url=self.url, error=error[:300], wait=round(wait, 2))
            await self._wait(wait)

    async def check(self) -> None:
        """getWebhookInfo into :attr:`status` (never raises but for cancellation)."""
        try:
            info = await self.bot.get_webhook_info(request_timeout=30)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.status.check_error = str(exc)[:300]
            logger.warning("telegram_webhook_info_failed", error=self.status.check_error)
            return
        status = self.status
        status.checked_at = CLOCK.now()
        status.check_error = None
        status.url = info.url
        status.pending_update_count = info.pending_update_count
        status.last_error_message = info.last_error_message
        status.last_error_at = info.last_error_date.timestamp() if info.last_error_date is not None else None
        if info.url != self.url:
            logger.error("telegram_webhook_not_ours", url=info.url or None, ours=self.url)
        elif info.last_error_message and status.last_error_at and time.time() - status.last_error_at < INFO_EVERY * 2:
            logger.warning("telegram_webhook_delivery_error", error=info.last_error_message,
                           pending=info.pending_update_count)

    async def _close(self) -> None:
        for task, _ in list(self._inflight.values()):
            task.cancel()
        await asyncio.gather(*(task for task, _ in self._inflight.values()), return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- one delivery -----------------------------------------------------------------------

    async def receive(self, request: web.Request) -> web.Response:
        # A header's bytes that are not UTF-8 arrive as surrogate escapes: compared as the bytes
        # they were (a wrong secret, 401), never an encoding error (a 500 with a traceback).
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, self.secret):
            logger.warning("webhook_unauthorized", peer=request.remote, secret_given=bool(given))
            return web.Response(status=401, text="unauthorized")
        if request.content_length is not None and request.content_length > MAX_BODY:
            logger.error("webhook_body_too_large", size=request.content_length)
            return web.Response(status=413, text="too large")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            logger.error("webhook_body_too_large", size=None)
            return web.Response(status=413, text="too large")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past Python's stack
            logger.error("webhook_body_malformed", error=str(exc)[:200], size=len(body))
            return web.Response(status=400, text="not json")
        update_id = data.get("update_id") if isinstance(data, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            logger.error("webhook_body_malformed", error="not an update (no integer update_id)", size=len(body))
            return web.Response(status=400, text="not an update")
        try:
            update = Update.model_validate(data, context={"bot": self.bot})
        except ValueError as exc:
            # Like polling's salvage: logged, counted, passed over (200), never retried forever.
            logger.error("telegram_update_undecodable", update_id=update_id, error=str(exc)[:300])
            METRICS.updates.labels(outcome="undecodable").inc()
            return web.Response(status=200)
        commit = self._commit(update)
        try:
            async with asyncio.timeout(self.commit_wait):
                await asyncio.shield(commit)
        except TimeoutError:
            logger.error("webhook_commit_slow", update_id=update_id, waited=self.commit_wait)
            return web.Response(status=503, text="not stored yet")
        except StateCorrupt:
            return web.Response(status=503, text="state unavailable")  # the bridge is stopping
        self.delivered_at = CLOCK.now()
        return web.Response(status=200)

    def _commit(self, update: Update) -> asyncio.Task[None]:
        """The update's commit task: a new one, or the one a previous delivery started."""
        running = self._inflight.get(update.update_id)
        if running is not None:
            return running[0]
        task = asyncio.create_task(self._commit_in_order(update), name=f"webhook-commit-{update.update_id}")
        self._inflight[update.update_id] = (task, time.monotonic())
        task.add_done_callback(lambda t: self._committed(update.update_id, t))
        return task

    async def _commit_in_order(self, update: Update) -> None:
        async with self._order:
            await self.ingest.commit_update(update)

    def _committed(self, update_id: int, task: asyncio.Task[None]) -> None:
        self._inflight.pop(update_id, None)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, StateCorrupt) and self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(error)
        elif error is not None:
            logger.error("webhook_commit_failed", update_id=update_id, error=repr(error)[:300])
