"""F14: a storage fault on the owner and push APIs is a JSON 503 with a retry hint (never
aiohttp's text 500 with a traceback), and nothing was written then: a push without a key retried
after it is one turn, a reminder one reminder. In process, the API on a real loopback listener,
the database's statements failing as a lock past its timeout would (tests/harness.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bridge.app import notebook_config
from bridge.notebook import Notebook
from bridge.web.listener import Listener
from bridge.web.owner_api import OwnerApi
from bridge.web.push_api import PushApi
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness

A = str(OWNER)
API_TOKEN = "owner-api-token-0123456789"


@pytest.fixture
async def api(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[tuple[Harness, httpx.AsyncClient]]:
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_API_TOKEN=API_TOKEN, IVA_NOTES_ENABLED="1")
    await h.start()
    assert h.db is not None and h.pushes is not None and h.reminders is not None
    owner = OwnerApi(API_TOKEN, Notebook(h.db, h.s.store, notebook_config(h.settings)), h.s.store)
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[owner.routes, PushApi(owner.guard, h.pushes, h.reminders).routes])
    await listener.start()
    assert listener._runner is not None
    port = listener._runner.addresses[0][1]
    await tg.message("hello", user_id=OWNER)
    await h.settled()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"authorization": f"Bearer {API_TOKEN}"}) as client:
            yield h, client
    finally:
        await listener.stop()
        await h.stop()


def _unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["retry-after"] == "5"
    body = r.json()
    assert body["code"] == "storage_unavailable" and body["retry_after"] == 5 and "Traceback" not in r.text


def _pushed(h: Harness) -> int:
    return int(h.observe("SELECT count(*) FROM diskqueue_messages WHERE json_extract(payload, '$.kind') = 'pushed'")
               [0][0])


async def test_a_storage_fault_is_a_json_503_and_a_retried_push_without_a_key_is_one_turn(
        api: tuple[Harness, httpx.AsyncClient]):
    """The read of the new turn's state fails (its statement raises "database is locked"): 503,
    nothing committed; the caller's retry makes one turn (before: a text 500 after the commit, and
    the retry a second turn)."""
    h, client = api
    assert h.db is not None
    h.db.failing["SELECT id, address, payload, state"] = 1
    _unavailable(await client.post(f"/v1/chats/{A}/turns", json={"text": "nightly digest"}))
    assert _pushed(h) == 0
    r = await client.post(f"/v1/chats/{A}/turns", json={"text": "nightly digest"})
    assert r.status_code == 202, r.text
    assert _pushed(h) == 1


async def test_a_retried_reminder_after_a_storage_fault_is_one_reminder(api: tuple[Harness, httpx.AsyncClient]):
    h, client = api
    assert h.db is not None and h.reminders is not None
    h.db.failing["SELECT r."] = 1  # the new reminder read back
    body = {"text": "stretch", "cron": "0 9 * * *"}
    _unavailable(await client.post(f"/v1/chats/{A}/reminders", json=body))
    assert await h.reminders.active(A) == []
    assert (await client.post(f"/v1/chats/{A}/reminders", json=body)).status_code == 201
    assert len(await h.reminders.active(A)) == 1


@pytest.mark.parametrize(("method", "path", "failing"), [
    ("GET", f"/v1/chats/{A}/reminders", "SELECT r."),
    ("POST", f"/v1/chats/{A}/messages", "INSERT"),
    ("GET", f"/v1/chats/{A}/turns/t1", "SELECT id, address, payload, state"),
    ("GET", f"/v1/chats/{A}/notes", "SELECT * FROM chats"),
    ("GET", f"/v1/chats/{A}/spend", "SELECT * FROM spend"),
])
async def test_every_route_answers_a_storage_fault_as_json_503(api: tuple[Harness, httpx.AsyncClient], method: str,
                                                               path: str, failing: str):
    h, client = api
    assert h.db is not None
    h.db.failing[failing] = 1
    content = json.dumps({"text": "the backup is done"}) if method == "POST" else None
    _unavailable(await client.request(method, path, content=content, headers={"content-type": "application/json"}))
