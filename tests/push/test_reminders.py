"""Reminders (issue 21, W7-W9) in process: a reminder falls due as a pushed turn of its chat, on an
injected wall clock (no real waiting: the test moves the clock and asks the reminders to fire
what is due); set by the owner API, by the assistant's MCP tools in owner turns, and listed and
cancelled by /reminders."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge.app import notebook_config
from bridge.notebook import Notebook
from bridge.push.reminders import ASSISTANT_MAX, ASSISTANT_RECURRING, MAX_PER_CHAT, Reminders
from bridge.push.turns import PushError
from bridge.web.listener import Listener
from bridge.web.mcp import McpServer
from bridge.web.owner_api import OwnerApi
from bridge.web.push_api import PushApi
from tests.fakes.clock import SteppedWall
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

A = str(OWNER)
API_TOKEN = "owner-api-token-0123456789"
T0 = datetime(2026, 12, 2, 8, 0, tzinfo=UTC).timestamp()  # a Wednesday, 08:00 UTC


class Clock:
    """The wall clock a test moves (steps forward and back like an NTP step or an operator's date)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()


def fired(h: Harness) -> list[sqlite3.Row]:
    """The pushed turns reminders made, in order."""
    return h.observe("SELECT id, payload, state FROM diskqueue_messages WHERE json_extract(payload, '$.source') "
                     "= 'reminder' ORDER BY id")


def pushed_contexts(fake: FakeEve) -> list[str]:
    return [str(b.get("clientContext")) for s in fake.sessions.values() for b in s.sends
            if "[pushed turn]" in str(b.get("clientContext") or "")]


@pytest.fixture
async def clocked(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[tuple[Harness, Clock]]:
    clock = Clock()
    h = Harness(tmp_path / "state", tg, fake_eve)
    h.wall = clock
    await h.start()
    await tg.message("hello", user_id=OWNER)
    await h.settled()
    try:
        yield h, clock
    finally:
        await h.stop()


def reminders(h: Harness) -> Reminders:
    assert h.reminders is not None
    return h.reminders


async def test_a_reminder_falls_due_as_a_pushed_turn_once(clocked: tuple[Harness, Clock], tg: FakeTelegram,
                                                          fake_eve: FakeEve):
    h, clock = clocked
    r = await reminders(h).set(A, "tell me to stretch", at=utc(T0 + 120))
    assert r.next_at == T0 + 120
    assert await reminders(h).fire_due() == []
    clock.now = T0 + 121
    assert await reminders(h).fire_due() == [A]
    await h.settled()
    assert tg.texts(OWNER) == ["echo: hello", "echo: tell me to stretch"]
    [context] = pushed_contexts(fake_eve)
    assert f"reminder {r.id}" in context and "late" not in context
    assert await reminders(h).fire_due() == []
    assert await reminders(h).active(A) == []
    assert len(fired(h)) == 1


async def test_a_reminder_due_while_iva_was_down_fires_once_at_start_marked_late(
        clocked: tuple[Harness, Clock], tg: FakeTelegram, fake_eve: FakeEve):
    h, clock = clocked
    await reminders(h).set(A, "water the plants", at=utc(T0 + 60))
    await reminders(h).set(A, "hourly check", cron="0 * * * *")
    await h.stop()
    clock.now = T0 + 5 * 3600 + 30  # down for five hours: five hourly instants missed
    await h.start()
    await reminders(h).fire_due()
    await h.settled()
    rows = fired(h)
    assert sorted(json.loads(r["payload"])["text"] for r in rows) == ["hourly check", "water the plants"]
    assert all(json.loads(r["payload"])["late"] for r in rows)
    assert all("It is late" in c for c in pushed_contexts(fake_eve))
    assert sorted(tg.texts(OWNER)[1:]) == ["echo: hourly check", "echo: water the plants"]
    [hourly] = await reminders(h).active(A)
    assert hourly.next_at == T0 + 6 * 3600  # the next after now, not the missed ones
    await h.stop()
    await h.start()
    assert await reminders(h).fire_due() == []  # a restart fires nothing again
    assert len(fired(h)) == 2


async def test_a_clock_stepped_forward_gives_one_catch_up_and_back_never_fires_twice(
        clocked: tuple[Harness, Clock], tg: FakeTelegram):
    h, clock = clocked
    r = await reminders(h).set(A, "every minute", cron="* * * * *")
    assert r.next_at == T0 + 60
    clock.now = T0 + 60
    await reminders(h).fire_due()
    assert len(fired(h)) == 1
    clock.now = T0 + 3 * 3600 + 5  # stepped three hours forward: 180 minutes passed at once
    await reminders(h).fire_due()
    await reminders(h).fire_due()
    assert len(fired(h)) == 2  # one catch-up, not 180
    [now] = await reminders(h).active(A)
    # The catch-up is the first missed instant (marked late); the next is the first after now.
    assert now.last_fired == T0 + 120 and now.next_at == T0 + 3 * 3600 + 60
    assert json.loads(fired(h)[-1]["payload"])["late"] is True
    clock.now = T0 + 90  # stepped back to before both fires
    assert await reminders(h).fire_due() == []
    # F12: the next instant comes from the later of now and the last real fire (not the hour ahead).
    [now] = await reminders(h).active(A)
    assert now.next_at == T0 + 180
    clock.now = T0 + 3 * 3600 + 30  # forward again: one catch-up of an instant never fired
    await reminders(h).fire_due()
    dues = [json.loads(r["payload"])["due"] for r in fired(h)]
    assert dues == [T0 + 60, T0 + 120, T0 + 180]  # none twice
    await h.settled()
    keys = [h.observe("SELECT dedupe_key FROM diskqueue_messages WHERE id = ?", (r["id"],))[0][0] for r in fired(h)]
    assert len(set(keys)) == 3 and all(k.startswith(f"push:{A}:reminder:{now.id}:") for k in keys)


async def test_a_daily_reminder_stepped_back_over_its_instant_does_not_fire_again(clocked: tuple[Harness, Clock]):
    h, clock = clocked
    r = await reminders(h).set(A, "standup", cron="0 10 * * *", tz="Europe/Berlin")  # 09:00 UTC in winter
    assert r.next_at == T0 + 3600
    clock.now = T0 + 3600 + 5
    await reminders(h).fire_due()
    clock.now = T0 + 3600 - 600  # ten minutes back, before 10:00 Berlin again
    clock.now += 700
    assert await reminders(h).fire_due() == []
    assert len(fired(h)) == 1
    [after] = await reminders(h).active(A)
    assert after.next_at == T0 + 3600 + 86400


async def test_cron_reads_in_its_zone_across_a_dst_change(clocked: tuple[Harness, Clock]):
    h, clock = clocked
    clock.now = datetime(2026, 3, 28, 12, 0, tzinfo=UTC).timestamp()  # the day before Berlin springs forward
    r = await reminders(h).set(A, "morning", cron="0 9 * * *", tz="Europe/Berlin")
    assert utc(r.next_at or 0) == "2026-03-29T07:00:00+00:00"  # 09:00 CEST (UTC+2) on the 29th
    clock.now = datetime(2026, 3, 27, 12, 0, tzinfo=UTC).timestamp()
    r2 = await reminders(h).set(A, "morning", cron="0 9 * * *", tz="Europe/Berlin")
    assert utc(r2.next_at or 0) == "2026-03-28T08:00:00+00:00"  # 09:00 CET (UTC+1) on the 28th


async def test_a_blocked_chat_pauses_its_reminders_and_a_new_message_resumes_them(
        clocked: tuple[Harness, Clock], tg: FakeTelegram):
    h, clock = clocked
    await reminders(h).set(A, "ping", at=utc(T0 + 60))
    await h.s.transitions.mark_blocked(A, "Forbidden: bot was blocked by the user")
    clock.now = T0 + 120
    assert await reminders(h).fire_due() == []
    [paused] = await reminders(h).active(A)
    assert paused.paused and paused.as_record()["paused"] is True
    await tg.message("I'm back", user_id=OWNER)
    await h.settled()
    assert await reminders(h).fire_due() == [A]
    await h.settled()
    assert tg.texts(OWNER)[-1] == "echo: ping"


async def test_limits_and_bad_input_are_errors_naming_the_field(clocked: tuple[Harness, Clock]):
    h, _clock = clocked
    rm = reminders(h)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"text": "", "at": utc(T0 + 60)}, "text"), ({"text": None, "at": utc(T0 + 60)}, "text"),
        ({"text": "x" * 2001, "at": utc(T0 + 60)}, "text"),
        ({"text": "x"}, "at"), ({"text": "x", "at": utc(T0 + 60), "cron": "* * * * *"}, "cron"),
        ({"text": "x", "at": "tomorrow"}, "at"), ({"text": "x", "at": "2026-12-24T09:00:00"}, "at"),
        ({"text": "x", "at": utc(T0 - 1)}, "at"), ({"text": "x", "at": 5}, "at"),
        ({"text": "x", "cron": "* * * *"}, "cron"), ({"text": "x", "cron": "0 0 * * * *"}, "cron"),
        ({"text": "x", "cron": "61 * * * *"}, "cron"), ({"text": "x", "cron": "@daily"}, "cron"),
        ({"text": "x", "cron": 5}, "cron"), ({"text": "x", "cron": "* * * * *", "tz": "Mars/Olympus"}, "tz"),
        ({"text": "x", "cron": "* * * * *", "tz": ""}, "tz"), ({"text": "x", "cron": "* * * * *", "tz": 3}, "tz"),
    ]
    for args, field in bad:
        with pytest.raises(PushError) as err:
            await rm.set(A, args.pop("text"), **args)
        assert err.value.field == field, (args, field, err.value.field, str(err.value))
    with pytest.raises(PushError) as err:
        await rm.set("999", "x", cron="* * * * *")
    assert err.value.status == 404
    for i in range(MAX_PER_CHAT):
        await rm.set(A, f"r{i}", cron="0 9 * * *")
    with pytest.raises(PushError) as err:
        await rm.set(A, "one too many", cron="0 9 * * *")
    assert err.value.status == 422 and "100" in str(err.value)
    assert len(await rm.active(A)) == MAX_PER_CHAT


