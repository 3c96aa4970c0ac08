"""What the person sends arrives whole (issue 14): replies and quotes, and locations, venues,
contacts, polls, dice and stickers as text — in process on the real store and the fakes.

Each checks what the fake eve was sent (the turn's text) and that the person got the answer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bridge.storage.payloads import QueuedMessage, Reply, decode
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_ID, BOT_USERNAME, FakeTelegram
from tests.harness import OWNER, Harness
from tests.scenarios import GROUP, answered, replied, said, write

BOB = {"id": 7, "is_bot": False, "first_name": "Bob", "last_name": "Stone"}
IVA = {"id": BOT_ID, "is_bot": True, "first_name": "Iva", "username": BOT_USERNAME}


# -- replies and quotes ------------------------------------------------------------------------


@pytest.mark.parametrize("group", [False, True], ids=["private", "group"])
async def test_a_reply_to_the_assistants_answer_quotes_it_as_yours(harness: Harness, tg: FakeTelegram,
                                                                   fake_eve: FakeEve, group: bool):
    """The answer replied to goes to eve before the person's words, framed, its author "you"
    (in a group the reply is what addresses the bot)."""
    await write(tg, "and tomorrow?", group=group, reply_to_bot=True)
    who = "Ann: " if group else ""
    assert await answered(harness, tg, fake_eve, group=group) == \
        f"> (replying to you) earlier answer\n{who}and tomorrow?"


@pytest.mark.parametrize("group", [False, True], ids=["private", "group"])
async def test_a_partial_quote_wins_over_the_whole_text(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve,
                                                        group: bool):
    """The part the person quoted goes, not the whole message, marked as a quote."""
    whole = "Paris is lovely in spring.\nRome is better in autumn."
    await write(tg, "why autumn?", group=group, extra={
        "reply_to_message": replied(IVA, GROUP if group else OWNER, text=whole),
        "quote": {"text": "Rome is better in autumn.", "position": 27, "is_manual": True}})
    who = "Ann: " if group else ""
    assert await answered(harness, tg, fake_eve, group=group) == \
        f"> (quoting you) Rome is better in autumn.\n{who}why autumn?"


async def test_a_long_replied_to_text_is_capped_with_an_ellipsis(harness: Harness, tg: FakeTelegram,
                                                                 fake_eve: FakeEve):
    """At most 1 000 characters of the message replied to, then "…"; lines keep their mark."""
    long = "a" * 600 + "\n" + "b" * 900
    await write(tg, "shorter please", group=False, extra={"reply_to_message": replied(IVA, OWNER, text=long)})
    text = await answered(harness, tg, fake_eve, group=False)
    assert text == "> (replying to you) " + "a" * 600 + "\n> " + "b" * 399 + "…\nshorter please"


async def test_a_reply_to_ones_own_file_names_it_and_does_not_send_it_again(harness: Harness, tg: FakeTelegram,
                                                                            fake_eve: FakeEve):
    """In private the author is named by first name; the document is named, never re-sent."""
    tg.files["doc9"] = b"never fetched"
    ann = {"id": OWNER, "is_bot": False, "first_name": "Ann", "last_name": "Lee"}
    await write(tg, "what did I send?", group=False, extra={"reply_to_message": replied(
        ann, OWNER, caption="the report", document={"file_id": "doc9", "file_unique_id": "d9",
                                                    "file_name": "q3.pdf", "mime_type": "application/pdf"})})
    assert await answered(harness, tg, fake_eve, group=False) == \
        "> (replying to \"Ann\") [document: q3.pdf] the report\nwhat did I send?"
    assert tg.calls_of("getFile") == []
    assert all(isinstance(b["message"], str) for s in fake_eve.sessions.values() for b in s.sends)


async def test_in_a_group_a_reply_to_someone_else_names_them_and_their_photo(harness: Harness, tg: FakeTelegram,
                                                                             fake_eve: FakeEve):
    """A mention that replies to another member's photo: their full name, "[photo]", the caption."""
    photo = [{"file_id": "ph7", "file_unique_id": "p7", "width": 800, "height": 600}]
    await write(tg, "what breed is it?", group=True, mention=True,
                extra={"reply_to_message": replied(BOB, GROUP, photo=photo, caption="my cat")})
    assert await answered(harness, tg, fake_eve, group=True) == \
        "> (replying to \"Bob Stone\") [photo] my cat\nAnn: what breed is it?"
    assert tg.calls_of("getFile") == []


