"""Fuzz: hypothesis-generated eve lines and Telegram updates, and a Telegram fault storm (R6)."""

from __future__ import annotations

import asyncio
import json

from aiogram.types import Message, User
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eve_client as eve
from bridge.intake.addressing import classify
from bridge.intake.describe import QUOTE_LIMIT, describe, quoted
from tests.conftest import OWNER

ME = User(id=123456, is_bot=True, first_name="Iva", username="iva_test_bot")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)), st.sampled_from(eve.STREAM_VERSIONS))
def test_any_stream_line_parses_or_is_reported(line, version):
    for result in eve.parse_lines([line], version=version, first=5):
        assert isinstance(result, eve.Event | eve.Malformed)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["turn.completed", "message.completed", "step.completed", "input.requested",
                        "compaction.requested", "session.waiting", "new.thing"]),
       json_values, json_values)
def test_v26_events_never_raise_on_odd_data(type_, data, meta_extra):
    raw = {"type": type_, "data": data if isinstance(data, dict) else {"x": data},
           "meta": {"id": "evt_1", "deliveryIds": meta_extra if isinstance(meta_extra, list) else []}}
    events = eve.parse_lines([json.dumps(raw)], version=26)
    assert all(isinstance(e, eve.Event) for e in events)
    assert any(isinstance(e, eve.TurnEnded) for e in events) is (type_ == "turn.completed")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["turn.started", "turn.settled", "content.delta", "content.completed",
                                 "usage.recorded", "interaction.opened", "context.started", "context.settled",
                                 "call.requested", "delivery.consumed", "delivery.settled", "new.thing"]),
                min_size=1, max_size=4),
       json_values, json_values, st.booleans())
def test_v27_facts_never_raise_on_odd_data(types, data, scope, progress):
    facts = [{"type": t, "data": data if isinstance(data, dict) else {"x": data},
              "scope": scope} for t in types]
    raw = {"progress": facts[0]} if progress else {"at": "x", "facts": facts}
    events = eve.parse_lines([json.dumps(raw)], version=27, first=3)
    assert all(isinstance(e, eve.Event) and e.position.line == 3 for e in events)
    assert [e.position for e in events] == sorted({e.position for e in events})


entity = st.fixed_dictionaries({
    "type": st.sampled_from(["mention", "bot_command", "text_mention", "bold", "url"]),
    "offset": st.integers(min_value=0, max_value=60), "length": st.integers(min_value=1, max_value=30),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=60), entities=st.lists(entity, max_size=4),
       chat_type=st.sampled_from(["private", "group", "supergroup"]), thread=st.none() | st.integers(1, 99),
       topic=st.booleans(), reply=st.booleans(), quote=st.none() | st.text(max_size=1100))
def test_classify_never_raises(text, entities, chat_type, thread, topic, reply, quote):
    raw = {"message_id": 1, "date": 0, "chat": {"id": -5 if chat_type != "private" else 5, "type": chat_type},
           "from": {"id": 5, "is_bot": False, "first_name": "A"}, "text": text, "entities": entities}
    if thread is not None:
        raw["message_thread_id"] = thread
    if topic:
        raw["is_topic_message"] = True
    if reply:
        raw["reply_to_message"] = {"message_id": thread or 2, "date": 0, "chat": raw["chat"],
                                   "from": {"id": ME.id, "is_bot": True, "first_name": "Iva"}}
    if quote is not None:
        raw["quote"] = {"text": quote, "position": 0}
    message = Message.model_validate(raw)
    inbound = classify(message, ME)
    assert inbound.address.thread_id != 1
    assert (inbound.address.thread_id is not None) <= bool(topic)
    context = quoted(message, ME)  # issue 14: the reply's context never raises, and is capped
    assert describe(message) is None
    assert context is None or len(context.text) <= QUOTE_LIMIT + 1