async def test_a_kill_at_every_statement_of_a_reminder_fire_fires_it_once(tmp_path: Path, tg: FakeTelegram,
                                                                           fake_eve: FakeEve):
    """The fire commits the pushed turn with the reminder's next instant: killed before any of its
    statements and restarted (the image a SIGKILL leaves), the reminder fires exactly once."""
    clock = Clock()
    h = Harness(tmp_path / "state", tg, fake_eve)
    h.wall = clock
    await h.start()
    try:
        await tg.message("hello", user_id=OWNER)
        await h.settled()
        for k in range(1, 60):
            clock.now = T0 + k * 1000
            r = await reminders(h).set(A, f"fire {k}", at=utc(clock.now + 30))
            clock.now += 31
            assert h.db is not None
            db, image = h.db, tmp_path / f"k{k}"
            db.kill_at, db.image = db.statements + k, image
            try:
                await reminders(h).fire_due()
            except sqlite3.OperationalError:
                pass
            if not db.killed.is_set():
                db.kill_at = None
                await h.settled()
                assert [json.loads(r["payload"])["text"] for r in fired(h)].count(f"fire {k}") == 1
                assert k > 3
                return
            await h.restart_from(image)
            await reminders(h).fire_due()
            await h.settled()
            texts = [json.loads(row["payload"])["text"] for row in fired(h)]
            assert texts.count(f"fire {k}") == 1, (k, texts)
            assert tg.texts(OWNER).count(f"echo: fire {k}") == 1, (k, tg.texts(OWNER))
            assert await reminders(h).get(A, r.id) is not None
        raise AssertionError("more statements than the sweep tried")
    finally:
        await h.stop()


