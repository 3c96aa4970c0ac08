"""Helpers for the tests that run the bridge as a process (tests/conftest.py's ``Daemon``):
``iva check``, the owner API over HTTP, the notes as the daemon's database has them."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import aiohttp

from tests.fakes.telegram import TOKEN as BOT_TOKEN
from tests.zygote import spawn_bridge

OWNER = 1
API_TOKEN = "owner-api-token"


async def iva_check(env: dict[str, str]) -> tuple[int, str]:
    """``iva check`` with ``env``: its exit code and what it printed."""
    proc = await spawn_bridge("check", env={**os.environ, **env})
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


@contextlib.contextmanager
def _logging_put_back() -> Iterator[None]:
    """What ``bridge.log.configure`` sets (structlog's configuration, the root logger's handlers
    and level, the libraries' levels), as it was before: a CLI command run in process configures
    logging for the whole process, and the next test must not log into this one's capture. (No
    bridge logger is first used during ``iva check``, so none is left cached on its processors by
    ``cache_logger_on_first_use``; ``iva run`` caches bridge.app's, which is one reason its tests
    stay processes: tests/process/test_cli.py.)"""
    import logging

    import structlog

    root = logging.getLogger()
    names = ("aiogram", "httpx", "aiohttp", "httpcore", "aiogram.event")
    config, handlers, level = structlog.get_config(), root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in names}
    try:
        yield
    finally:
        structlog.configure(**config)
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, value in levels.items():
            logging.getLogger(name).setLevel(value)


async def iva_check_in_process(monkeypatch: Any, capsys: Any, env: dict[str, str]) -> tuple[int, str]:
    """``iva check`` with ``env`` in this process: ``bridge.cli.main(["check"])`` in a thread (it
    runs its own event loop, so the fakes on the test's loop keep answering), the environment
    ``env`` set for this call only, and what it printed, stdout then stderr (the FAIL lines), as
    the process's merged output has them. The logging it configures is put back afterwards."""
    from bridge.cli import main

    with _logging_put_back():
        capsys.readouterr()
        with monkeypatch.context() as m:
            for name, value in env.items():
                m.setenv(name, value)
            code = await asyncio.wait_for(asyncio.to_thread(main, ["check"]), 60)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def check_env(tg: Any, eve_url: str, eve_token: str, **extra: str) -> dict[str, str]:
    return {"IVA_TELEGRAM_TOKEN": BOT_TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": eve_url,
            "IVA_EVE_TOKEN": eve_token, "IVA_OWNER_IDS": str(OWNER), **extra}


async def api(d, method: str, path: str, body: Any = None, *, token: str | None = API_TOKEN,
              raw: bytes | None = None) -> tuple[int, Any]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        kwargs: dict[str, Any] = {"headers": headers}
        if raw is not None:
            kwargs["data"] = raw
            headers["content-type"] = "application/json"  # S1: a body of another type is a 415
        elif body is not None:
            kwargs["json"] = body
        async with http.request(method, d.api_url + path, **kwargs) as response:
            return response.status, await response.json(content_type=None)


def notes_in_db(d, address: str) -> dict[str, dict[str, Any]]:
    with d.db() as conn:
        return {r["name"]: dict(r) for r in conn.execute("SELECT * FROM notes WHERE address = ?", (address,))}


async def idle(tg, d, address: str = str(OWNER)) -> None:
    await tg.wait_for(lambda: (c := d.chat(address)) is not None and c["status"] == "idle", 30, f"{address} idle")


# -- webhook mode (issue 15): shared by tests/intake/test_webhook.py and tests/process/test_webhook.py

WEBHOOK_SECRET = "hook-Secret_0123456789"
HOOK_PATH = "/telegram/hook"


def webhook_env() -> dict[str, str]:
    """The settings of webhook mode, its listener on a free loopback port."""
    from tests.conftest import free_port

    port = free_port()
    return {"IVA_TELEGRAM_WEBHOOK_URL": f"http://127.0.0.1:{port}{HOOK_PATH}",
            "IVA_TELEGRAM_WEBHOOK_SECRET": WEBHOOK_SECRET, "IVA_WEBHOOK_LISTEN": f"127.0.0.1:{port}"}


async def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session, \
            session.post(url, data=body, headers={"content-type": "application/json", **headers}) as answer:
        return answer.status


async def healthz(d: Any) -> dict[str, object]:
    """``/healthz`` of a daemon or an InProcess (made with its listener)."""
    async with aiohttp.ClientSession() as session, session.get(d.api_url + "/healthz") as answer:
        return dict(await answer.json())
