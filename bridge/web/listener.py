"""The local HTTP listener (``IVA_API_LISTEN``): ``/healthz``, ``/metrics`` (Prometheus text), and
whatever else registers its routes: the notebook's MCP server (``/mcp``), the owner API
(``/v1/...``) and the webhook (its own listener). The request guards are in :mod:`.guards`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from eve_client import EveClient

from .. import disk, log
from ..clock import CLOCK
from ..metrics import METRICS

if TYPE_CHECKING:
    from diskqueue import DiskQueue

    from ..intake.ingest import Ingest
    from ..intake.webhook import Webhook
    from ..storage.store import Store

__all__ = ["OVERDUE_FACTOR", "Listener"]

logger = log.get(__name__)

POLL_STALE_AFTER = 120.0
OVERDUE_FACTOR = 1.5  # a busy chat is overdue when it made no progress for 1.5 × IVA_BUSY_TIMEOUT
REPLY_STALE_AFTER = 120.0  # a reply still not sent after this long: replies are failing


class Listener:
    def __init__(self, listen: str, *, store: Store, queue: DiskQueue, ingest: Ingest,
                 routes: Sequence[Callable[[web.Application], None]] = (), busy_timeout: float = 900.0,
                 reply_stale_after: float = REPLY_STALE_AFTER, webhook: Webhook | None = None,
                 eve: EveClient | None = None) -> None:
        self.busy_timeout = busy_timeout
        self.reply_stale_after = reply_stale_after
        host, _, port = listen.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.store = store
        self.queue = queue
        self.ingest = ingest
        self.webhook = webhook
        self.eve = eve
        self.started = CLOCK.now()
        self.dead = 0  # messages given up on, as of the last refresh
        self.extra_routes = routes
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/metrics", self.metrics)
        for install in self.extra_routes:
            install(app)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        logger.info("http_listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _refresh(self) -> tuple[int, int, int, int, float | None]:
        # First: set even when the database does not answer. Each mode its own gauges (an
        # alert on the poll's age fired forever in webhook mode, where nothing polls).
        now = CLOCK.now()  # steady (F9)
        METRICS.mode.clear()  # one series: the mode running now (not one left by an earlier bridge in this process)
        if self.webhook is None:
            last = self.ingest.last_poll_ok
            METRICS.mode.labels(mode="polling").set(1)
            METRICS.poll_age.set(round(CLOCK.now() - (self.started if last is None else last), 1))  # F9
        else:
            delivered = self.webhook.delivered_at
            METRICS.mode.labels(mode="webhook").set(1)
            METRICS.webhook_delivery_age.set(round(now - (self.started if delivered is None else delivered), 1))
            healthy, _ = self.webhook.status.report(self.webhook.url, now)
            METRICS.webhook_healthy.set(1 if healthy else 0)
            METRICS.webhook_pending.set(self.webhook.status.pending_update_count or 0)
        # The last committed state, read without queueing behind the writer's transactions: on
        # a slow disk (each commit an fsync of 50 ms or more) that queue is seconds long.
        async with self.store.db.committed():
            queued = await self.queue.depth()
            by_kind = await self.store.busy_by_kind()
            now = CLOCK.now()  # steady (F9): the chats' progress stamps are too
            overdue, oldest = await self.store.health(overdue_before=now - self.busy_timeout * OVERDUE_FACTOR)
            self.dead = await self.store.dead_count()  # a warning, not a failure: `iva status --dead` lists them
        busy = sum(by_kind.values())
        # The outbox stamps wall time: the earlier of the two clocks ages it, so no step makes
        # a pending reply look stale.
        reply_age = None if oldest is None else round(max(0.0, CLOCK.bounded() - oldest), 1)
        METRICS.queue_depth.set(queued)
        METRICS.busy.set(busy)
        METRICS.busy_compacting.set(by_kind.get("compact", 0))
        METRICS.overdue.set(overdue)
        METRICS.oldest_reply.set(reply_age or 0.0)
        return queued, busy, by_kind.get("compact", 0), overdue, reply_age

    async def healthz(self, request: web.Request) -> web.Response:
        overdue, reply_age = 0, None
        try:
            queued, busy, compacting, overdue, reply_age = await self._refresh()
            database = "ok"
        except Exception as exc:  # the answer is the report
            queued = busy = compacting = -1
            database = f"error: {exc}"
        last = self.ingest.last_poll_ok
        poll_age = None if last is None else round(CLOCK.now() - last, 1)
        webhook: dict[str, object] | None = None
        if self.webhook is None:
            receiving = poll_age is not None and poll_age < POLL_STALE_AFTER
        else:  # webhook mode (O1): Telegram's own view, from the last periodic getWebhookInfo
            receiving, webhook = self.webhook.status.report(self.webhook.url, CLOCK.now())
        replies_flowing = reply_age is None or reply_age < self.reply_stale_after
        # F2: a commit failing (the disk full, a lock held) or a disk with no room: nothing can
        # be made durable, so nothing is taken — the bridge waits on storage, alive.
        storage = self.ingest.storage_error or disk.full(self.store.db.path.parent)
        unsupported = self.eve.unsupported if self.eve is not None else None  # V1
        ok = database == "ok" and receiving and overdue == 0 and replies_flowing and storage is None \
            and unsupported is None
        body = {"ok": ok, "mode": "polling" if self.webhook is None else "webhook", "database": database,
                "storage": "ok" if storage is None else f"failing: {storage}",
                "telegram_poll_age_s": poll_age, "webhook": webhook, "queued": queued,
                "busy_chats": busy, "compacting_chats": compacting, "overdue_chats": overdue,
                "oldest_pending_reply_s": reply_age, "dead_messages": self.dead,
                "eve": None if self.eve is None else {
                    "version": self.eve.eve_version, "stream_version": self.eve.stream_version,
                    "problem": None if unsupported is None else str(unsupported)},
                "uptime_s": round(CLOCK.now() - self.started)}
        return web.json_response(body, status=200 if ok else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        try:
            await self._refresh()
        except Exception as exc:
            logger.warning("metrics_refresh_failed", error=str(exc))
        return web.Response(body=generate_latest(METRICS.registry),
                            headers={"content-type": CONTENT_TYPE_LATEST})
