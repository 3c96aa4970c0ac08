"""Prometheus metrics of the bridge, in one registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["METRICS"]


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.updates = Counter("iva_updates", "Telegram updates handled, by outcome", ["outcome"], registry=r)
        self.turns = Counter("iva_turns", "Turns finished, by outcome", ["outcome"], registry=r)
        self.telegram_sent = Counter("iva_telegram_messages_sent", "Messages sent to Telegram", registry=r)
        self.telegram_retries = Counter("iva_telegram_retries", "Telegram send retries", ["reason"], registry=r)
        self.eve_errors = Counter("iva_eve_errors", "eve errors seen, by kind", ["kind"], registry=r)
        self.draft_frames = Counter("iva_draft_frames", "Live draft frames sent (sendMessageDraft)", registry=r)
        self.stops = Counter("iva_stops", "Stops asked for (the draft's button, /stop), by what ran", ["kind"],
                             registry=r)
        self.transcriptions = Counter("iva_transcriptions", "Recordings transcribed by IVA_TRANSCRIBE_CMD, by outcome "
                                      "(ok, failed, timeout, empty, unfetched)", ["outcome"], registry=r)
        self.malformed = Counter("iva_eve_malformed_lines", "Malformed eve stream lines skipped", registry=r)
        self.compactions = Counter("iva_compactions", "Compactions, by origin and outcome", ["origin", "outcome"],
                                   registry=r)
        self.busy_compacting = Gauge("iva_compacting_chats", "Chats busy with a compaction", registry=r)
        self.queue_depth = Gauge("iva_queue_depth", "Messages waiting in the on-disk queue", registry=r)
        self.busy = Gauge("iva_busy_chats", "Chats busy with a turn or a compaction", registry=r)
        self.overdue = Gauge("iva_overdue_chats", "Busy chats with no progress for longer than IVA_BUSY_TIMEOUT "
                             "(a question waiting on the person aside)", registry=r)
        self.oldest_reply = Gauge("iva_oldest_pending_reply_seconds", "Age of the oldest reply not yet sent",
                                  registry=r)
        self.poll_age = Gauge("iva_telegram_poll_age_seconds", "Polling mode: seconds since the last successful "
                              "getUpdates (since start when none yet); /healthz turns 503 above 120. Not updated in "
                              "webhook mode (see iva_telegram_mode)", registry=r)
        # How updates arrive, so an alert can ask the right question of each mode (O1).
        self.mode = Gauge("iva_telegram_mode", "1 for the way this bridge gets Telegram's updates", ["mode"],
                          registry=r)
        self.webhook_delivery_age = Gauge("iva_webhook_delivery_age_seconds", "Webhook mode: seconds since Telegram's "
                                          "last delivery was taken (since start when none yet); quiet chats make "
                                          "it grow too", registry=r)
        self.webhook_healthy = Gauge("iva_webhook_healthy", "Webhook mode: 1 while Telegram has our URL set, was "
                                     "asked in the last 3 min and reports no delivery error in the last 5 min "
                                     "(as /healthz), else 0", registry=r)
        self.webhook_pending = Gauge("iva_webhook_pending_updates", "Webhook mode: updates Telegram holds for us "
                                     "(getWebhookInfo, every minute)", registry=r)
        # The pacer (bridge/telegram/pacing.py, docs/pacing.md): what waits for Telegram's flood limits.
        self.pacer_waiting = Gauge("iva_pacer_queue_depth", "Messages waiting in the pacer for a chat's or the "
                                   "global send budget", registry=r)
        self.pacer_wait = Histogram(
            "iva_pacer_wait_seconds", "How long a message waited in the pacer before it went", registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
        )
        self.pacer_skipped = Counter("iva_pacer_skipped", "Draft frames and typing actions skipped (never queued) "
                                     "by the pacer", ["kind"], registry=r)
        self.pacer_holds = Counter("iva_pacer_flood_waits", "429s from Telegram: each holds its chat for "
                                   "retry_after", registry=r)
        self.pacer_slowdowns = Counter("iva_pacer_slowdowns", "Times several chats were told to wait at once "
                                       "and the global budget ran at half speed", registry=r)
        self.turn_seconds = Histogram(
            "iva_turn_seconds", "Turn duration", registry=r,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
        )


METRICS = _Metrics()