# -- the owner API and /reminders --------------------------------------------------------------

@pytest.fixture
async def api(clocked: tuple[Harness, Clock]) -> AsyncIterator[tuple[Harness, Clock, httpx.AsyncClient]]:
    h, clock = clocked
    assert h.db is not None and h.pushes is not None
    owner = OwnerApi(API_TOKEN, Notebook(h.db, h.s.store, notebook_config(h.settings)), h.s.store)
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[PushApi(owner.guard, h.pushes, reminders(h)).routes])
    await listener.start()
    assert listener._runner is not None
    port = listener._runner.addresses[0][1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"authorization": f"Bearer {API_TOKEN}"}) as client:
            yield h, clock, client
    finally:
        await listener.stop()


async def test_the_owner_api_sets_lists_and_cancels_reminders(api: tuple[Harness, Clock, httpx.AsyncClient]):
    _h, _clock, client = api
    r = await client.post(f"/v1/chats/{A}/reminders", json={"text": "brief", "cron": "30 7 * * 1-5",
                                                            "tz": "Europe/Berlin"})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["next_at"] == "2026-12-03T06:30:00+00:00"
    r = await client.post(f"/v1/chats/{A}/reminders", json={"text": "once", "at": "2026-12-02T10:00:00+01:00"})
    assert r.status_code == 201 and r.json()["next_at"] == "2026-12-02T09:00:00+00:00"
    listed = (await client.get(f"/v1/chats/{A}/reminders")).json()["reminders"]
    assert [(x["text"], x.get("cron"), x.get("at"), x["tz"]) for x in listed] == [
        ("once", None, "2026-12-02T10:00:00+01:00", "UTC"), ("brief", "30 7 * * 1-5", None, "Europe/Berlin")]
    assert (await client.delete(f"/v1/chats/{A}/reminders/{made['id']}")).status_code == 200
    assert (await client.delete(f"/v1/chats/{A}/reminders/{made['id']}")).status_code == 404
    assert len((await client.get(f"/v1/chats/{A}/reminders")).json()["reminders"]) == 1
    for body, field in [({"text": "x", "cron": "bad"}, "cron"), ({"text": "x", "at": "2020-01-01T00:00:00Z"}, "at"),
                        ({"text": "x", "cron": "* * * * *", "tz": "Nowhere/City"}, "tz"),
                        ({"cron": "* * * * *"}, "text"),
                        ({"text": "x", "cron": "* * * * *", "every": "day"}, "every")]:
        r = await client.post(f"/v1/chats/{A}/reminders", json=body)
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
    assert (await client.get("/v1/chats/31337/reminders")).status_code == 404


