"""Webhook mode (issue 15): the same promise as polling — no update lost, none answered twice.
In process (tests/harness.py runs the webhook's loop as the daemon does in webhook mode);
what needs a real process (a SIGKILL, SIGTERM, ``iva check``) is tests/process/test_webhook.py.

The fake Bot API delivers like Telegram once a webhook is set: one update at a time, in order,
the same one again after a non-2xx answer or a connection error; a 2xx confirms it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sqlite3
from types import SimpleNamespace

import aiohttp
import pytest
import structlog
from aiogram import Bot

from bridge.app import make_bot
from bridge.backoff import Backoff
from bridge.config import ConfigError, Settings
from bridge.intake.ingest import ALLOWED_UPDATES
from bridge.intake.webhook import Webhook
from tests.conftest import OWNER, STRANGER
from tests.daemons import HOOK_PATH, healthz, post, webhook_env
from tests.daemons import WEBHOOK_SECRET as SECRET
from tests.fakes.telegram import TOKEN


async def test_a_message_by_webhook_is_answered_once(tg, in_process_factory):
    """setWebhook with our URL, secret, the polling update types, one connection, nothing dropped;
    then a message delivered by webhook is answered once, and getUpdates is never called."""
    hook = webhook_env()
    daemon = in_process_factory(listen=True, **hook)
    await daemon.start()
    (call,) = tg.calls_of("setWebhook")
    assert call["url"] == hook["IVA_TELEGRAM_WEBHOOK_URL"] and call["secret_token"] == SECRET
    assert call["allowed_updates"] == ALLOWED_UPDATES and int(call["max_connections"]) == 1
    assert str(call.get("drop_pending_updates")).lower() in ("false", "none")
    await tg.message("hello by hook", user_id=OWNER)
    assert await tg.wait_texts(1) == ["echo: hello by hook"]
    await daemon.settled()
    assert tg.texts() == ["echo: hello by hook"]
    assert tg.calls_of("getUpdates") == []
    assert all(status == 200 for _, status in tg.deliveries)
    health = await healthz(daemon)
    assert health["mode"] == "webhook" and health["ok"], health
    webhook = health["webhook"]
    assert isinstance(webhook, dict) and webhook["url_set"] and webhook["last_error_message"] is None


async def test_a_wrong_or_missing_secret_is_refused(tg, in_process_factory):
    """401 and not processed; bad bodies are 4xx (413 over 1 MB, 400 not an update); a
    well-formed update aiogram cannot read is passed over with 200 (logged), like polling does."""
    hook = webhook_env()
    daemon = in_process_factory(**hook)
    with structlog.testing.capture_logs() as events:
        await daemon.start()
        url = hook["IVA_TELEGRAM_WEBHOOK_URL"]
        forged = {"update_id": 777_001, **tg.make_message("forged", user_id=OWNER)}
        body = json.dumps(forged).encode()
        assert await post(url, body, {}) == 401
        assert await post(url, body, {"X-Telegram-Bot-Api-Secret-Token": "wrong-secret"}) == 401
        assert await post(url, body, {"X-Telegram-Bot-Api-Secret-Token": SECRET[:-1]}) == 401
        right = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        assert await post(url, b"{not json", right) == 400
        assert await post(url, b'{"no": "update_id"}', right) == 400
        assert await post(url, b"[1, 2]", right) == 400
        assert await post(url, b"[" * 100_000 + b"]" * 100_000, right) == 400  # nested past the stack: no 500
        assert await post(url, b'{"update_id": 1, "pad": "' + b"x" * (1024 * 1024) + b'"}', right) == 413
        assert await post(url, b'{"update_id": 777002, "message": {"message_id": "x"}}', right) == 200
        await tg.message("the real one", user_id=OWNER)
        await tg.wait_texts(1)
        await daemon.settled()
    assert tg.texts() == ["echo: the real one"]  # the forged message never reached eve
    logged = {e["event"] for e in events}
    assert "webhook_unauthorized" in logged and "webhook_body_malformed" in logged
    assert "webhook_body_too_large" in logged and "telegram_update_undecodable" in logged
    assert SECRET not in repr(events)  # not even before the redaction the daemon renders with


async def test_a_stranger_by_webhook_is_ignored_but_confirmed(tg, in_process_factory):
    """An update that is not for eve is still taken (200): Telegram must not retry it forever."""
    daemon = in_process_factory(**webhook_env())
    await daemon.start()
    await tg.message("who are you", user_id=STRANGER)
    await daemon.settled()
    assert tg.texts() == [] and all(status == 200 for _, status in tg.deliveries)


async def test_a_commit_not_durable_in_time_answers_503_and_the_retry_joins_it(tg, in_process_factory):
    """A database locked longer than the commit wait (10 s): 503, Telegram retries; the commit
    goes on, so once the lock is gone the update is stored and answered once."""
    daemon = in_process_factory(**webhook_env())
    with structlog.testing.capture_logs() as events:
        await daemon.start()
        db = sqlite3.connect(daemon.state / "iva.sqlite3", isolation_level=None, timeout=1)
        db.execute("BEGIN IMMEDIATE")
        try:
            await tg.message("slow disk", user_id=OWNER)
            update_id = tg.updates[-1]["update_id"]
            await tg.wait_for(lambda: (update_id, 503) in tg.deliveries, 20, "a 503 for the unstored update")
        finally:
            db.execute("ROLLBACK")
            db.close()
        assert await tg.wait_texts(1) == ["echo: slow disk"]
        await daemon.settled()
    assert tg.texts() == ["echo: slow disk"]
    assert "webhook_commit_slow" in {e["event"] for e in events}


def test_webhook_settings_are_validated_with_the_others():
    base = {"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_EVE_URL": "http://127.0.0.1:1", "IVA_OWNER_IDS": "1"}
    settings = Settings.from_env(base)
    assert settings.webhook.url is None and settings.webhook.listen == "127.0.0.1:8443"
    good = {**base, "IVA_TELEGRAM_WEBHOOK_URL": "https://bot.example.org/tg", "IVA_TELEGRAM_WEBHOOK_SECRET": "s_1-A"}
    assert Settings.from_env(good).webhook.secret == "s_1-A"
    assert "s_1-A" not in repr(Settings.from_env(good))
    cases = [
        ({"IVA_TELEGRAM_WEBHOOK_URL": "https://bot.example.org/tg"}, "needs IVA_TELEGRAM_WEBHOOK_SECRET"),
        ({**good, "IVA_TELEGRAM_WEBHOOK_SECRET": "has space"}, "1-256 characters of A-Z a-z 0-9 _ -"),
        ({**good, "IVA_TELEGRAM_WEBHOOK_SECRET": "x" * 257}, "1-256 characters"),
        ({"IVA_TELEGRAM_WEBHOOK_SECRET": "abc"}, "IVA_TELEGRAM_WEBHOOK_URL is not"),
        ({**good, "IVA_TELEGRAM_WEBHOOK_URL": "bot.example.org"}, "is not an https URL"),
        ({**good, "IVA_WEBHOOK_LISTEN": "8443"}, "IVA_WEBHOOK_LISTEN='8443' must be host:port"),
        ({**good, "IVA_WEBHOOK_LISTEN": "127.0.0.1:8787"}, "different ports"),
    ]
    for extra, expected in cases:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({**base, **extra, "IVA_TURN_POLICY": "sometimes"})
        assert any(expected in p for p in caught.value.problems), (extra, caught.value.problems)
        assert any("IVA_TURN_POLICY" in p for p in caught.value.problems)  # listed with the others


async def test_a_secret_header_that_is_not_utf8_is_401_not_500(tg, in_process_factory, caplog):
    """Bytes that are not UTF-8 in the secret header are a wrong secret: 401, no traceback."""
    hook = webhook_env()
    daemon = in_process_factory(**hook)
    caplog.set_level(logging.DEBUG)  # aiohttp's "Error handling request" with its traceback, had it failed
    await daemon.start()
    port = int(hook["IVA_WEBHOOK_LISTEN"].rpartition(":")[2])
    body = json.dumps({"update_id": 777_003, **tg.make_message("forged", user_id=OWNER)}).encode()
    for secret in (b"\xff\xfe", SECRET.encode() + b"\x80", b"\xc3("):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST " + HOOK_PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nX-Telegram-Bot-Api-Secret-Token: " + secret
                     + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        status = await reader.readuntil(b"\r\n")
        writer.close()
        assert status.startswith(b"HTTP/1.1 401"), (secret, status)
    await daemon.settled()
    assert tg.texts() == [] and "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)


def test_an_http_webhook_url_is_refused_unless_a_local_bot_api_server_calls_it():
    """Telegram's Bot API refuses http:// at setWebhook (a retry loop): refused at the start; a local
    Bot API server (``--local``) takes plain http, so it passes there."""
    base = {"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_EVE_URL": "http://127.0.0.1:1", "IVA_OWNER_IDS": "1",
            "IVA_TELEGRAM_WEBHOOK_URL": "http://bot.example.org/tg", "IVA_TELEGRAM_WEBHOOK_SECRET": SECRET}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(base)
    assert any("'http://bot.example.org/tg' is not https" in p for p in caught.value.problems), caught.value.problems
    local = Settings.from_env({**base, "IVA_TELEGRAM_API_URL": "http://127.0.0.1:8081"})
    assert local.webhook.url == "http://bot.example.org/tg"


class _Ingest:
    """What the webhook's run loop reads of the ingest: the bot, the watchdog's mark, the album clock."""

    def __init__(self, bot: Bot) -> None:
        self.bot = bot
        self.alive_at = 0.0
        self.transitions = SimpleNamespace(caught_up=lambda: None)


async def test_a_busy_port_or_a_refused_set_webhook_is_retried_with_the_watchdog_fed(tg):
    """Neither is a wedged loop: a restart fails the same way. Tried again (backoff.WEBHOOK), the
    watchdog's mark kept fresh meanwhile; served and set once the operator fixed it."""
    settings = Settings.from_env({"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url,
                                  "IVA_EVE_URL": "http://127.0.0.1:1", "IVA_OWNER_IDS": "1"})
    bot = make_bot(settings)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    ingest = _Ingest(bot)
    hook = Webhook(ingest, url=f"http://127.0.0.1:{port}{HOOK_PATH}", secret=SECRET,  # type: ignore[arg-type]
                   listen=f"127.0.0.1:{port}", retry=Backoff(base=0.2, cap=0.4, jitter=0.0))
    tg.fail("setWebhook", 400, "Bad Request: bad webhook: Failed to resolve host", times=3)
    run = asyncio.create_task(hook.run())
    try:
        await tg.wait_for(lambda: ingest.alive_at > 0, 10, "the watchdog fed while the port is busy")
        fed = ingest.alive_at
        await tg.wait_for(lambda: ingest.alive_at > fed, 10, "fed again at the next try")
        assert tg.calls_of("setWebhook") == []  # nothing set before it listens
        holder.close()
        await tg.wait_for(lambda: len(tg.calls_of("setWebhook")) >= 2, 10, "setWebhook tried again")
        fed = ingest.alive_at
        await tg.wait_for(lambda: ingest.alive_at > fed and tg.webhook is None, 10, "fed while it is refused")
        await tg.wait_for(lambda: tg.webhook is not None, 10, "set once Telegram takes it")
        assert len(tg.calls_of("setWebhook")) == 4
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        holder.close()
        await bot.session.close()


async def test_metrics_in_webhook_mode_are_the_webhooks(tg, in_process_factory):
    """iva_telegram_mode says which mode runs; in webhook mode the delivery's age and Telegram's view
    are exported (the poll's age, which grows there, is not what an alert should read)."""
    daemon = in_process_factory(listen=True, **webhook_env())
    await daemon.start()
    await tg.message("hello by hook", user_id=OWNER)
    await tg.wait_texts(1)
    await daemon.settled()
    async with aiohttp.ClientSession() as session, session.get(daemon.api_url + "/metrics") as answer:
        text = await answer.text()
    values = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
              if line.startswith("iva_")}
    assert values['iva_telegram_mode{mode="webhook"}'] == 1 and 'iva_telegram_mode{mode="polling"}' not in values
    assert values["iva_webhook_healthy"] == 1 and values["iva_webhook_pending_updates"] >= 0  # as Telegram last said
    assert 0 <= values["iva_webhook_delivery_age_seconds"] < 30
