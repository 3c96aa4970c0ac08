"""The chat's transition table (issue 10), on the real store on a temp file.

Every transition is tried from every state: where it is defined it moves the chat to the state
the diagram in ``bridge.chat`` says; where it is not, it refuses (a guard answers None/False, an
ownership or state check raises) and the database is exactly as it was. Then, for every legal
pair, the process is "killed" before each statement of the transition (BEGIN and COMMIT
included): the database image left behind is exactly the state before — never half a move.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge.chat.transitions import ChatState, IllegalTransition, Superseded, Transitions, state_of
from bridge.storage.payloads import QueuedMessage
from bridge.storage.store import CancelMark, Chat, CompactPhase
from eve_client import Position
from tests.harness import Killed, KillingDatabase, open_store

A = "1"
THRESHOLD = 100_000


async def _message(tr: Transitions, n: int) -> None:
    msg = QueuedMessage(text=f"m{n}", message_id=n, user_id=1, user_name="Ann", owner=True, private=True)
    await tr.queue.enqueue(A, msg.to_payload(), dedupe_key=f"tg:1:{n}")


async def _chat(tr: Transitions) -> Chat:
    chat = await tr.store.chat(A)
    assert chat is not None
    return chat


# -- building each state through the transitions themselves --------------------------------

async def _idle(tr: Transitions) -> None:
    await tr.touch(A, 1, None, "en")


async def _turn_no_session(tr: Transitions) -> None:
    await _idle(tr)
    await _message(tr, 1)
    assert await tr.claim_turn(A, limit=10) is not None


async def _turn(tr: Transitions) -> None:
    await _turn_no_session(tr)
    chat = await _chat(tr)
    assert chat.claim
    await tr.session_opened(A, chat.claim, "sess-1")
    await tr.delivered(A, chat.claim, "d1")


async def _idle_session(tr: Transitions) -> None:
    await _turn(tr)
    chat = await _chat(tr)
    assert chat.claim
    await tr.park(A, chat.claim, cursor=Position(5), measurement=50_000, threshold=THRESHOLD, may_compact=True)


async def _compacting_wanted(tr: Transitions) -> None:
    await _turn(tr)
    chat = await _chat(tr)
    assert chat.claim
    parked = await tr.park(A, chat.claim, cursor=Position(5), measurement=120_000, threshold=THRESHOLD,
                           may_compact=True)
    assert parked.compaction_claim is not None


async def _compacting_posted(tr: Transitions) -> None:
    await _compacting_wanted(tr)
    chat = await _chat(tr)
    assert chat.claim
    await tr.compact_posted(A, chat.claim)


async def _compacting_accepted(tr: Transitions) -> None:
    await _compacting_posted(tr)
    chat = await _chat(tr)
    assert chat.claim
    await tr.compact_accepted(A, chat.claim)


async def _compacting_manual(tr: Transitions) -> None:
    await _idle_session(tr)
    assert await tr.capture_manual(A, before=50_000, reply_to=9, lang="en")


async def _released(tr: Transitions) -> None:
    await _compacting_posted(tr)
    chat = await _chat(tr)
    assert chat.claim
    await tr.release(A, chat.claim, Position(6))


async def _new_requested(tr: Transitions) -> None:
    await _idle_session(tr)
    await _message(tr, 2)
    await tr.request_new(A, reply_to=7)


STATES: dict[str, Callable[[Transitions], Awaitable[None]]] = {
    "idle": _idle,
    "idle_session": _idle_session,
    "turn_no_session": _turn_no_session,
    "turn": _turn,
    "compacting_wanted": _compacting_wanted,
    "compacting_posted": _compacting_posted,
    "compacting_accepted": _compacting_accepted,
    "compacting_manual": _compacting_manual,
    "released": _released,
    "new_requested": _new_requested,
}
TURNS = {"turn_no_session", "turn"}
COMPACTING = {"compacting_wanted", "compacting_posted", "compacting_accepted", "compacting_manual"}
IDLE = {"idle", "idle_session"}
EVERY = set(STATES)


# -- the transitions, each with where it is defined and where it leads ------------------------

Call = Callable[[Transitions, Chat], Awaitable[Any]]


@dataclass(frozen=True)
class Row:
    name: str
    call: Call
    legal: set[str]
    to: ChatState | None  # None: the state does not change
    check: Callable[[Chat], bool] = lambda _: True
    guard: bool = False  # refuses by answering None/False (a normal race), not by raising


async def _claim_turn(tr: Transitions, chat: Chat) -> Any:
    await _message(tr, 50)
    return await tr.claim_turn(A, limit=10)


def claim(chat: Chat) -> str:
    return chat.claim or "no-claim"


TABLE = [
    Row("claim_turn", _claim_turn, IDLE | {"released"}, ChatState.TURN, lambda c: c.claim is not None, guard=True),
    Row("session_opened", lambda tr, c: tr.session_opened(A, claim(c), "sess-2"), {"turn_no_session"}, None,
        lambda c: c.eve_session == "sess-2"),
    Row("session_dropped", lambda tr, c: tr.session_dropped(A, claim(c)), TURNS, None,
        lambda c: c.eve_session is None and c.measurement is None),
    Row("delivered", lambda tr, c: tr.delivered(A, claim(c), "d9", {"notes_nudged_upto": 3}), TURNS, None,
        lambda c: "d9" in c.deliveries and c.notes_nudged_upto == 3),
    Row("advance", lambda tr, c: tr.advance(A, claim(c), Position(40)), TURNS | COMPACTING, None,
        lambda c: c.cursor == Position(40)),
    Row("waiting_on_person", lambda tr, c: tr.waiting_on_person(A, claim(c), waiting=True, cursor=Position(41)),
        TURNS, None, lambda c: c.waiting_input and c.cursor == Position(41)),
    Row("in_turn_compacted", lambda tr, c: tr.in_turn_compacted(A, claim(c), Position(42)), TURNS, None,
        lambda c: c.compactions == 1),
    Row("turn_shared", lambda tr, c: tr.turn_shared(A, claim(c)), TURNS, None, lambda c: not c.owner_turn),
    Row("send_failed", lambda tr, c: tr.send_failed(A, claim(c), [1]), TURNS, None),
    Row("claim_steer", lambda tr, c: tr.claim_steer(A, claim(c), limit=10), TURNS, None),
    Row("steer_taken", lambda tr, c: tr.steer_taken(A, claim(c), [1]), TURNS, None),
    Row("steer_returned", lambda tr, c: tr.steer_returned(A, claim(c), [1]), TURNS, None),
    Row("park", lambda tr, c: tr.park(A, claim(c), cursor=Position(43), measurement=1_000, threshold=THRESHOLD,
                                      may_compact=True), TURNS, ChatState.IDLE,
        lambda c: c.turns == 1 and c.measurement == 1_000 and c.claim is None),
    Row("park_into_compaction", lambda tr, c: tr.park(A, claim(c), cursor=Position(43), measurement=200_000,
                                                      threshold=THRESHOLD, may_compact=True),
        TURNS, ChatState.COMPACTING, lambda c: c.compact_phase is CompactPhase.WANTED and c.compact_before == 200_000),
    Row("give_back", lambda tr, c: tr.give_back(A, claim(c)), TURNS, ChatState.IDLE),
    Row("fail_turn", lambda tr, c: tr.fail_turn(A, claim(c)), TURNS, ChatState.IDLE),
    Row("session_lost", lambda tr, c: tr.session_lost(A, c.claim), TURNS | COMPACTING | {"released"}, ChatState.IDLE,
        lambda c: c.reset_mark and c.eve_session is None and c.cursor == Position(0)),
    Row("capture_manual", lambda tr, c: tr.capture_manual(A, before=60_000, reply_to=3, lang="ru"),
        {"idle_session"}, ChatState.COMPACTING, lambda c: c.compact_reply_to == 3, guard=True),
    Row("compact_posted", lambda tr, c: tr.compact_posted(A, claim(c)), {"compacting_wanted", "compacting_manual"},
        None, lambda c: c.compact_phase is CompactPhase.POSTED),
    Row("compact_accepted", lambda tr, c: tr.compact_accepted(A, claim(c)), COMPACTING, None,
        lambda c: c.compact_phase is CompactPhase.ACCEPTED),
    Row("release", lambda tr, c: tr.release(A, claim(c), Position(44)), {"compacting_wanted", "compacting_posted",
                                                               "compacting_manual"},
        ChatState.RELEASED, lambda c: c.claim is None and c.cursor == Position(44)),
    Row("recapture", lambda tr, c: tr.recapture(A), {"released"}, ChatState.COMPACTING,
        lambda c: c.compact_phase is CompactPhase.ACCEPTED, guard=True),
    Row("end_watch", lambda tr, c: tr.end_watch(A), {"released"}, ChatState.IDLE, guard=True),
    Row("want_cancel", lambda tr, c: tr.want_cancel(A, claim(c)), COMPACTING, None,
        lambda c: c.compact_cancel is CancelMark.WANTED),
    Row("cancel_sent", lambda tr, c: tr.cancel_sent(A, claim(c)), set(), None),  # only after want_cancel: below
    Row("want_stop", lambda tr, c: tr.want_stop(A), TURNS | COMPACTING, None, lambda c: c.stop_wanted, guard=True),
    Row("notify_compacting", lambda tr, c: tr.notify_compacting(A), COMPACTING, None, lambda c: c.compact_notified,
        guard=True),
    Row("finish_compaction", lambda tr, c: tr.finish_compaction(A, c.claim, cursor=Position(45), ok=True),
        COMPACTING | {"released"}, ChatState.IDLE, lambda c: c.after_pending and c.compactions == 1),
    Row("finish_compaction_failed", lambda tr, c: tr.finish_compaction(A, c.claim, cursor=Position(45), ok=False),
        COMPACTING | {"released"}, ChatState.IDLE, lambda c: c.compactions == 0),
    Row("drop_compaction", lambda tr, c: tr.drop_compaction(A, claim(c)), COMPACTING, ChatState.IDLE,
        lambda c: c.compact_failures == 0),
    Row("request_new", lambda tr, c: tr.request_new(A, reply_to=8), EVERY, None, lambda c: c.reset_requested),
    Row("new_conversation", lambda tr, c: tr.new_conversation(A), {"new_requested"}, ChatState.IDLE,
        lambda c: not c.reset_requested and c.eve_session is None and c.reset_dropped == 0),
]


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table that holds a chat's state (updated_at aside: a refused
    transition writes nothing, so it would not move either)."""
    conn = sqlite3.connect(path)
    try:
        return {table: [tuple(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1")]
                for table in ("chats", "diskqueue_messages", "outbox", "prompts")}
    finally:
        conn.close()


async def _open(tmp_path: Path) -> tuple[KillingDatabase, Transitions]:
    db, queue, store = await open_store(tmp_path / "state.sqlite3")
    assert isinstance(db, KillingDatabase)
    return db, Transitions(store, queue)


REFUSED = (None, False)


@pytest.mark.parametrize("state", sorted(STATES))
@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
async def test_every_transition_from_every_state(tmp_path: Path, state: str, row: Row) -> None:
    db, tr = await _open(tmp_path)
    try:
        await STATES[state](tr)
        before_chat = await _chat(tr)
        if row.name == "claim_turn":
            await _message(tr, 50)  # something to claim, in every state
            row = Row(row.name, lambda tr, c: tr.claim_turn(A, limit=10), row.legal, row.to, row.check, guard=True)
        before = snapshot(db.path)
        legal = state in row.legal
        if legal:
            result = await row.call(tr, before_chat)
            assert not row.guard or result not in REFUSED, f"{row.name} refused from {state}"
            after = await _chat(tr)
            assert state_of(after) is (row.to or state_of(before_chat)), f"{row.name} from {state}: {state_of(after)}"
            assert row.check(after), f"{row.name} from {state}: {after}"
        elif row.guard:
            assert await row.call(tr, before_chat) in REFUSED, f"{row.name} from {state} should be refused"
        else:
            with pytest.raises(IllegalTransition):
                await row.call(tr, before_chat)
            assert snapshot(db.path) == before, f"{row.name} from {state} wrote something"
    finally:
        await db.close()


@pytest.mark.parametrize("state", sorted(TURNS | COMPACTING))
async def test_a_stale_claim_is_superseded_and_writes_nothing(tmp_path: Path, state: str) -> None:
    """The consumer of an ended busy period cannot write: its claim is not the record's."""
    db, tr = await _open(tmp_path)
    try:
        await STATES[state](tr)
        before = snapshot(db.path)
        with pytest.raises(Superseded):
            await tr.advance(A, "an-old-claim", Position(99))
        assert snapshot(db.path) == before
    finally:
        await db.close()


@pytest.mark.parametrize("state", sorted(COMPACTING))
async def test_cancel_sent_only_after_a_cancel_was_wanted(tmp_path: Path, state: str) -> None:
    db, tr = await _open(tmp_path)
    try:
        await STATES[state](tr)
        chat = await _chat(tr)
        assert chat.claim
        with pytest.raises(IllegalTransition):
            await tr.cancel_sent(A, chat.claim)
        assert await tr.want_cancel(A, chat.claim)
        assert not await tr.want_cancel(A, chat.claim)  # once
        await tr.cancel_sent(A, chat.claim)
        assert (await _chat(tr)).compact_cancel is CancelMark.SENT
        done = await tr.finish_compaction(A, chat.claim, cursor=Position(50), ok=False)
        assert done.outcome == "cancelled"
        assert (await _chat(tr)).compact_failures == 0  # a cancelled compaction is not a failure
    finally:
        await db.close()


async def test_the_fresh_session_set_is_the_same_on_every_way_to_a_new_session(tmp_path: Path) -> None:
    """The copies of "fresh session" once differed (one kept the measurement): now one set."""
    db, tr = await _open(tmp_path)
    try:
        fresh: list[tuple[Any, ...]] = []
        for build, move in (
            (_compacting_manual, lambda c: tr.session_lost(A, c.claim)),
            (_turn, lambda c: tr.session_dropped(A, claim(c))),
            (_new_requested, lambda c: tr.new_conversation(A)),
        ):
            await tr.store.db.execute("DELETE FROM chats")
            await tr.store.db.execute("DELETE FROM diskqueue_messages")
            await build(tr)
            chat = await _chat(tr)
            await tr.store.update_chat(A, compact_failures=2, compact_retry_at=1.0, compaction_disabled=1,
                                       after_pending=1)
            await move(chat)
            c = await _chat(tr)
            fresh.append((c.eve_session, c.cursor, c.measurement, c.compaction_disabled, c.after_pending,
                          c.compact_failures, c.compact_retry_at))
        assert fresh == [(None, Position(0), None, False, False, 0, None)] * 3
    finally:
        await db.close()


def _legal_pairs() -> list[tuple[str, Row]]:
    return [(state, row) for row in TABLE for state in sorted(row.legal) if row.name != "claim_turn"] + [
        (state, TABLE[0]) for state in sorted(TABLE[0].legal)
    ]


@pytest.mark.parametrize(("state", "row"), _legal_pairs(), ids=lambda v: v if isinstance(v, str) else v.name)
async def test_a_kill_at_every_statement_of_a_transition_leaves_the_state_before(
        tmp_path: Path, state: str, row: Row) -> None:
    """SIGKILL before any statement of the transition (BEGIN and COMMIT too): the image is the
    state before, exactly; once it ran to the end, the state after."""
    statements = None
    k = 1
    while statements is None or k <= statements:
        path = tmp_path / (f"k{k}" if statements is not None else "count")
        path.mkdir()
        db, tr = await _open(path)
        try:
            await STATES[state](tr)
            if row.name == "claim_turn":
                await _message(tr, 50)
            chat = await _chat(tr)
            before = snapshot(db.path)
            start = db.statements
            if statements is None:
                await row.call(tr, chat) if row.name != "claim_turn" else await tr.claim_turn(A, limit=10)
                statements = db.statements - start
                assert statements >= 1  # a guarded statement, or BEGIN … COMMIT around several
                continue
            db.kill_at, db.image = start + k, path / "image"
            with pytest.raises(Killed):
                await row.call(tr, chat) if row.name != "claim_turn" else await tr.claim_turn(A, limit=10)
            assert snapshot(path / "image" / db.path.name) == before, f"{row.name} from {state}, killed at {k}"
            k += 1
        finally:
            db.kill_at = None
            await db.close()


async def test_a_compaction_caught_by_the_upgrade_to_the_phase_is_migrated_as_posted(tmp_path: Path) -> None:
    """A busy compaction written before the phase existed must not read as "never requested"
    (that would request it again, C5): the migration marks it posted, so eve's stream decides."""
    from bridge.storage import schema
    from bridge.storage import store as store_module
    from diskqueue import Database, DiskQueue

    db = await Database(tmp_path / "old.sqlite3").open()
    try:
        await DiskQueue(db).migrate()
        for step in range(1, 5):
            for statement in filter(str.strip, schema._MIGRATIONS[step].split(";")):
                await db.execute(statement)
        await db.execute("PRAGMA user_version = 4")
        await db.execute("INSERT INTO chats (address, chat_id, status, kind, origin, eve_session, claim, "
                         "created_at, updated_at) VALUES ('1', 1, 'busy', 'compact', 'auto', 's', 'c', 0, 0)")
        await db.execute("INSERT INTO chats (address, chat_id, created_at, updated_at) VALUES ('2', 2, 0, 0)")
        await store_module.Store(db).migrate()
        chats = {c: await store_module.Store(db).chat(c) for c in ("1", "2")}
        assert chats["1"] is not None and chats["1"].compact_phase is CompactPhase.POSTED
        assert chats["2"] is not None and chats["2"].compact_phase is None
    finally:
        await db.close()


async def test_a_gone_topic_fails_only_its_own_replies(tmp_path: Path) -> None:
    """A deleted forum topic (ChatGone for one thread) blocks that address; the group's other
    topics keep their pending replies (before, every topic's were failed)."""
    db, tr = await _open(tmp_path)
    try:
        for address, thread in (("-100:5", 5), ("-100:7", 7)):
            await tr.touch(address, -100, thread, "en")
            await tr.store.put_outgoing(address, f"k{thread}", -100, thread, "reply")
        await tr.mark_blocked("-100:5", "Bad Request: message thread not found")
        assert [o.key for o in await tr.store.pending_outgoing("-100:7")] == ["k7"]
        assert await tr.store.pending_outgoing("-100:5") == []
        assert await tr.store.is_blocked("-100:5") and not await tr.store.is_blocked("-100:7")
    finally:
        await db.close()


async def test_a_turn_takes_files_only_up_to_its_budget(tmp_path: Path) -> None:
    """Issue 11 (attachments): a turn's files are bounded by their declared sizes — a file of
    unknown size counts as the cap — so an album cannot put a gigabyte in memory; the first
    message always goes, the rest wait (in order) for the next turns."""
    from bridge.storage.payloads import Attachment

    db, tr = await _open(tmp_path)
    mb = 1024 * 1024
    try:
        await tr.touch(A, 1, None, "en")
        for n, size in enumerate((30 * mb, 15 * mb, None, 1 * mb), start=1):
            msg = QueuedMessage(text=f"m{n}", message_id=n, user_id=1, user_name="Ann", owner=True, private=True,
                                attachment=Attachment(file_id=f"f{n}", size=size, mime="image/jpeg", name=f"p{n}.jpg"))
            await tr.queue.enqueue(A, msg.to_payload(), dedupe_key=f"tg:1:{n}")
        turns = []
        while (claimed := await tr.claim_turn(A, limit=10, files_budget=50 * mb, file_cap=20 * mb)) is not None:
            turns.append([m.payload["text"] for m in claimed.messages])
            await tr.fail_turn(A, claimed.claim)
        # 30 + 15 fit; the unknown one counts 20: a new turn; 20 + 1 fit.
        assert turns == [["m1", "m2"], ["m3", "m4"]]
    finally:
        await db.close()


async def test_an_album_is_claimed_whole_once_it_settled(tmp_path: Path) -> None:
    """Issue 14 (albums): while an album's last part is younger than the settling time the claim
    writes nothing and says when to look again; then every part goes in one turn, even past the
    batch limit when the album leads the queue, and a message before an album goes without it."""
    from bridge.chat.albums import SETTLE
    from bridge.chat.transitions import Settling
    from bridge.clock import Clock

    db, tr = await _open(tmp_path)
    now = [0.0]
    tr.clock, tr.started_at = (lambda: now[0]), 0.0
    tr.steady = Clock(wall=lambda: now[0], mono=lambda: now[0])  # the monotonic clock agrees here
    try:
        await tr.touch(A, 1, None, "en")
        await _message(tr, 1)
        for n in (2, 3, 4):
            msg = QueuedMessage(text="", message_id=n, user_id=1, user_name="Ann", owner=True, private=True,
                                album="g1")
            await tr.queue.enqueue(A, msg.to_payload(), dedupe_key=f"tg:1:{n}")
        last = max(m.enqueued_at for m in await tr.queue.queued(A))
        now[0] = last + SETTLE / 2
        claimed = await tr.claim_turn(A, limit=2)
        assert not isinstance(claimed, Settling) and claimed is not None
        assert [m.payload["message_id"] for m in claimed.messages] == [1]  # the album waits
        await tr.fail_turn(A, claimed.claim)
        assert await tr.claim_turn(A, limit=2) == Settling(last + SETTLE)
        assert state_of(await _chat(tr)) is ChatState.IDLE and await tr.queue.depth(A) == 3
        now[0] = last + SETTLE
        claimed = await tr.claim_turn(A, limit=2)
        assert not isinstance(claimed, Settling) and claimed is not None
        assert [m.payload["message_id"] for m in claimed.messages] == [2, 3, 4]
    finally:
        await db.close()