async def test_reminders_command_lists_them_with_a_cancel_button_each_for_the_owner(
        clocked: tuple[Harness, Clock], tg: FakeTelegram):
    h, _clock = clocked
    await reminders(h).set(A, "water the plants", cron="0 8 * * *")
    await reminders(h).set(A, "call mum", at=utc(T0 + 3600))
    await tg.message("/reminders", user_id=OWNER)
    await h.settled()
    listing = tg.sent(OWNER)[-1]
    assert "call mum" in listing["text"] and "water the plants" in listing["text"]
    labels = [b["text"] for row in listing["reply_markup"]["inline_keyboard"] for b in row]
    assert labels == ["✖ call mum", "✖ water the plants"]
    await tg.press(listing, "✖ call mum", user_id=OWNER)
    await h.settled()
    assert [r.text for r in await reminders(h).active(A)] == ["water the plants"]
    answers = [c for c in tg.calls_of("answerCallbackQuery")]
    assert answers and answers[-1].get("text") == "Reminder cancelled."
    # Russian, too.
    await tg.message("/reminders", user_id=OWNER, language_code="ru")
    await h.settled()
    assert "Напоминания в этом чате (1)" in tg.texts(OWNER)[-1]


async def test_reminders_are_for_the_owner_only(clocked: tuple[Harness, Clock], tg: FakeTelegram):
    h, _clock = clocked
    await tg.message("hi", user_id=FRIEND)
    await h.settled()
    await reminders(h).set(str(FRIEND), "secret plan", cron="0 8 * * *")
    await tg.message("/reminders", user_id=FRIEND)
    await h.settled()
    assert tg.texts(FRIEND)[-1] == "Only the owner can see the reminders." and "secret" not in str(tg.sent(FRIEND)[-1])
    await tg.message("/reminders", user_id=OWNER)
    await h.settled()
    listing = tg.sent(OWNER)[-1]
    assert "secret" not in listing["text"]  # another chat's reminders are not listed here


# -- the assistant's tools ---------------------------------------------------------------------

