"""V4 on eve 1.x: every follow-up carries an idempotencyKey made of what makes the message unique
in Iva's queue (bot, chat, message ids; the session), never a key on a create (1.x answers 400),
and eve answers a repeated key with the first delivery and no second turn. V3: nothing the suite
sends the fake 1.x is refused for an unknown field."""

from __future__ import annotations

from pathlib import Path

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
