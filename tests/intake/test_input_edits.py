"""Edits and albums arrive whole (issue 14), in process on the real store and the fakes.

Edits (the rule is :mod:`bridge.intake.edits`): a waiting message is corrected in place; one eve has
gets a correction after it, once; an unchanged edit and a live location's moves do nothing; an
edit racing the claim of its message makes one turn with one of the two texts. Albums: one turn
with every file, even when the bridge is killed between two parts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridge.chat.compose import CORRECTION
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import OWNER, Harness
from tests.scenarios import GROUP, MENTION, file_parts, kill_during, said, sends

STRANGER = 7


async def say(tg: FakeTelegram, text: str, *, group: bool, **kwargs: Any) -> dict[str, Any]:
    """The owner writes ``text`` (in a group, mentioning the bot); returns the message."""
    if group:
        return await tg.message(f"@{BOT_USERNAME} {text}", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                                entities=MENTION, **kwargs)
    return await tg.message(text, user_id=OWNER, **kwargs)


async def edit(tg: FakeTelegram, message: dict[str, Any], text: str, *, group: bool) -> dict[str, Any]:
    return await tg.edit(message, f"@{BOT_USERNAME} {text}" if group else text)


def as_eve_sees(text: str, *, group: bool) -> str:
    return f"Ann: {text}" if group else text


def running(fake_eve: FakeEve) -> bool:
    return any(s.running for s in fake_eve.sessions.values())


GROUPS = pytest.mark.parametrize("group", [False, True], ids=["private", "group"])


# -- edits ---------------------------------------------------------------------------------------


@GROUPS
async def test_an_edit_of_a_waiting_message_replaces_it_in_place(harness: Harness, tg: FakeTelegram,
                                                                 fake_eve: FakeEve, group: bool):
    """Queued behind a running turn, the message is corrected before its turn: one turn with the
    corrected words; its 👀 receipt stays, not given twice."""
    await say(tg, "first [[delay=1.5]]", group=group)
    await harness.until(lambda: running(fake_eve), what="eve running the first turn")
    waiting = await say(tg, "teh second", group=group)
    await edit(tg, waiting, "the second", group=group)
    await harness.settled()
    assert said(fake_eve) == [as_eve_sees("first [[delay=1.5]]", group=group),
                              as_eve_sees("the second", group=group)]
    chat = GROUP if group else OWNER
    assert len(tg.texts(chat)) == 2 and tg.texts(chat)[1].endswith(" the second")
    receipts = [c for c in tg.calls_of("setMessageReaction") if c["message_id"] == waiting["message_id"]]
    assert len(receipts) == 1


@GROUPS
async def test_an_edit_of_a_message_eve_has_goes_as_a_correction_once(harness: Harness, tg: FakeTelegram,
                                                                      fake_eve: FakeEve, group: bool):
    """Answered already: the new words go as a new message marked as a correction — once; the
    same edit redelivered (a restart before its offset passed) does nothing."""
    first = await say(tg, "meet at 5", group=group)
    await harness.settled()
    edited = await edit(tg, first, "meet at 6", group=group)
    await harness.settled()
    await tg.add_update({"edited_message": edited})  # Telegram delivers the same edit again
    await harness.settled()
    assert said(fake_eve) == [as_eve_sees("meet at 5", group=group),
                              as_eve_sees(f"{CORRECTION} meet at 6", group=group)]
    assert len(tg.texts(GROUP if group else OWNER)) == 2


@GROUPS
async def test_an_edit_that_changes_nothing_does_nothing(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve,
                                                         group: bool):
    """The same words again (Telegram sends an edit for a changed link preview, say): no turn,
    whether eve has the message or it still waits."""
    first = await say(tg, "hello", group=group)
    await harness.settled()
    await edit(tg, first, "hello", group=group)
    await harness.settled()
    await say(tg, "slow [[delay=1]]", group=group)
    await harness.until(lambda: running(fake_eve), what="eve running")
    waiting = await say(tg, "waiting", group=group)
    await edit(tg, waiting, "waiting", group=group)
    await harness.settled()
    assert said(fake_eve) == [as_eve_sees(t, group=group) for t in ("hello", "slow [[delay=1]]", "waiting")]


async def test_each_new_edit_is_its_own_correction(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """Two edits after the answer: two corrections, each compared with the last words eve has."""
    first = await say(tg, "a", group=False)
    await harness.settled()
    await tg.edit(first, "b")
    await harness.settled()
    await tg.edit(first, "b")  # unchanged from the last correction
    await tg.edit(first, "c")
    await harness.settled()
    assert said(fake_eve) == ["a", f"{CORRECTION} b", f"{CORRECTION} c"]


async def test_with_the_immediate_policy_a_correction_joins_the_running_turn(tmp_path: Path, tg: FakeTelegram,
                                                                             fake_eve: FakeEve):
    """The turn policy decides: eve has the message and is still answering it — the correction is
    steered into that turn (with the queue policy it waits for the next, as any message)."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_TURN_POLICY="immediate")
    await h.start()
    try:
        first = await say(tg, "plan the trip [[delay=1.5]]", group=False)
        await h.until(lambda: running(fake_eve) and (h.maybe_chat() or _NONE).deliveries, what="eve has it")
        await tg.edit(first, "plan the trip to Rome [[delay=1.5]]")
        await h.settled(30)
        steers = [b["message"] for b in sends(fake_eve) if b.get("turnPolicy") == "steer"]
        assert steers == [f"{CORRECTION} plan the trip to Rome [[delay=1.5]]"]
        assert len(sends(fake_eve)) == 2
    finally:
        await h.stop()


