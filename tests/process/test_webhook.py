"""Webhook mode (issue 15) where it needs a real process: a SIGKILL between the commit and the
200, a switch of modes across SIGTERM and SIGKILL, and ``iva check`` (the CLI). The rest runs in
process: tests/intake/test_webhook.py.

The fake Bot API delivers like Telegram once a webhook is set: one update at a time, in order,
the same one again after a non-2xx answer or a connection error; a 2xx confirms it.
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from tests.conftest import OWNER
from tests.daemons import WEBHOOK_SECRET as SECRET
from tests.daemons import check_env, healthz, iva_check, webhook_env


@pytest.mark.process
async def test_sigkill_between_commit_and_200_loses_nothing_and_answers_once(tg, fake_eve, daemon_factory):
    """The test holds the database's write lock, so the daemon is stuck inside its commit (the
    request unanswered) when it is killed; Telegram retries the update after the restart, and it
    is answered once."""
    daemon = daemon_factory(fake_eve.url, fake_eve.token, **webhook_env())
    await daemon.start()
    db = sqlite3.connect(daemon.state / "iva.sqlite3", isolation_level=None, timeout=1)
    db.execute("BEGIN IMMEDIATE")
    handed = len(tg.handed)
    await tg.message("do not lose me", user_id=OWNER)
    update_id = tg.updates[-1]["update_id"]
    await tg.wait_for(lambda: len(tg.handed) > handed, 10, "the update POSTed")
    # Kept: pacing, so the kill most likely finds the daemon inside its commit, blocked on our
    # lock with the request unanswered. The assertions hold for an earlier kill as well.
    await asyncio.sleep(0.5)
    await daemon.kill()
    db.execute("ROLLBACK")
    db.close()
    assert tg.confirmed <= update_id  # never answered 2xx
    await daemon.start()
    assert await tg.wait_texts(1) == ["echo: do not lose me"]
    await daemon.settled()
    assert tg.texts() == ["echo: do not lose me"]
    assert tg.delivered(update_id) >= 2  # delivered again after the restart


@pytest.mark.process
async def test_switching_webhook_polling_webhook_loses_nothing(tg, fake_eve, daemon_factory):
    """Messages written while the daemon is down, in each mode, are answered after the switch:
    polling deletes the webhook (keeping its updates) and gets them by getUpdates; webhook mode
    sets it again and gets them delivered."""
    hook = webhook_env()
    daemon = daemon_factory(fake_eve.url, fake_eve.token, **hook)
    await daemon.start()
    await tg.message("one (webhook)", user_id=OWNER)
    await tg.wait_texts(1)
    await daemon.settled()
    assert await daemon.terminate() == 0
    await tg.message("two (sent while down, webhook set)", user_id=OWNER)

    for name in hook:  # polling from now on
        daemon.env.pop(name)
    await daemon.start()
    assert tg.calls_of("deleteWebhook")[-1].get("drop_pending_updates") in (False, "false", "False", None)
    assert await tg.wait_texts(2) == ["echo: one (webhook)", "echo: two (sent while down, webhook set)"]
    await daemon.settled()
    health = await healthz(daemon)
    assert health["mode"] == "polling" and health["webhook"] is None
    await daemon.kill()
    await tg.message("three (sent while down, polling)", user_id=OWNER)

    daemon.env.update(hook)  # webhook again
    await daemon.start()
    await tg.wait_texts(3)
    await daemon.settled()
    assert tg.texts() == ["echo: one (webhook)", "echo: two (sent while down, webhook set)",
                          "echo: three (sent while down, polling)"]
    assert "telegram_poll_conflict" not in daemon.logs()


@pytest.mark.process
async def test_check_wants_https_and_no_delivery_error(tg, fake_eve):
    """`iva check`: one line per problem, never a traceback."""
    env = check_env(tg, fake_eve.url, fake_eve.token, IVA_NOTES_ENABLED="0",
               IVA_TELEGRAM_WEBHOOK_URL="http://bot.example.org/tg", IVA_TELEGRAM_WEBHOOK_SECRET=SECRET)
    code, out = await iva_check(env)
    assert code != 0 and "IVA_TELEGRAM_WEBHOOK_URL=http://bot.example.org/tg is not https" in out, out
    assert "Traceback" not in out and SECRET not in out
    https = {**env, "IVA_TELEGRAM_WEBHOOK_URL": "https://bot.example.org/tg"}
    code, out = await iva_check(https)
    assert code == 0 and "not set yet" in out, out
    tg.webhook = {"url": "https://bot.example.org/tg", "secret_token": SECRET}  # set, deliveries failing
    tg.webhook_error = (1_700_000_000, "Connection refused")
    code, out = await iva_check(https)
    assert code != 0 and "last delivery to https://bot.example.org/tg failed" in out, out
    assert "Connection refused" in out and "Traceback" not in out
    tg.webhook_error = None
    code, out = await iva_check(https)
    assert code == 0 and "ok   webhook: Telegram delivers" in out, out
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_NOTES_ENABLED="0"))
    assert code == 0 and "Iva polls, so it deletes it at start" in out, out
    tg.garble["getWebhookInfo"] = 1  # an answer it cannot read: one line
    code, out = await iva_check(https)
    assert code != 0 and "getWebhookInfo failed" in out and "Traceback" not in out, out