async def test_telegram_fault_storm_loses_nothing(tg, fake_eve, in_process):
    """R6: 30% of sendMessage and getUpdates calls fail (5xx, 429, dropped): every reply arrives once, in order."""
    tg.start_storm(0.3, {"sendMessage", "getUpdates"})
    for n in range(12):
        await tg.message(f"storm {n}", user_id=OWNER)
        await asyncio.sleep(0.05)  # pacing: the messages arrive over several polls, not in one batch

    def done():
        got = " ".join(tg.texts())
        return all(f"storm {n}" in got for n in range(12))

    await tg.wait_for(done, 90, "all answered through the storm")
    await in_process.settled(60)  # through the storm too: retries can take a while
    assert tg.storm_hits > 3
    words = " ".join(tg.texts()).replace("echo: ", "").split()
    numbers = [int(w) for w in words if w.isdigit()]
    assert numbers == list(range(12))  # each once, in order


def _odd_update(rng) -> dict:
    """A random, sometimes malformed-but-valid Telegram update of the kinds a bot can receive."""
    user = {"id": rng.choice([OWNER, 2, 666, 777]), "is_bot": rng.random() < 0.1, "first_name": "X"}
    chat = rng.choice([{"id": user["id"], "type": "private"}, {"id": -100, "type": "supergroup", "title": "G"},
                       {"id": -200, "type": "channel", "title": "C"}])
    text = rng.choice(["", " ", "/", "/unknown@other_bot", "@iva_test_bot", "/compact@iva_test_bot extra",
                       "привет 😀" * rng.randint(1, 3), "x" * rng.randint(0, 5000), "/new@iva_test_bot"])
    message: dict = {"message_id": rng.randint(1, 10**6), "date": 0, "chat": chat}
    if rng.random() < 0.9:
        message["from"] = user
    if rng.random() < 0.8:
        message["text"] = text
        if rng.random() < 0.5:
            message["entities"] = [{"type": rng.choice(["bot_command", "mention", "bold", "text_mention"]),
                                    "offset": rng.randint(0, 50), "length": rng.randint(1, 40),
                                    **({"user": user} if rng.random() < 0.3 else {})}]
    else:
        message[rng.choice(["sticker", "location", "contact", "dice"])] = rng.choice([
            {"file_id": "s", "file_unique_id": "s", "type": "regular", "width": 1, "height": 1, "is_animated": False,
             "is_video": False},
        ]) if rng.random() < 0.3 else None
        message = {k: v for k, v in message.items() if v is not None}
    if rng.random() < 0.2:
        message["message_thread_id"] = rng.choice([1, 5, 99])
        message["is_topic_message"] = rng.random() < 0.5
    kind = rng.choice(["message", "message", "message", "edited_message", "channel_post", "callback_query"])
    if kind == "callback_query":
        return {"callback_query": {"id": str(rng.randint(1, 10**9)), "from": user, "chat_instance": "c",
                                   "data": rng.choice(["in:1:0", "in:999:5", "garbage", "in:x:y", "in:1:99"])}}
    return {kind: message}


async def test_random_updates_never_crash_the_daemon(tg, fake_eve, in_process_factory):
    """Odd, unknown and hostile updates: no crash, nothing lost — a real message afterwards is answered."""
    import random

    import structlog

    rng = random.Random(4242)
    bridge = in_process_factory()
    with structlog.testing.capture_logs() as events:
        await bridge.start()
        await tg.add_updates([_odd_update(rng) for _ in range(60)])
        await tg.wait_for(lambda: tg.confirmed > max(u["update_id"] for u in tg.updates), 30, "all confirmed")
        assert not bridge.h.ingest.done()  # the polling loop runs on: the daemon did not exit
        await tg.message("still alive?", user_id=OWNER)
        # It may share a turn with an odd message still waiting in the queue (batching).
        await tg.wait_for(lambda: any(t.startswith("echo: ") and "still alive?" in t for t in tg.texts()), 30,
                          "the real message answered")
    assert "ingest_update_failed" not in {e["event"] for e in events}