async def test_in_a_group_a_bare_mention_under_a_message_asks_about_it(harness: Harness, tg: FakeTelegram,
                                                                       fake_eve: FakeEve):
    """Only "@bot" in reply to someone's message: the message goes to eve, not the refusal."""
    await write(tg, "", group=True, mention=True,
                extra={"reply_to_message": replied(BOB, GROUP, text="the meeting moved to 5 pm")})
    assert await answered(harness, tg, fake_eve, group=True) == \
        "> (replying to \"Bob Stone\") the meeting moved to 5 pm\nAnn:"


async def test_a_reply_to_a_message_in_another_chat_names_its_author_and_chat(harness: Harness, tg: FakeTelegram,
                                                                              fake_eve: FakeEve):
    """``external_reply``: the quote Telegram sends, its author, and the chat it is from."""
    await write(tg, "is that right?", group=False, extra={
        "external_reply": {"origin": {"type": "user", "date": int(time.time()), "sender_user": BOB},
                           "chat": {"id": -100777, "type": "supergroup", "title": "Book club"}, "message_id": 5},
        "quote": {"text": "chapter two is the best", "position": 0}})
    assert await answered(harness, tg, fake_eve, group=False) == \
        '> (quoting "Bob", in "Book club") chapter two is the best\nis that right?'