@pytest.fixture
async def with_tools(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    """The bridge with the notebook on and its MCP server (with the reminder tools) on loopback."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    await h.start()
    assert h.s.notebook is not None
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[McpServer(h.s.notebook, h.s.store, reminders=reminders(h)).routes])
    await listener.start()
    assert listener._runner is not None
    fake_eve.mcp_url = f"http://127.0.0.1:{listener._runner.addresses[0][1]}/mcp"
    try:
        yield h
    finally:
        await listener.stop()
        await h.stop()


async def test_the_assistant_sets_lists_and_cancels_a_reminder_in_an_owner_turn(
        with_tools: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    h = with_tools
    args = {"text": "remind Ann of the dentist", "cron": "0 9 * * 1", "tz": "Europe/Berlin"}
    await tg.message(f"set it [[mcp=chat_reminder_set {json.dumps(args)}]]", user_id=OWNER)
    await h.settled()
    result = fake_eve.mcp_results[-1]
    assert not result.get("is_error") and "chat_reminder_set" in result["listed"], result
    [made] = await reminders(h).active(A)
    assert made.text == "remind Ann of the dentist" and made.author == "assistant" and made.tz == "Europe/Berlin"
    await tg.message("list [[mcp=chat_reminder_list {}]]", user_id=OWNER)
    await h.settled()
    assert made.id in fake_eve.mcp_results[-1]["output"]
    await tg.message('bad [[mcp=chat_reminder_set {"text": "x", "cron": "every day"}]]', user_id=OWNER)
    await h.settled()
    bad = fake_eve.mcp_results[-1]
    assert bad["is_error"] and bad["output"].startswith("cron:") and "five fields" in bad["output"]
    await tg.message(f'cancel [[mcp=chat_reminder_cancel {{"id": "{made.id}"}}]]', user_id=OWNER)
    await h.settled()
    assert not fake_eve.mcp_results[-1].get("is_error") and await reminders(h).active(A) == []


async def test_the_reminder_tools_are_refused_in_a_non_owners_turn(with_tools: Harness, tg: FakeTelegram,
                                                                  fake_eve: FakeEve):
    h = with_tools
    await tg.message('set [[mcp=chat_reminder_set {"text": "x", "cron": "0 9 * * *"}]]', user_id=FRIEND)
    await h.settled()
    result = fake_eve.mcp_results[-1]
    assert "chat_reminder_set" not in result["listed"] and "no tool named" in result["error"]
    assert await reminders(h).active(str(FRIEND)) == []


async def test_a_reminder_fired_turn_is_an_owner_turn_with_the_tools(with_tools: Harness, tg: FakeTelegram,
                                                                    fake_eve: FakeEve):
    """A reminder's turn carries the notebook's block and may use the tools (a recurring reminder
    can cancel itself): the seed's cron chat."""
    h = with_tools
    await tg.message("hello", user_id=OWNER)
    await h.settled()
    assert h.pushes is not None
    await h.pushes.push_turn(A, 'check in [[mcp=chat_reminder_list {}]]')
    await h.settled()
    assert "chat_reminder_list" in fake_eve.mcp_results[-1]["listed"]
    assert not fake_eve.mcp_results[-1].get("is_error")


async def test_retention_prunes_finished_reminders_and_keeps_active_ones(clocked: tuple[Harness, Clock]):
    """F7: a reminder done or cancelled before the window goes; an active one stays, whatever its age."""
    from bridge.storage import retention

    h, clock = clocked
    once = await reminders(h).set(A, "once", at=utc(T0 + 60))
    gone = await reminders(h).set(A, "cancelled", cron="0 9 * * *")
    kept = await reminders(h).set(A, "kept", cron="0 9 * * *")
    await reminders(h).cancel(A, gone.id)
    clock.now = T0 + 61
    await reminders(h).fire_due()
    await h.settled()
    pruned = await retention.prune(h.s.queue, h.s.store, days=1, now=time.time() + 2 * 86_400)
    assert pruned.reminders == 2
    left = {r["id"] for r in h.observe("SELECT id FROM reminders")}
    assert left == {kept.id} and once.id not in left


async def test_the_reminders_loop_fires_on_the_moved_clock_and_wakes_on_a_new_reminder(
        clocked: tuple[Harness, Clock], tg: FakeTelegram):
    """The loop itself: it fires what the (injected) wall clock says is due, and a reminder set
    while it sleeps wakes it to look again. Its sleeps are bounded (here 50 ms), never the wait."""
    import asyncio

    h, clock = clocked
    loop = asyncio.create_task(reminders(h).run(look_every=0.05))
    try:
        await reminders(h).set(A, "loop one", at=utc(T0 + 3600))
        await h.until(lambda: reminders(h).changed.is_set() is False, what="the loop looked")
        assert fired(h) == []
        clock.now = T0 + 3601
        await h.until(lambda: len(fired(h)) == 1, what="fired by the loop")
        await h.settled()
        assert tg.texts(OWNER)[-1] == "echo: loop one"
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_cron_read_in_the_repeated_hour_of_a_dst_fall_back_never_falls_due_in_the_past(
        clocked: tuple[Harness, Clock]):
    """Berlin falls back on 2026-10-25 (03:00 CEST → 02:00 CET): 02:00-03:00 happens twice. Set, or
    caught up after downtime, in the second 02:10, a daily 02:15 is next due tomorrow, never at
    the first 02:15 that passed (which fired at once and then spun on a next instant in the past)."""
    h, clock = clocked
    second_0210 = datetime(2026, 10, 25, 1, 10, tzinfo=UTC).timestamp()  # 02:10 CET, the second one
    clock.now = second_0210
    r = await reminders(h).set(A, "night job", cron="15 2 * * *", tz="Europe/Berlin")
    assert r.next_at is not None and r.next_at > clock.now
    assert utc(r.next_at) == "2026-10-26T01:15:00+00:00"  # 02:15 CET tomorrow
    assert await reminders(h).fire_due() == []
    # Due at the first 02:15 (CEST) while Iva was down; it starts at the second 02:10: one late
    # catch-up, and the next instant is after now.
    clock.now = datetime(2026, 10, 24, 12, 0, tzinfo=UTC).timestamp()
    daily = await reminders(h).set(A, "daily", cron="15 2 * * *", tz="Europe/Berlin")
    assert utc(daily.next_at or 0) == "2026-10-25T00:15:00+00:00"
    clock.now = second_0210
    assert await reminders(h).fire_due() == [A]
    after = await reminders(h).get(A, daily.id)
    assert after is not None and after.next_at is not None and after.next_at > clock.now
    assert await reminders(h).next_due() is not None and (await reminders(h).next_due() or 0) > clock.now
    assert await reminders(h).fire_due() == []
    assert [json.loads(r["payload"])["text"] for r in fired(h)] == ["daily"]


async def test_a_zone_name_that_is_a_directory_or_too_long_is_an_error_naming_tz(
        api: tuple[Harness, Clock, httpx.AsyncClient]):
    """zoneinfo reads a zone name as a path: "Europe" is a directory and a long name too long a
    file name — an OSError, which was a 500 from the owner API (and an internal error on MCP)."""
    h, _clock, client = api
    for zone in ("Europe", "America", "x" * 300):
        r = await client.post(f"/v1/chats/{A}/reminders", json={"text": "x", "cron": "0 9 * * *", "tz": zone})
        assert r.status_code == 400 and r.json()["field"] == "tz", (zone, r.status_code, r.text)
        assert "Unknown time zone" in r.json()["error"]
    assert await reminders(h).active(A) == []


async def test_an_at_past_the_year_9999_in_utc_is_an_error_naming_at_not_a_poisoned_list(
        api: tuple[Harness, Clock, httpx.AsyncClient]):
    """9999-12-31T23:59:59-23:59 parses, but is in the year 10000 in UTC, which no datetime can
    hold: stored, it made the answer a 500 and every later list of the chat's reminders too."""
    _h, _clock, client = api
    r = await client.post(f"/v1/chats/{A}/reminders", json={"text": "x", "at": "9999-12-31T23:59:59-23:59"})
    assert r.status_code == 400 and r.json()["field"] == "at", (r.status_code, r.text)
    listed = await client.get(f"/v1/chats/{A}/reminders")
    assert listed.status_code == 200 and listed.json()["reminders"] == []
    r = await client.post(f"/v1/chats/{A}/reminders", json={"text": "x", "at": "9999-12-31T23:59:59+00:00"})
    assert r.status_code == 201 and r.json()["next_at"] == "9999-12-31T23:59:59+00:00"


GROUP = -1009


async def in_group(h: Harness, tg: FakeTelegram, text: str, user: int = OWNER) -> None:
    from tests.fakes.telegram import BOT_USERNAME

    await tg.message(f"@{BOT_USERNAME} {text}", user_id=user, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}])
    await h.settled()


