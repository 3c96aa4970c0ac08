"""V4 on eve 1.x: every follow-up carries an idempotencyKey made of what makes the message unique
in Iva's queue (bot, chat, message ids; the session), never a key on a create (1.x answers 400),
and eve answers a repeated key with the first delivery and no second turn. V3: nothing the suite
sends the fake 1.x is refused for an unknown field."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

import eve_client as eve
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, FakeTelegram
from tests.harness import OWNER, Harness

BOT = int(TOKEN.split(":")[0])


async def test_each_send_carries_the_key_of_its_messages(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        first = await tg.message("first", user_id=OWNER)
        await h.settled()
        second = await tg.message("second", user_id=OWNER)
        await h.settled()
    finally:
        await h.stop()
    assert tg.texts() == ["echo: first", "echo: second"]
    sends = fake_eve.sends()
    (session,) = fake_eve.sessions
    keys = [b.get("idempotencyKey") for b in sends]
    assert keys == [f"iva:{BOT}:{OWNER}:{session}:m{m['message_id']}" for m in (first, second)]
    creates = [b for m, p, b in fake_eve.requests if m == "POST" and p == "/eve/v1/session"]
    assert all(not b or "idempotencyKey" not in b for b in creates)  # 1.x refuses it on a create
    assert fake_eve.refused() == []  # V3: no field eve 1.x does not know


async def test_a_repeated_key_is_one_delivery_and_one_turn(fake_eve: FakeEve):
    """What makes an ambiguous send safe to send again (V4): the same key twice, the same receipt,
    one turn — even with other words (an edit is the same message)."""
    async with eve.EveClient(fake_eve.url, token=fake_eve.token) as client:
        sid = await client.create_session()
        first = await client.send(sid, "once", turn_policy="queue", idempotency_key="iva:1:1:m7")
        again = await client.send(sid, "once, edited", turn_policy="queue", idempotency_key="iva:1:1:m7")
        assert first.delivery_id and again.delivery_id == first.delivery_id
        turns = 0
        async for event in client.stream(sid):
            turns += isinstance(event, eve.TurnBegan)
            if isinstance(event, eve.Idle):
                break
        page = await client.read(sid)
    assert turns == 1 and sum(isinstance(e, eve.TurnBegan) for e in page.events) == 1
    assert [e.text for e in page.events if isinstance(e, eve.TextDone)] == ["echo: once"]


class _LostAnswers(httpx.AsyncBaseTransport):
    """Below eve_client, on the way back: the sends of ``lose`` reach eve, which takes them, and
    their answer is lost — ``"drop"``: the connection breaks (a ReadError); ``"hang"``: it never
    comes (the process is then cut, as a restart before the receipt was recorded)."""

    def __init__(self, how: str) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.how = how
        self.lose = 0
        self.hanging = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        is_send = request.method == "POST" and request.url.path.count("/") == 4 and b'"message"' in request.content
        if is_send and self.lose:
            self.lose -= 1
            await response.aread()
            if self.how == "hang":
                self.hanging.set()
                await asyncio.Event().wait()  # until the process is cut
            raise httpx.ReadError("injected: the answer was lost after eve took the send", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _taken(fake: FakeEve, text: str) -> int:
    """How many times eve took a message with ``text`` as a new delivery (a repeated key is not)."""
    return sum(1 for session in fake.sessions.values() for body in session.sends if text in str(body.get("message")))


@pytest.mark.parametrize("how", ["502", "drop", "hang"])
async def test_an_ambiguous_send_is_sent_again_and_answered_once(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve,
                                                                 how: str):
    """V4 at every point a send's answer can be lost after eve took it — a proxy's 502, a broken
    connection, a restart before the receipt was recorded: Iva sends it again with the same key,
    eve answers it with the first delivery, and the person gets one answer (no guessing from the
    stream, no duplicate on eve's side)."""
    transport = _LostAnswers("hang" if how == "hang" else "drop")
    h = Harness(tmp_path / "state", tg, fake_eve, eve_transport=transport)
    await h.start()
    try:
        await tg.message("first", user_id=OWNER)
        await h.settled()
        if how == "502":
            fake_eve.ambiguous_sends = 1
        else:
            transport.lose = 1
        await tg.message("hello", user_id=OWNER)
        if how == "hang":
            await h.until(transport.hanging.is_set, what="eve took the send; its answer hangs")
            await h.crash()
            await h.start()
        await h.settled(30)
        assert tg.texts() == ["echo: first", "echo: hello"]
        assert _taken(fake_eve, "hello") == 1  # eve took it once: no second turn to excuse
        keyed = [b for m, p, b in fake_eve.requests if m == "POST" and b and "hello" in str(b.get("message"))]
        assert len(keyed) == 2 and keyed[0]["idempotencyKey"] == keyed[1]["idempotencyKey"]  # sent again, same key
    finally:
        await h.stop()


async def test_eves_own_500_is_not_resent_at_once(fake_eve: FakeEve):
    """A 500 is eve's answer about the message (F6 counts it), not a lost answer: the client does
    not send it again by itself, key or not."""
    fake_eve.failing_texts = {"poison"}
    async with eve.EveClient(fake_eve.url, token=fake_eve.token) as client:
        sid = await client.create_session()
        with pytest.raises(eve.EveServerError):
            await client.send(sid, "poison", turn_policy="queue", idempotency_key="iva:1:1:m9")
    assert fake_eve.failed_sends == 1