async def test_in_a_group_a_reply_to_a_channel_post_names_the_channel_and_its_media(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """``external_reply`` from a channel, without a quote: the channel is the author, the photo named."""
    channel = {"id": -100888, "type": "channel", "title": "Daily News"}
    await write(tg, "is this true?", group=True, mention=True, extra={"external_reply": {
        "origin": {"type": "channel", "date": int(time.time()), "chat": channel, "message_id": 3},
        "chat": channel, "message_id": 3,
        "photo": [{"file_id": "ph8", "file_unique_id": "p8", "width": 10, "height": 10}]}})
    assert await answered(harness, tg, fake_eve, group=True) == \
        "> (replying to \"Daily News\") [photo]\nAnn: is this true?"


async def test_in_a_forum_topic_the_topics_first_message_is_not_a_reply(harness: Harness, tg: FakeTelegram,
                                                                         fake_eve: FakeEve):
    """Telegram makes every message of a topic "reply" to the topic's first message: no quote."""
    root = replied(BOB, GROUP, forum_topic_created={"name": "Trip", "icon_color": 0x6FB9F0})
    root["message_id"] = 7
    await write(tg, "hello", group=True, mention=True, thread_id=7, is_topic=True,
                extra={"reply_to_message": root})
    await harness.settled()
    assert said(fake_eve) == ["Ann: hello"]


async def test_a_reply_survives_a_restart_before_its_turn(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """The quote is stored with the queued message: the bridge dies while the turn is on its way
    to eve (eve never took it); after the restart the turn still carries the quote."""
    fake_eve.hold_sends = True
    await write(tg, "and tomorrow?", group=False, reply_to_bot=True)
    await harness.until(lambda: fake_eve.held == 1, what="the send at eve")
    await harness.crash()
    fake_eve.hold_sends = False
    fake_eve.release_sends.set()
    await harness.start()
    assert await answered(harness, tg, fake_eve, group=False) == \
        "> (replying to you) earlier answer\nand tomorrow?"


async def test_with_the_immediate_policy_a_steered_reply_carries_its_quote(tmp_path: Path, tg: FakeTelegram,
                                                                           fake_eve: FakeEve):
    """A reply sent while a turn runs goes into that turn (a steer) with its quote."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_TURN_POLICY="immediate")
    await h.start()
    try:
        await write(tg, "slow one [[delay=1]]", group=False)
        await h.until(lambda: any(s.running for s in fake_eve.sessions.values()), what="eve running the turn")
        await write(tg, "and tomorrow?", group=False, reply_to_bot=True)
        await h.settled(30)
        steers = [b for s in fake_eve.sessions.values() for b in s.sends if b.get("turnPolicy") == "steer"]
        assert [b["message"] for b in steers] == ["> (replying to you) earlier answer\nand tomorrow?"]
    finally:
        await h.stop()


def test_a_payload_written_before_replies_decodes_without_one():
    """Rows queued by an older Iva have no "reply": they decode, with none; a reply round-trips."""
    old = {"kind": "message", "text": "hi", "message_id": 3, "user_id": 1, "user_name": "Ann", "owner": True,
           "private": True, "date": None, "attachment": None}
    item = decode(old)
    assert isinstance(item, QueuedMessage) and item.reply is None and item.text == "hi"
    reply = Reply(text="[photo] x", author="Bob", partial=True, where='"Book club"')
    again = decode({**old, "reply": reply.to_dict()})
    assert isinstance(again, QueuedMessage) and again.reply == reply


# -- locations, venues, contacts, polls, dice, stickers ----------------------------------------

KINDS: dict[str, tuple[dict[str, Any], str]] = {
    "location": ({"location": {"latitude": 55.751244, "longitude": 37.618423, "live_period": 900}},
                 "[location: 55.751244, 37.618423 (live for 15 min)]"),
    "venue": ({"location": {"latitude": 55.75393, "longitude": 37.620795},
               "venue": {"location": {"latitude": 55.75393, "longitude": 37.620795}, "title": "Red Square",
                         "address": "Moscow, 109012"}},
              "[venue: Red Square, Moscow, 109012 (55.753930, 37.620795)]"),
    "own contact": ({"contact": {"phone_number": "+15550100", "first_name": "Ann", "last_name": "Lee",
                                 "user_id": OWNER}},
                    "[contact: Ann Lee, +15550100 (their own number)]"),
    "someone's contact": ({"contact": {"phone_number": "+15550199", "first_name": "Bob", "user_id": 7}},
                          "[contact: Bob]"),
    "poll": ({"poll": {"id": "p1", "question": "Lunch?", "total_voter_count": 0, "is_closed": False,
                       "is_anonymous": True, "type": "regular", "allows_multiple_answers": True,
                       "allows_revoting": True, "members_only": False,
                       "options": [{"persistent_id": "o1", "text": "Pizza", "voter_count": 0},
                                   {"persistent_id": "o2", "text": "Sushi", "voter_count": 0}]}},
             "[poll, several answers allowed: Lunch?\n1. Pizza\n2. Sushi]"),
    "dice": ({"dice": {"emoji": "🎲", "value": 4}}, "[dice 🎲: 4]"),
    "sticker": ({"sticker": {"file_id": "st", "file_unique_id": "st", "type": "regular", "width": 512,
                             "height": 512, "is_animated": False, "is_video": False, "emoji": "👍",
                             "set_name": "HotCherry"}},
                '[sticker 👍 from the set "HotCherry"]'),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("group", [False, True], ids=["private", "group"])
async def test_shared_things_go_to_eve_as_text(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve,
                                               kind: str, group: bool):
    """Not refused: a short text describing them (in a group, replying to the bot addresses it);
    a contact's phone only when it is the sender's own."""
    fields, described = KINDS[kind]
    await write(tg, None, group=group, reply_to_bot=group, extra=fields)
    text = await answered(harness, tg, fake_eve, group=group)
    assert text == ("> (replying to you) earlier answer\nAnn: " if group else "") + described
    assert "+15550199" not in text


async def test_a_shared_things_caption_is_kept(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """Whatever text comes with it follows the description."""
    await write(tg, None, group=False, extra={"location": {"latitude": 1.5, "longitude": 2.25,
                                                           "horizontal_accuracy": 20.4},
                                              "caption": "meet me here"})
    assert await answered(harness, tg, fake_eve, group=False) == \
        "[location: 1.500000, 2.250000 (±20 m)]\nmeet me here"


async def test_in_a_group_an_unaddressed_location_is_ignored(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """Group chatter stays chatter: a location that neither replies to the bot nor mentions it."""
    await write(tg, None, group=True, extra=KINDS["location"][0])
    await harness.settled()
    assert said(fake_eve) == [] and tg.texts() == []


async def test_a_video_is_still_refused_with_a_short_answer(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """What Iva cannot read yet still gets the one-line answer, never silence, and nothing goes to eve."""
    await write(tg, None, group=False, extra={"video": {"file_id": "v1", "file_unique_id": "v1", "width": 1,
                                                        "height": 1, "duration": 3}})
    await harness.settled()
    assert said(fake_eve) == []
    assert len(tg.texts()) == 1 and tg.texts()[0].startswith("I can read text, photos and documents")