async def test_reminders_lists_the_next_time_in_the_reminders_own_zone(clocked: tuple[Harness, Clock],
                                                                      tg: FakeTelegram):
    """A person who set 08:00 Berlin reads 08:00, not 2026-12-03T07:00:00+00:00 (which reads as 07:00);
    a one-time reminder shows its time once, in the offset it was given."""
    h, _clock = clocked
    await reminders(h).set(A, "water the plants", cron="0 8 * * *", tz="Europe/Berlin")
    await reminders(h).set(A, "call mum", at="2026-12-02T19:30:00+03:00")
    await tg.message("/reminders", user_id=OWNER)
    await h.settled()
    listing = tg.sent(OWNER)[-1]["text"]
    assert "+00:00" not in listing and "T0" not in listing, listing
    assert "water the plants — 0 8 * * * (Europe/Berlin) — next 2026-12-03 08:00" in listing, listing
    assert "call mum — next 2026-12-02 19:30 (UTC+03:00)" in listing, listing
    await tg.message("/reminders", user_id=OWNER, language_code="ru")
    await h.settled()
    assert "следующее 2026-12-03 08:00" in tg.texts(OWNER)[-1]


async def test_a_non_owner_pressing_a_cancel_button_in_a_group_is_told_only_the_owner_can_cancel(
        clocked: tuple[Harness, Clock], tg: FakeTelegram):
    """The group sees the owner's /reminders list (it is the group's: they fire there); a member
    pressing ✖ cancels nothing and is told who may — not that only the owner can *see* them,
    while they are looking at the list."""
    h, _clock = clocked
    await in_group(h, tg, "hello")
    await reminders(h).set(str(GROUP), "standup", cron="0 9 * * 1-5")
    await tg.message("/reminders", user_id=OWNER, chat_id=GROUP, chat_type="supergroup")
    await h.settled()
    listing = tg.sent(GROUP)[-1]
    assert "standup" in listing["text"]
    await tg.press(listing, "✖ standup", user_id=FRIEND)
    await h.settled()
    assert [r.text for r in await reminders(h).active(str(GROUP))] == ["standup"]
    assert tg.calls_of("answerCallbackQuery")[-1].get("text") == "Only the owner can cancel reminders."
    await tg.press(listing, "✖ standup", user_id=OWNER)
    await h.settled()
    assert await reminders(h).active(str(GROUP)) == []
    assert tg.calls_of("answerCallbackQuery")[-1].get("text") == "Reminder cancelled."