_NONE = SimpleNamespace(deliveries=[])


async def test_a_live_locations_moves_make_no_turns(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """Telegram sends a live location's new position as an edit every few seconds: the location
    goes to eve once; its moves are not corrections."""
    live = await tg.message(None, user_id=OWNER, extra={"location": {"latitude": 1.0, "longitude": 2.0,
                                                                     "live_period": 900}})
    await harness.settled()
    for step in range(1, 4):
        await tg.edit(live, extra={"location": {"latitude": 1.0 + step / 1000, "longitude": 2.0,
                                                "live_period": 900}})
    await harness.settled()
    assert len(said(fake_eve)) == 1 and said(fake_eve)[0].startswith("[location: 1.000000, 2.000000")


async def test_edits_from_strangers_and_of_unaddressed_group_messages_are_ignored(harness: Harness,
                                                                                  tg: FakeTelegram,
                                                                                  fake_eve: FakeEve):
    """The same rules as for messages: a stranger's edit, an edit of group chatter."""
    chatter = await tg.message("lunch anyone?", user_id=OWNER, chat_id=GROUP, chat_type="supergroup")
    stranger = await tg.message("hi bot", user_id=STRANGER)
    await harness.settled()
    await tg.edit(chatter, "lunch at noon?")
    await tg.edit(stranger, "hi bot!")
    await harness.settled()
    assert said(fake_eve) == [] and tg.texts() == []


async def test_an_edit_racing_the_send_of_its_message_makes_one_turn(harness: Harness, tg: FakeTelegram,
                                                                     fake_eve: FakeEve):
    """The race, made deterministic: the message is claimed and its send is at eve (held) when
    the edit arrives. eve gets the words that were sent — one turn, one of the two texts, never
    a correction after it."""
    fake_eve.hold_sends = True
    first = await say(tg, "send the report", group=False)
    await harness.until(lambda: fake_eve.held == 1, what="the send at eve")
    await tg.edit(first, "send the report today")
    await harness.until(tg.all_confirmed, what="the edit committed")
    fake_eve.release_sends.set()
    await harness.settled()
    assert said(fake_eve) == ["send the report"]
    assert tg.texts() == ["echo: send the report"]


async def test_an_edit_racing_a_send_that_never_arrives_is_sent_corrected_after_a_restart(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """The same race, but the process dies while the send is held (eve never takes it): after
    the restart the message goes once, with the corrected words."""
    fake_eve.hold_sends = True
    first = await say(tg, "send the report", group=False)
    await harness.until(lambda: fake_eve.held == 1, what="the send at eve")
    await tg.edit(first, "send the report today")
    await harness.until(tg.all_confirmed, what="the edit committed")
    await harness.crash()
    await harness.until(lambda: fake_eve.held_callers_gone() == 1, what="the caller gone")
    fake_eve.hold_sends = False
    fake_eve.release_sends.set()
    await harness.until(lambda: fake_eve.held_callers_gone() == 0, what="eve dropped the dead send")
    await harness.start()
    await harness.settled()
    assert said(fake_eve) == ["send the report today"]
    assert tg.texts() == ["echo: send the report today"]


async def test_an_edit_just_before_the_claim_makes_one_turn_with_the_new_text(tmp_path: Path, tg: FakeTelegram,
                                                                              fake_eve: FakeEve):
    """The other side of the race: the message and its edit in one getUpdates answer, the claim
    right behind them — the edit is committed first (ingest and the claim are transactions on one
    writer): one turn, the corrected words."""
    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        message = await tg.message("draft", user_id=OWNER, _add=False)
        edited = {**json.loads(json.dumps(message)), "text": "final", "edit_date": message["date"] + 1}
        await tg.add_updates([{"message": message}, {"edited_message": edited}])
        await h.settled()
        assert said(fake_eve) in (["final"], ["draft"])
        assert len(sends(fake_eve)) == 1
    finally:
        await h.stop()


# -- albums ----------------------------------------------------------------------------------------


@GROUPS
@pytest.mark.parametrize("batch", [True, False], ids=["one-poll", "apart"])
async def test_an_album_goes_as_one_turn_with_every_file_and_the_caption(harness: Harness, tg: FakeTelegram,
                                                                         fake_eve: FakeEve, group: bool,
                                                                         batch: bool):
    """Three photos with a caption on the first: one turn, three file parts, the caption once
    (in a group the caption's mention addresses the bot; the other parts need none)."""
    where: dict[str, Any] = {"chat_id": GROUP, "chat_type": "supergroup"} if group else {}
    caption = f"@{BOT_USERNAME} our trip" if group else "our trip"
    extra = {"caption_entities": MENTION} if group else {}
    if batch:
        await tg.album(["p1", "p2", "p3"], captions={0: caption}, batch=True, user_id=OWNER, extra=extra, **where)
    else:
        first = await tg.album(["p1"], captions={0: caption}, user_id=OWNER, extra=extra, **where)
        await asyncio.sleep(0.3)
        await tg.album(["p2", "p3"], media_group_id=first[0]["media_group_id"], user_id=OWNER, **where)
    await harness.settled()
    assert said(fake_eve) == [as_eve_sees("our trip", group=group)]
    assert [len(parts) for parts in file_parts(fake_eve)] == [3]


async def test_a_kill_between_two_album_parts_loses_none_and_makes_one_turn(harness: Harness, tg: FakeTelegram,
                                                                            fake_eve: FakeEve, tmp_path: Path):
    """SIGKILL right after the first part is on disk, before the second: Telegram redelivers the
    rest after the restart (which took longer than the settling time), and the album still goes
    as one turn with all three files."""
    first = await tg.album(["k1"], captions={0: "three photos"}, user_id=OWNER)
    await harness.until(lambda: harness.observe("SELECT count(*) FROM diskqueue_messages WHERE state = 0")[0][0] == 1,
                        what="the first part on disk")
    image = tmp_path / "image"
    group = first[0]["media_group_id"]
    assert await kill_during(harness, image, 1, lambda: tg.album(["k2", "k3"], media_group_id=group,
                                                                  user_id=OWNER, batch=True))
    await asyncio.sleep(1.2)  # a restart takes longer than an album takes to settle
    await harness.restart_from(image)
    await harness.settled()
    assert said(fake_eve) == ["three photos"]
    assert [len(parts) for parts in file_parts(fake_eve)] == [3]
    assert len(tg.texts()) == 1 and tg.texts()[0].startswith("echo: three photos")


async def test_with_the_immediate_policy_an_album_steers_whole(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """An album arriving while a turn runs joins it as one steer with every file, not part by part."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_TURN_POLICY="immediate")
    await h.start()
    try:
        await say(tg, "slow one [[delay=2.5]]", group=False)
        await h.until(lambda: running(fake_eve), what="eve running the turn")
        first = await tg.album(["s1"], captions={0: "look"}, user_id=OWNER)
        await asyncio.sleep(0.3)
        await tg.album(["s2", "s3"], media_group_id=first[0]["media_group_id"], user_id=OWNER)
        await h.settled(30)
        steers = [b for b in sends(fake_eve) if b.get("turnPolicy") == "steer"]
        assert len(steers) == 1
        assert len([p for p in steers[0]["message"] if p.get("type") != "text"]) == 3
    finally:
        await h.stop()


async def test_an_edit_of_a_message_never_queued_is_an_ordinary_message_once(harness: Harness, tg: FakeTelegram,
                                                                              fake_eve: FakeEve):
    """Sent before the bot was there (or pruned since): the edit is an ordinary message; the same
    words edited again do nothing, new words are a correction of it."""
    old = await tg.message("hi", user_id=OWNER, _add=False)
    await tg.edit(old, "hello")
    await harness.settled()
    await tg.edit(old, "hello")
    await tg.edit(old, "hello there")
    await harness.settled()
    assert said(fake_eve) == ["hello", f"{CORRECTION} hello there"]
