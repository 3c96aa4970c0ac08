"""/notes in Telegram beside the owner API (SPEC N9, seed 000), in process: the real store,
ingest and commands on the harness; the owner API's routes on an aiohttp test server over the
same notebook."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bridge.web.owner_api import OwnerApi
from tests.daemons import API_TOKEN
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness

A = str(OWNER)
HEADERS = {"Authorization": f"Bearer {API_TOKEN}"}


@pytest.fixture
async def h(tmp_path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    await harness.start()
    try:
        await tg.message("hello", user_id=OWNER)
        await harness.settled()
        yield harness
    finally:
        await harness.stop()


@pytest.fixture
async def api(h: Harness) -> AsyncIterator[TestClient[Any, Any]]:
    assert h.s.notebook is not None
    app = web.Application()
    OwnerApi(API_TOKEN, h.s.notebook, h.s.store).routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client


async def look(h: Harness, tg: FakeTelegram, command: str = "/notes") -> str:
    await tg.message(command, user_id=OWNER)
    await h.settled()
    return tg.texts(OWNER)[-1]


async def listing(api: TestClient[Any, Any]) -> dict[str, Any]:
    response = await api.get(f"/v1/chats/{OWNER}/notes", headers=HEADERS)
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


async def test_notes_and_the_owner_api_share_one_seen_mark(h, tg, api):
    """N9: one server-side seen mark for every client. A look through /notes is a look for the
    API (its notes are no longer new), and the API's POST …/seen is a look for /notes."""
    assert h.s.notebook is not None
    await h.s.notebook.save(A, "shop", "milk", description="shopping list", author="owner")
    before = await listing(api)
    assert before["seen_at"] is None and before["notes"][0]["new"]
    assert "1 new, 0 changed" in await look(h, tg) and "🆕 shop" in tg.texts(OWNER)[-1]
    after = await listing(api)
    assert after["seen_at"] is not None and not after["notes"][0]["new"]

    response = await api.put(f"/v1/chats/{OWNER}/notes/shop", json={"body": "milk, eggs"}, headers=HEADERS)
    assert response.status == 200
    assert (await listing(api))["notes"][0]["new"]
    response = await api.post(f"/v1/chats/{OWNER}/notes/seen", headers=HEADERS)
    assert response.status == 200
    seen = (await response.json())["seen_at"]
    text = await look(h, tg)
    assert "0 new, 0 changed" in text and "• shop — shopping list" in text  # the API's look counted
    assert (await listing(api))["seen_at"] >= seen


async def test_a_notes_name_shows_the_date_of_its_last_change(h, tg):
    """N9: /notes <name> says when the note was last changed, in UTC, beside its diff."""
    notebook = h.s.notebook
    assert notebook is not None
    made, _ = await notebook.save(A, "goal", "run 5 km", description="this month's goal", author="owner")
    await h.until(lambda: time.time() > made.updated_at + 0.01, what="a later instant")
    changed, _ = await notebook.save(A, "goal", "run 10 km", author="owner")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(changed.updated_at))
    text = await look(h, tg, "/notes goal")
    first = text.splitlines()[0]
    assert first == f"📝 goal — this month's goal · updated {when}", first
    assert "run 10 km" in text and "- run 5 km" in text and "+ run 10 km" in text