# -- F12: the reminders' clock survives steps ---------------------------------------------------

@pytest.fixture
async def stepped(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[tuple[Harness, SteppedWall]]:
    clock = SteppedWall(T0)
    h = Harness(tmp_path / "state", tg, fake_eve)
    h.wall, h.mono = clock.wall, clock.mono
    await h.start()
    await tg.message("hello", user_id=OWNER)
    await h.settled()
    try:
        yield h, clock
    finally:
        await h.stop()


def dues(h: Harness) -> list[tuple[float, bool]]:
    """Each fire's due instant and whether it was marked late, in order."""
    return [(p["due"], bool(p.get("late"))) for p in (json.loads(r["payload"]) for r in fired(h))]


async def test_a_corrected_forward_step_neither_fires_early_nor_silences_a_recurring_reminder(
        stepped: tuple[Harness, SteppedWall]):
    """F12: the wall clock steps an hour forward while Iva runs and is corrected back. During the
    step nothing fires before its real instant (before: the every-minute one caught up at once,
    marked late, and the one-time one fired half an hour early); after the correction the
    every-minute one goes on each minute (before: silent for the hour of the step)."""
    h, clock = stepped
    await reminders(h).set(A, "every minute", cron="* * * * *")
    await reminders(h).set(A, "once", at=utc(T0 + 1800))
    clock.passes(60)
    await reminders(h).fire_due()
    assert dues(h) == [(T0 + 60, False)]
    clock.step(3600)
    clock.passes(30)
    assert await reminders(h).fire_due() == []
    clock.passes(30)
    await reminders(h).fire_due()
    assert dues(h) == [(T0 + 60, False), (T0 + 120, False)]
    clock.step(-3600)  # corrected
    clock.passes(60)
    await reminders(h).fire_due()
    assert dues(h)[-1] == (T0 + 180, False)
    assert [r.text for r in await reminders(h).active(A)] == ["every minute", "once"]


async def test_after_a_restart_with_the_clock_ahead_is_corrected_the_next_instant_comes_from_now(
        stepped: tuple[Harness, SteppedWall]):
    """F12 across restarts (the steady clock anchors to the wall clock at each start): Iva started
    with the clock an hour ahead computes the every-minute reminder's next instant an hour ahead;
    started again once the clock is corrected, the next instant is recomputed from the later of now
    and the last real fire (before: nothing for an hour)."""
    h, clock = stepped
    r = await reminders(h).set(A, "every minute", cron="* * * * *")
    clock.passes(60)
    await reminders(h).fire_due()
    await h.stop()
    clock.step(3600)
    await h.start()
    await reminders(h).fire_due()  # one catch-up, as for downtime
    assert len(dues(h)) == 2
    ahead = await reminders(h).get(A, r.id)
    assert ahead is not None and ahead.next_at == T0 + 3600 + 120
    await h.stop()
    clock.step(-3600)  # corrected
    clock.passes(30)
    await h.start()
    await reminders(h).fire_due()
    corrected = await reminders(h).get(A, r.id)
    # The catch-up fired T0 + 120 (early, on the clock ahead): the next is the one after it.
    assert corrected is not None and corrected.next_at == T0 + 180
    clock.passes(90)
    await reminders(h).fire_due()
    assert dues(h)[-1] == (T0 + 180, False) and len(dues(h)) == 3


# -- S9: the assistant's own reminders --------------------------------------------------------

@pytest.fixture
async def tools_clocked(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[tuple[Harness, Clock]]:
    """The notebook and its MCP tools on, the reminders on a clock the test moves."""
    clock = Clock()
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_NOTES_ENABLED="1")
    h.wall = clock
    await h.start()
    assert h.s.notebook is not None
    listener = Listener("127.0.0.1:0", store=h.s.store, queue=h.s.queue, ingest=None,  # type: ignore[arg-type]
                        routes=[McpServer(h.s.notebook, h.s.store, reminders=reminders(h)).routes])
    await listener.start()
    assert listener._runner is not None
    fake_eve.mcp_url = f"http://127.0.0.1:{listener._runner.addresses[0][1]}/mcp"
    try:
        yield h, clock
    finally:
        await listener.stop()
        await h.stop()


async def test_a_reminder_the_assistant_set_says_so_when_it_fires_and_the_owners_says_the_owner_did(
        tools_clocked: tuple[Harness, Clock], tg: FakeTelegram, fake_eve: FakeEve):
    """S9: eve is told, in the fired turn's context, that the assistant set the reminder itself (in
    which turn, started by what) and that it is not the owner's instruction; an owner's reminder
    says the owner set it."""
    h, clock = tools_clocked
    args = {"text": "check the build page", "cron": "0 * * * *"}
    await tg.message(f"keep an eye on it [[mcp=chat_reminder_set {json.dumps(args)}]]", user_id=OWNER)
    await h.settled()
    assert not fake_eve.mcp_results[-1].get("is_error"), fake_eve.mcp_results[-1]
    [mine] = await reminders(h).active(A)
    assert mine.author == "assistant" and mine.set_in == f"in a turn at {utc(T0)} started by a message in the chat"
    await reminders(h).set(A, "water the plants", at=utc(T0 + 1800))
    clock.now = T0 + 3600
    await reminders(h).fire_due()
    await h.settled()
    contexts = pushed_contexts(fake_eve)
    [owners] = [c for c in contexts if "the owner set this reminder" in c]
    [assistants] = [c for c in contexts if f"reminder {mine.id}" in c]
    assert "you (the assistant) set this reminder yourself in a turn at 2026-12-02T08:00:00+00:00 started by a " \
           "message in the chat, not the owner" in assistants
    assert "you (the assistant)" not in owners


async def test_what_the_assistant_may_set_on_its_own_is_bounded_in_count_and_rate(
        tools_clocked: tuple[Harness, Clock], tg: FakeTelegram, fake_eve: FakeEve):
    """S9: a recurring reminder of the assistant's falls due at most hourly (a model told to set an
    every-minute one gets an error naming cron); at most 5 recurring and 20 in all of its own per
    chat; the owner's own reminders are not counted against it, nor bounded by it."""
    h, _clock = tools_clocked
    args = {"text": "say hi", "cron": "*/5 * * * *"}
    await tg.message(f"nag me [[mcp=chat_reminder_set {json.dumps(args)}]]", user_id=OWNER)
    await h.settled()
    refused = fake_eve.mcp_results[-1]
    assert refused["is_error"] and refused["output"].startswith("cron:") and "hourly" in refused["output"], refused
    assert await reminders(h).active(A) == []
    with pytest.raises(PushError) as caught:
        await reminders(h).set(A, "twice at nine", cron="0,30 9 * * *", author="assistant")
    assert caught.value.field == "cron"
    for i in range(ASSISTANT_RECURRING):
        await reminders(h).set(A, f"hourly {i}", cron=f"{i} * * * *", author="assistant")
    with pytest.raises(PushError) as caught:
        await reminders(h).set(A, "one more", cron="59 * * * *", author="assistant")
    assert caught.value.field == "cron" and caught.value.code == "too_many"
    await reminders(h).set(A, "the owner's, every minute", cron="* * * * *")  # the owner's: not bounded so
    for i in range(ASSISTANT_MAX - ASSISTANT_RECURRING):
        await reminders(h).set(A, f"once {i}", at=utc(T0 + 3600 + i), author="assistant")
    with pytest.raises(PushError) as caught:
        await reminders(h).set(A, "once more", at=utc(T0 + 7200), author="assistant")
    assert caught.value.field == "chat" and caught.value.code == "too_many"
    assert len(await reminders(h).active(A)) == ASSISTANT_MAX + 1
