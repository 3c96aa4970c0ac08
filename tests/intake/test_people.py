"""What a person meets (issue 24), in process: pairing instead of user ids, invitations, /users.

The real ingest, commands and store on a temp file, the fakes on loopback (tests/harness.py).
Time passing is the stored times aged from outside (a code's expiry, a lock's end), never a
patched clock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.people import MISSES_ALLOWED, digest, link, mint_outside, pairing_note
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import Harness

ANN, BOB, EVE = 11, 22, 33  # nobody of them in the settings


@pytest.fixture
async def bare(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    """The bridge with no IVA_OWNER_IDS and no IVA_ALLOWED_USER_IDS: the first hour."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_OWNER_IDS="", IVA_ALLOWED_USER_IDS="")
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


def age(h: Harness, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Time passes for what is stored: a statement on the state file from outside."""
    conn = sqlite3.connect(h.settings.db_path, timeout=10)
    try:
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def people(h: Harness) -> dict[int, str]:
    return {r["user_id"]: r["role"] for r in h.observe("SELECT user_id, role FROM people")}


async def start(tg: FakeTelegram, user: int, code: str, name: str = "Ann") -> None:
    await tg.message(f"/start {code}", user_id=user, first_name=name)


async def test_the_first_opener_of_the_link_is_the_owner_once_and_after_a_restart(bare: Harness, tg: FakeTelegram):
    code = bare.pairing
    assert code is not None and len(code) >= 22  # 128 bits, urlsafe
    assert link(BOT_USERNAME, code) == f"https://t.me/{BOT_USERNAME}?start={code}"
    rows = bare.observe("SELECT digest FROM pairing_codes")
    assert [r["digest"] for r in rows] == [digest(code)]  # only the hash is kept
    assert code not in Path(bare.settings.db_path).read_bytes().decode("latin-1")

    await tg.message("hello", user_id=ANN)  # a stranger before pairing: ignored, as ever
    await bare.settled()
    assert tg.texts() == []

    await start(tg, ANN, code)
    await bare.settled()
    assert len(tg.texts(ANN)) == 1 and tg.texts(ANN)[0].startswith("You are my owner now")
    assert people(bare) == {ANN: "owner"}

    await start(tg, BOB, code, "Bob")  # the same code again: used
    await bare.settled()
    assert tg.texts(BOB) == ["This link does not work: it was used already, or it expired. Ask for a new one."]
    assert people(bare) == {ANN: "owner"}

    await bare.stop()
    await bare.start()
    assert bare.pairing is None  # an owner: no new link
    await tg.message("hello again", user_id=ANN)
    await bare.settled()
    assert tg.texts(ANN)[-1] == "echo: hello again"
    await tg.message("/status", user_id=ANN)
    await bare.settled()
    assert "Conversation:" in tg.texts(ANN)[-1]


async def test_an_expired_code_does_not_pair_and_the_next_start_makes_a_new_one(bare: Harness, tg: FakeTelegram):
    old = bare.pairing
    assert old is not None
    await tg.message(f"/start {old}", user_id=ANN, chat_id=-1009, chat_type="supergroup")  # not in a group
    await bare.settled()
    assert tg.texts() == [] and people(bare) == {}
    age(bare, "UPDATE pairing_codes SET expires_at = created_at - 1")
    await start(tg, ANN, old)
    await bare.settled()
    assert tg.texts(ANN) == ["This link does not work: it was used already, or it expired. Ask for a new one."]
    assert people(bare) == {}
    await bare.stop()
    await bare.start()
    new = bare.pairing
    assert new is not None and new != old
    assert [r["digest"] for r in bare.observe("SELECT digest FROM pairing_codes")] == [digest(new)]
    await start(tg, ANN, new)
    await bare.settled()
    assert people(bare) == {ANN: "owner"}


async def test_guessed_codes_are_answered_five_times_then_ignored_for_an_hour(bare: Harness, tg: FakeTelegram):
    code = bare.pairing
    assert code is not None
    for n in range(MISSES_ALLOWED):
        await start(tg, EVE, f"guess{n}AAAAAAAAAAAAAAAAA")
    await bare.settled()
    assert len(tg.texts(EVE)) == MISSES_ALLOWED
    await start(tg, EVE, code)  # the right one, while locked: ignored too
    await start(tg, EVE, "guess-more")
    await bare.settled()
    assert len(tg.texts(EVE)) == MISSES_ALLOWED and people(bare) == {}
    age(bare, "UPDATE pairing_misses SET locked_until = ?, first_at = first_at - 7200", (0,))  # an hour later
    await start(tg, EVE, code)
    await bare.settled()
    assert people(bare) == {EVE: "owner"}
    assert tg.texts(EVE)[-1].startswith("You are my owner now")


async def test_an_invite_lets_a_second_person_in_and_a_removed_person_is_refused(bare: Harness, tg: FakeTelegram):
    code = bare.pairing
    assert code is not None
    await start(tg, ANN, code)
    await bare.settled()
    await tg.message("/invite", user_id=BOB, first_name="Bob")  # a stranger's /invite: ignored
    await tg.message("/invite", user_id=ANN)
    await bare.settled()
    assert tg.texts(BOB) == []
    answer = tg.texts(ANN)[-1]
    prefix = f"https://t.me/{BOT_USERNAME}?start="
    assert prefix in answer and "24 h" in answer
    invite = answer.split(prefix, 1)[1].split()[0]
    expires = bare.observe("SELECT expires_at - created_at AS s FROM pairing_codes WHERE kind = 'allowed'")
    assert [r["s"] for r in expires] == [24 * 3600]

    await start(tg, BOB, invite, "Bob")
    await bare.settled()
    assert tg.texts(BOB)[-1].startswith("Welcome!")
    await start(tg, EVE, invite, "Eve")  # one person per link
    await bare.settled()
    assert tg.texts(EVE) == ["This link does not work: it was used already, or it expired. Ask for a new one."]
    assert people(bare) == {ANN: "owner", BOB: "allowed"}
    await tg.message("hi", user_id=BOB, first_name="Bob")
    await bare.settled()
    assert tg.texts(BOB)[-1] == "echo: hi"

    await tg.message("/notes", user_id=BOB)  # allowed, not an owner
    await tg.message("/users", user_id=BOB)
    await bare.settled()
    assert tg.texts(BOB)[-1] == "Only an owner can do this."

    await tg.message("/users", user_id=ANN)
    await bare.settled()
    listing = tg.sent(ANN)[-1]
    assert "Ann (11) — owner, you" in listing["text"] and "Bob (22) — allowed" in listing["text"]
    buttons = [b["text"] for row in listing["reply_markup"]["inline_keyboard"] for b in row]
    assert buttons == ["Remove Bob"]  # never oneself
    await tg.press(listing, "Remove Bob", user_id=BOB)  # not an owner: refused, nothing removed
    await bare.settled()
    assert people(bare) == {ANN: "owner", BOB: "allowed"}
    await tg.press(listing, "Remove Bob", user_id=ANN)
    await bare.settled()
    assert tg.texts(ANN)[-1] == "Bob can no longer talk to me."
    assert people(bare) == {ANN: "owner"}
    answered = [c.get("text") for c in tg.calls_of("answerCallbackQuery")]
    assert answered == ["Only an owner can do this.", "✓"]

    before = len(tg.texts(BOB))
    await tg.message("still there?", user_id=BOB, first_name="Bob")
    await bare.settled()
    assert len(tg.texts(BOB)) == before  # refused: a stranger again


async def test_the_settings_ids_keep_working_win_and_are_not_removable(harness: Harness, tg: FakeTelegram):
    """With IVA_OWNER_IDS no pairing link is made, an owner code minted aside cannot make a
    second owner, and /users lists the settings' people without a button."""
    assert harness.pairing is None
    await tg.message("/users", user_id=1)
    await harness.settled()
    listing = tg.sent(1)[-1]
    assert "1 (1) — owner, from the settings" in listing["text"]
    assert "2 (2) — allowed, from the settings" in listing["text"]
    assert not listing.get("reply_markup")
    async with harness.s.store.db.transaction():
        from bridge.people import Role
        code = await harness.s.people.mint(Role.OWNER, created_by=None, seconds=3600)
    await start(tg, ANN, code)
    await harness.settled()
    assert tg.texts(ANN)[-1].startswith("This link does not work")
    assert people(harness) == {}


async def test_a_crash_between_the_pairing_commit_and_its_answer(bare: Harness, tg: FakeTelegram):
    """The pairing, its dedupe mark and its answer commit together: a crash before the answer
    is sent sends it at the restart — once — and the redelivered update does not use a code twice."""
    code = bare.pairing
    assert code is not None
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(params: dict[str, Any]) -> None:
        held.set()
        await release.wait()  # Telegram answers only once the process is dead: nothing was sent

    tg.hooks["sendMessage"] = hold
    await start(tg, ANN, code)
    await asyncio.wait_for(held.wait(), 15)
    assert people(bare) == {ANN: "owner"}  # committed before the answer
    await bare.crash()
    del tg.hooks["sendMessage"]
    release.set()
    await tg.wait_for(lambda: not tg.in_flight("sendMessage"), 15, "the held call to end")
    assert tg.texts(ANN) == []
    await bare.start()
    await bare.settled()
    assert len(tg.texts(ANN)) == 1 and tg.texts(ANN)[0].startswith("You are my owner now")
    assert people(bare) == {ANN: "owner"}


async def test_status_and_check_make_a_link_while_there_is_no_owner(bare: Harness, tg: FakeTelegram):
    path = bare.settings.db_path
    minted = mint_outside(path)
    assert isinstance(minted, tuple)
    code, url = minted
    assert url == f"https://t.me/{BOT_USERNAME}?start={code}"  # the username the daemon wrote down
    note = pairing_note(path, {})
    assert note is not None and "https://t.me/" in note
    assert pairing_note(path, {"IVA_OWNER_IDS": "5"}) is None
    await start(tg, ANN, code)  # a code made aside works in the running daemon
    await bare.settled()
    assert people(bare) == {ANN: "owner"}
    assert mint_outside(path) is None and pairing_note(path, {}) is None
    assert pairing_note(path.with_name("missing.sqlite3"), {}) is not None


@pytest.mark.process
async def test_iva_run_status_and_check_print_a_link_without_a_user_id(daemon_factory, fake_eve: FakeEve,
                                                                      tg: FakeTelegram):
    """The real process: ``iva run`` with no IVA_OWNER_IDS logs the link and its code; ``iva
    status`` and ``iva check`` print another one beside it; the status one makes its opener the
    owner, after which none of them offers a link."""
    import json
    import os
    import re

    from tests.zygote import spawn_bridge

    daemon = daemon_factory(fake_eve.url, fake_eve.token, IVA_OWNER_IDS="", IVA_ALLOWED_USER_IDS="")
    await daemon.start()
    pattern = rf"https://t\.me/{BOT_USERNAME}\?start=([A-Za-z0-9_-]{{22}})"
    logged = await tg.wait_for(lambda: re.search(pattern, daemon.logs()), 15, "the pairing link in the log")
    line = next(x for x in daemon.logs().splitlines() if "pairing_link" in x)
    assert line.count(logged.group(1)) == 2 and "expires_in_s" in line  # the link and the code alone

    async def run(*argv: str) -> str:
        env = {**os.environ, **daemon.env}
        env.pop("IVA_OWNER_IDS")
        proc = await spawn_bridge(*argv, env=env)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        return out.decode()

    status = json.loads(await run("status", "--json"))
    from_status = re.search(pattern, status["pairing"])
    assert from_status is not None and from_status.group(1) != logged.group(1)
    check = await run("check")
    checked = re.search(pattern, check)
    assert checked is not None and checked.group(1) not in (logged.group(1), from_status.group(1))
    assert "budget prompts" in check  # V6: nobody yet to let the assistant go on past eve's budget

    await start(tg, ANN, from_status.group(1))
    await daemon.settled()
    assert tg.texts(ANN)[-1].startswith("You are my owner now")
    await start(tg, BOB, logged.group(1), "Bob")  # the bot has its owner: every other link is void
    await daemon.settled()
    assert tg.texts(BOB) == ["This link does not work: it was used already, or it expired. Ask for a new one."]
    assert json.loads(await run("status", "--json"))["pairing"] is None
    check = await run("check")
    assert "pairing" not in check and "budget prompts" not in check


async def test_a_quarantined_database_means_a_new_pairing_link(in_process_factory, tg: FakeTelegram):
    """R5 and pairing: the paired owner lives in the state database; a database moved aside at
    start takes them with it, so the fresh one has no owner and the start prints a new link — the
    old owner is a stranger until they pair again."""
    import re

    import structlog

    daemon = in_process_factory(IVA_OWNER_IDS="", IVA_ALLOWED_USER_IDS="")
    daemon.h.check_state = True  # the product's opener at each start: R5's quarantine
    pattern = rf"https://t\.me/{BOT_USERNAME}\?start=([A-Za-z0-9_-]{{22}})"
    with structlog.testing.capture_logs() as events:
        await daemon.start()

        def logs() -> str:
            return "\n".join(repr(e) for e in events)

        first = await tg.wait_for(lambda: re.findall(pattern, logs()), 15, "the pairing link")
        await start(tg, ANN, first[0])
        await daemon.settled()
        assert tg.texts(ANN)[-1].startswith("You are my owner now")
        await daemon.stop()
        (daemon.state / "iva.sqlite3").write_bytes(b"this is not a database at all" * 100)
        for suffix in ("-wal", "-shm"):
            (daemon.state / f"iva.sqlite3{suffix}").unlink(missing_ok=True)
        await daemon.start()
        links = await tg.wait_for(lambda: (found := re.findall(pattern, logs()))[1:] and found, 15, "a new link")
        assert len(links) == 2 and links[-1] != first[0]  # one link per start
        assert list(daemon.state.glob("iva.sqlite3.quarantined-*"))
        before = len(tg.texts(ANN))
        await tg.message("me again", user_id=ANN)
        await daemon.settled()
        assert len(tg.texts(ANN)) == before  # a stranger to the fresh database
        await start(tg, ANN, links[-1])
        await daemon.settled()
        assert tg.texts(ANN)[-1].startswith("You are my owner now")


async def test_a_locked_guessers_flood_costs_no_writes(bare: Harness, tg: FakeTelegram):
    """Once a person's wrong codes are ignored, more of them write nothing: no dedupe mark, no
    miss row, no answer — a flood of /start codes from one account cannot grow the database."""
    for n in range(MISSES_ALLOWED):
        await start(tg, EVE, f"guess{n}AAAAAAAAAAAAAAAAA")
    await bare.settled()
    assert len(tg.texts(EVE)) == MISSES_ALLOWED

    def rows() -> tuple[int, ...]:
        return tuple(int(bare.observe(f"SELECT count(*) FROM {table}")[0][0])
                     for table in ("diskqueue_messages", "outbox", "pairing_misses"))

    before = rows()
    for n in range(40):
        await start(tg, EVE, f"flood{n}BBBBBBBBBBBBBBBBB")
    await bare.settled()
    assert rows() == before
    assert len(tg.texts(EVE)) == MISSES_ALLOWED and people(bare) == {}
