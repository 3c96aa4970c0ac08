"""Every write of a chat's state, each a named transition in one transaction (R1).

A transition reads the record, checks its precondition and writes, all inside one ``BEGIN
IMMEDIATE`` transaction; the transaction is re-entrant, so a caller may add its own effects (an
outbox row, a spend row) to the same commit. Nothing outside this module writes the state fields
of a chat (status, kind, origin, session, cursor, claim, deliveries, the compaction phase, the
marks); ``tests/unit/test_chat_layout.py`` greps for it.

Preconditions come in two sorts:

* **guards** — a race that is normal (a message claimed while /compact took the chat, a
  recapture after /new): the transition writes nothing and says so (``None`` / ``False``);
* **ownership** — the consumer of a busy period holds its ``claim``; every write the consumer
  makes names it, and a record that no longer carries that claim (the period ended, a /new
  retired it) raises :class:`Superseded`: the caller's view is stale and it must stop. A
  transition from a state it is not defined for raises :class:`IllegalTransition`.
"""

from __future__ import annotations

import enum
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diskqueue import DiskQueue, Message, State
from eve_client import START, Position

from .. import log
from ..clock import CLOCK, Clock
from ..errors import BridgeError
from ..push import turns as pushed
from ..storage.payloads import InputAnswer, Kind, Origin, PushedTurn, Queued, QueuedMessage, decode
from ..storage.store import CancelMark, Chat, ChatStatus, CompactPhase, Store
from . import albums, askers, draftids, owners, parking

if TYPE_CHECKING:
    from ..notebook import Notebook

__all__ = [
    "FRESH_SESSION",
    "ChatState",
    "Claim",
    "Finished",
    "IllegalTransition",
    "Parked",
    "Settling",
    "Superseded",
    "Transitions",
    "state_of",
    "steer_claim",
]

logger = log.get("bridge.chat.transitions")


class ChatState(enum.StrEnum):
    """The states of the diagram in :mod:`bridge.chat`, as read from a record."""

    IDLE = "idle"
    TURN = "turn"
    COMPACTING = "compacting"
    RELEASED = "released"  # idle, but a compaction of ours may still start in eve (C6)


def state_of(chat: Chat) -> ChatState:
    if chat.status is ChatStatus.BUSY:
        return ChatState.COMPACTING if chat.kind is Kind.COMPACT else ChatState.TURN
    return ChatState.RELEASED if chat.compact_phase is CompactPhase.RELEASED else ChatState.IDLE


class IllegalTransition(BridgeError):
    """The transition is not defined from the chat's current state."""


class Superseded(IllegalTransition):
    """The busy period this caller follows is over (its claim is not the record's any more)."""


# A new eve session starts with nothing measured and nothing disabled: the one definition.
FRESH_SESSION: Mapping[str, Any] = {
    "eve_session": None,
    "session_eve": None,
    "cursor": START,
    "measurement": None,
    "compaction_disabled": False,
    "after_pending": False,
    "after_report": False,
    "compact_failures": 0,
    "compact_retry_at": None,
}

def _fresh(chat: Chat) -> dict[str, Any]:
    """FRESH_SESSION, and the notebook's marks of the new window (N6, seed 000): the wrap-up
    invitation is armed again, and no "just compacted" nudge speaks of a summary that belonged to
    the session left behind."""
    return {**FRESH_SESSION, "notes_nudged_upto": chat.compactions, "wrap_nudged_upto": -1}


# busy → idle: what a free chat carries.
_IDLE: Mapping[str, Any] = {
    "status": ChatStatus.IDLE,
    "kind": None,
    "origin": None,
    "claim": None,
    "deliveries": [],
    "busy_since": None,
    "owner_turn": False,
    "waiting_input": False,
    "compact_phase": None,
    "compact_cancel": None,
    "stop_wanted": False,
}  # compact_reply_to / compact_lang stay: a /compact's "after" line (M5) comes a turn later


def _claim_id() -> str:
    return uuid.uuid4().hex


def steer_claim(claim: str) -> str:
    """What a steer's messages are claimed under until eve's acceptance of them is recorded (F4)."""
    return f"{claim}:steer"


@dataclass(frozen=True, slots=True)
class Claim:
    """idle → busy(turn): the claim id and the messages that make the turn."""

    claim: str
    session: str | None
    messages: Sequence[Message]


@dataclass(frozen=True, slots=True)
class Settling:
    """Nothing claimed: the queue's head is an album still arriving; look again at ``at``."""

    at: float


@dataclass(frozen=True, slots=True)
class Parked:
    """What the parking handler decided, with the chat as it was before."""

    chat: Chat
    inflight: Sequence[Message]
    decision: parking.ParkingDecision
    compaction_claim: str | None  # busy(compacting, auto) under this claim, or None: idle
    after_before: int | None  # M5: a /compact's "before", now that its "after" is known


@dataclass(frozen=True, slots=True)
class Finished:
    chat: Chat
    outcome: str  # completed | cancelled | failed


@dataclass(slots=True)
class _Record:
    """What every transition stands on: the store and the queue, the clocks, the reading and
    writing of one chat's record, first contact. The transitions themselves are grouped by the
    part of the record they move (:class:`Transitions` puts them together)."""

    store: Store
    queue: DiskQueue
    notebook: Notebook | None = None
    clock: Any = field(default=CLOCK.now)  # the wall time written (steady: F9, bridge/clock.py)
    # When ingest caught up with what Telegram held at this start (an album's settling counts from
    # then, so a part redelivered after a restart joins its album); None until then. Monotonic.
    started_at: float | None = None
    steady: Clock = field(default=CLOCK)  # deadlines (monotonic) and elapsed times across a restart
    previous_anchor: str | None = None  # the clock anchor the last process left (read at start)
    _arrived: dict[int, float] = field(default_factory=dict)  # queue row → its arrival, monotonic

    def mono(self) -> float:
        return self.steady.mono()

    def caught_up(self) -> None:
        """Ingest has what Telegram held at this start (the first poll's batch, or the webhook set)."""
        if self.started_at is None:
            self.started_at = self.mono()

    def album_clock(self) -> float:
        """Where an album's settling may start at the earliest: after catching up (until then, now:
        an album waits and looks again). Monotonic."""
        return self.started_at if self.started_at is not None else self.mono()

    def arrived(self, row: Message) -> float:
        """F9: when a queued part arrived, on the monotonic clock: its ``enqueued_at`` (wall time,
        it survives a restart) read once and never put in the future — after the wall clock
        stepped back an hour, an album settles as usual instead of waiting the hour."""
        at = self._arrived.get(row.id)
        if at is None:
            at = self.mono() - max(0.0, self.clock() - row.enqueued_at)
            if len(self._arrived) > 4096:  # the parts of albums long gone
                self._arrived.clear()
            self._arrived[row.id] = at
        return at

    def album_cut(self, claimed: Sequence[Message], items: Sequence[Queued], waiting: Sequence[Message], *,
                  limit: int) -> albums.Cut:
        """:func:`albums.cut` on the monotonic clock (its ``wait_until`` is a :meth:`mono` time)."""
        return albums.cut(claimed, items, waiting, limit=limit, now=self.mono(), started=self.album_clock(),
                          arrived=self.arrived)

    def spent(self, stamp: float, *, limit: float) -> float:
        """F9: seconds since a stamp this or the last process wrote, in ``[0, limit]``: exact within
        one boot (the monotonic clock), so a forward step does not shorten a recovered turn."""
        return self.steady.since(stamp, limit=limit, anchor=self.previous_anchor)

    # -- reading -----------------------------------------------------------------------------

    async def _chat(self, address: str) -> Chat:
        chat = await self.store.chat(address)
        if chat is None:
            raise IllegalTransition(f"no chat {address}")
        return chat

    async def _owned(self, address: str, claim: str | None, *states: ChatState) -> Chat:
        chat = await self._chat(address)
        if chat.claim != claim:
            raise Superseded(f"{address}: claim {claim} is not the record's ({chat.claim})")
        if state_of(chat) not in states:
            raise IllegalTransition(f"{address}: {state_of(chat)} is not one of {[str(s) for s in states]}")
        return chat

    async def _write(self, address: str, *bases: Mapping[str, Any], **fields: Any) -> None:
        """Write ``fields`` over the field sets ``bases`` (later ones win)."""
        merged: dict[str, Any] = {}
        for base in bases:
            merged.update(base)
        merged.update(fields)
        await self.store.update_chat(address, **merged)

    # -- first contact -----------------------------------------------------------------------

    async def touch(self, address: str, chat_id: int, thread_id: int | None, lang: str) -> None:
        """The chat row exists from the first message on; a new message unblocks it."""
        await self.store.touch_chat(address, chat_id, thread_id, lang)

    async def mark_blocked(self, address: str, reason: str) -> None:
        """A send found the chat (or this forum topic) gone or the bot blocked: nothing more goes
        to this address (until a new message from it unblocks it); what was pending for it fails.
        Other topics of the same group keep theirs: each learns for itself whether it is gone."""
        async with self.store.db.transaction():
            await self._write(address, blocked=True, blocked_reason=reason[:200])  # no record: nothing to mark
            await self.store.fail_outgoing_of_address(address)

    async def bot_removed(self, chat_id: int, reason: str) -> None:
        """my_chat_member kicked/left: every address of the Telegram chat (its topics too)."""
        await self.store.block_chat(chat_id, reason)



class _Turns(_Record):
    """idle → busy(turn), and every step inside a turn."""

    __slots__ = ()

    # -- idle → busy(turn) ------------------------------------------------------------------

    async def claim_turn(self, address: str, *, limit: int, files_budget: int | None = None,
                         file_cap: int = 0) -> Claim | Settling | None:
        """idle|released → busy(turn) with the address's next messages; None when there is nothing
        to claim or the chat is not free (busy, or a /new waits); :class:`Settling` (nothing
        written) when the next message is part of an album still arriving (:mod:`.albums`: an
        album goes whole, once settled). With ``files_budget`` (bytes),
        the turn takes messages while their files' declared sizes fit (one of unknown size counts
        as ``file_cap``); the first always goes, the rest wait for the next turn."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or chat.busy or chat.reset_requested:
                return None
            claim = _claim_id()
            messages = await self.queue.claim(address, limit=limit + albums.LOOKAHEAD, claim=claim)
            items = [decode(m.payload) for m in messages]
            stale = [m for m, item in zip(messages, items, strict=True) if isinstance(item, InputAnswer)]
            if stale:
                # A button pressed after its turn ended: nothing waits for it any more.
                await self.queue.ack([m.id for m in stale], claim=claim)
                kept = [(m, i) for m, i in zip(messages, items, strict=True) if not isinstance(i, InputAnswer)]
                messages, items = [m for m, _ in kept], [i for _, i in kept]
            if not messages:
                return None
            if (alone := pushed.alone(items)) < len(messages):  # W1: a pushed turn is a turn of its own
                await self.queue.nack([m.id for m in messages[alone:]], claim=claim)
                messages, items = messages[:alone], items[:alone]
            taken = self.album_cut(messages, items, await self.queue.queued(address), limit=limit)
            if taken.take < len(messages):
                await self.queue.nack([m.id for m in messages[taken.take:]], claim=claim)
                messages, items = messages[:taken.take], items[:taken.take]
            if taken.wait_until is not None:
                return Settling(taken.wait_until)
            if files_budget is not None:
                spent, cut = 0, len(messages)
                for i, item in enumerate(items):
                    if isinstance(item, QueuedMessage) and item.attachment is not None:
                        spent += item.attachment.size or file_cap
                        if spent > files_budget and i > 0:
                            cut = i
                            break
                if cut < len(messages):
                    await self.queue.nack([m.id for m in messages[cut:]], claim=claim)
                    messages, items = messages[:cut], items[:cut]
            first = items[0]
            owner = isinstance(first, QueuedMessage | PushedTurn) and first.owner
            fields: dict[str, Any] = {"owner_turn": owner}
            if self.notebook is not None:
                # N1: the notebook rides only in the owner's turns, so a turn is one kind or the
                # other: the first message that differs waits for the next turn.
                cut = next((i for i, item in enumerate(items)
                            if isinstance(item, QueuedMessage) and item.owner != owner), len(messages))
                if cut < len(messages):
                    await self.queue.nack([m.id for m in messages[cut:]], claim=claim)
                    messages = messages[:cut]
                if owner:
                    fields["notes_mode"] = await self.notebook.mode_at_entry(chat)  # N2: fixed for the turn
            session = None if chat.reset_mark else chat.eve_session
            now = self.clock()
            if session is not None and chat.compact_phase is CompactPhase.RELEASED:
                # C6: a released compaction eve may still announce stays outstanding through the
                # turn; the turn's end watches for it again (park).
                fields.update(compact_phase=CompactPhase.RELEASED, origin=chat.origin)
            await self._write(address, **{
                **_IDLE, **(_fresh(chat) if session is None else {}), **fields,
                "status": ChatStatus.BUSY, "kind": Kind.TURN, "claim": claim, "busy_since": now,
                "progress_at": now, "reset_mark": False, "eve_session": session,
                "cursor": chat.cursor if session else START,
            })
            return Claim(claim=claim, session=session, messages=messages)

    # -- inside a turn ---------------------------------------------------------------------

    async def session_opened(self, address: str, claim: str, session: str, *, eve_version: str | None = None) -> Chat:
        """busy(turn) without a session → with this new one, read from its start; ``eve_version``
        built it (V5: another eve strands it). A session an upgrade left behind is forgotten here:
        the caller tells the person in the same commit. The chat as it was."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            if chat.eve_session is not None:
                raise IllegalTransition(f"{address} has a session already")
            await self._write(address, eve_session=session, cursor=START, session_eve=eve_version, upgraded_from=None)
            return chat

    async def session_dropped(self, address: str, claim: str, *, upgraded: bool = False) -> None:
        """eve no longer knows the session: the turn goes on in a new one (all fresh).
        ``upgraded``: an eve upgrade stranded it — the new session tells the person, once (V5)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            await self._write(address, _fresh(chat), upgraded_from=chat.eve_session if upgraded else chat.upgraded_from)

    async def delivered(self, address: str, claim: str, delivery_id: str | None,
                        marks: Mapping[str, int] | None = None, *, steered: Sequence[int] = (),
                        steer_claim: str | None = None) -> None:
        """eve has a message of this turn; the one-shot notebook marks (N6) go with it. A steered
        message (claimed under ``steer_claim`` until eve had it, F4) joins the turn's claim in
        the same commit."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            known = [*chat.deliveries, delivery_id] if delivery_id else list(chat.deliveries)
            if steered and steer_claim is not None:
                await self.queue.reassign(steered, claim=steer_claim, to=claim)
            await self._write(address, deliveries=known, progress_at=self.clock(), **(marks or {}))

    async def advance(self, address: str, claim: str, cursor: Position) -> None:
        """The consumer applied eve's events up to ``cursor`` (effects in the caller's transaction).
        The hot path of every reply: one guarded statement; the record is read only to say why
        it did not apply."""
        async with self.store.db.transaction():
            if not await self.store.update_chat_if(address, {"claim": claim, "status": ChatStatus.BUSY},
                                                   cursor=cursor, progress_at=self.clock()):
                await self._owned(address, claim, ChatState.TURN, ChatState.COMPACTING)
                raise IllegalTransition(f"{address}: advance did not apply")

    async def waiting_on_person(self, address: str, claim: str, *, waiting: bool, cursor: Position | None = None) -> None:
        """T5: the turn waits on the person's answer (or no longer does)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            fields: dict[str, Any] = {"waiting_input": waiting}
            if cursor is not None:
                fields.update(cursor=cursor, progress_at=self.clock())
            await self._write(address, fields)

    async def in_turn_compacted(self, address: str, claim: str, cursor: Position) -> None:
        """eve compacted inside the turn: a compaction all the same (the N6 nudge counts it)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            await self._write(address, compactions=chat.compactions + 1, cursor=cursor)

    async def turn_shared(self, address: str, claim: str) -> None:
        """Someone else's words joined the owner's turn: it is not the owner's any more (N1)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self._write(address, owner_turn=False)

    async def claim_steer(self, address: str, claim: str, *, limit: int) -> Claim | Settling | None:
        """busy(turn) → the same, with the next messages claimed for the running turn under the
        steer's own claim (:func:`steer_claim`, F4: until eve has them). Pushed turns stay
        queued (W1: never steered into a turn), and so does a message of the other kind (N1: the
        notebook rides one kind of turn); an album steers whole, once settled (I3):
        :class:`Settling` (nothing claimed) until then. None: nothing to steer."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            steer = steer_claim(claim)
            claimed = await self.queue.claim(address, limit=limit + albums.LOOKAHEAD, claim=steer)
            claimed = await pushed.unsteered(self.queue, claimed, claim=steer)  # W1: never steered into a turn
            if self.notebook is not None and not await askers.pushed_question(self.queue, chat):
                # N1: the notebook rides one kind of turn; the other kind waits. A pushed turn's
                # question is the chat's people's (F11): their answer joins it (the turn shared).
                claimed = await owners.own_kind(self.queue, claimed, owner_turn=chat.owner_turn, claim=steer)
            if not claimed:
                return None
            taken = self.album_cut(claimed, [decode(m.payload) for m in claimed], await self.queue.queued(address),
                                   limit=limit)
            if taken.take < len(claimed):
                await self.queue.nack([m.id for m in claimed[taken.take:]], claim=steer)
                claimed = claimed[:taken.take]
            if taken.wait_until is not None:
                return Settling(taken.wait_until)
            return Claim(claim=steer, session=chat.eve_session, messages=claimed)

    async def send_failed(self, address: str, claim: str, ids: Sequence[int]) -> None:
        """busy(turn) stays: eve, itself up, answered the turn's send with a server error; the
        failure is counted (F6: a message eve always fails on is sent a bounded number of times)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.count_failure(ids, claim=claim)

    async def steer_taken(self, address: str, claim: str, ids: Sequence[int]) -> None:
        """A steer's messages are done with: eve took the answers, or they are recordings
        nobody could hear (told in the caller's transaction)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.ack(ids, claim=steer_claim(claim))

    async def steer_returned(self, address: str, claim: str, ids: Sequence[int]) -> None:
        """A steer's messages go back to the head of the queue: eve never had them."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.nack(ids, claim=steer_claim(claim))



class _TurnEnds(_Record):
    """The ways out of a turn: parked, given back, failed, lost."""

    __slots__ = ()

    # -- the ways out of a turn --------------------------------------------------------------

    async def park(self, address: str, claim: str, *, cursor: Position, measurement: int | None, threshold: int,
                   may_compact: bool, announced: bool = False, first: int | None = None) -> Parked:
        """busy(turn) → idle, or straight into busy(compacting, auto) in the same commit (C1, C2);
        → released when a compaction released before this turn is still outstanding at eve and
        was not announced during it (C6: the consumer watches for it)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            outstanding = chat.compact_phase is CompactPhase.RELEASED and not announced
            may_compact = may_compact and not outstanding  # C5: never a second request
            now = self.clock()
            decision = parking.parking_decision(chat, measurement, threshold, first=first, now=now)
            inflight = await self._ack_inflight(chat)
            fields: dict[str, Any] = {**_IDLE, "cursor": cursor, "progress_at": now, "turns": chat.turns + 1,
                                      **decision.updates}
            if measurement is not None:
                fields.update(measurement=measurement, measured_at=now)
            after_before = None
            if decision.after is not None and chat.after_report:
                after_before = chat.compact_before
                fields["after_report"] = False
            compaction_claim = None
            if decision.compact and may_compact:
                compaction_claim = _claim_id()
                fields.update(status=ChatStatus.BUSY, kind=Kind.COMPACT, origin=Origin.AUTO, claim=compaction_claim,
                              busy_since=now, compact_notified=False, compact_before=measurement,
                              compact_phase=CompactPhase.WANTED, compact_reply_to=None, compact_lang=None)
            elif outstanding:
                fields.update(compact_phase=CompactPhase.RELEASED, origin=chat.origin)
            await self._write(address, fields)
            if chat.eve_session:
                await self.store.close_prompts(chat.eve_session)
            return Parked(chat, inflight, decision, compaction_claim, after_before)

    async def give_back(self, address: str, claim: str) -> None:
        """busy(turn) → idle without a turn (eve never had it): the messages go back to the head."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.nack([m.id for m in await self.queue.inflight(address)])
            await self._write(address, _IDLE)

    async def fail_turn(self, address: str, claim: str) -> tuple[Chat, list[Message]]:
        """busy(turn) → idle: eve refused the message itself; it is done with."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            inflight = await self._ack_inflight(chat)
            await self._write(address, _IDLE)
            return chat, inflight

    async def session_lost(self, address: str, claim: str | None, *,
                           upgraded: bool = False) -> tuple[Chat, list[Message]]:
        """any busy state or a released watch → idle with the session-reset mark (R2, R3): the
        session is gone, stranded or stuck; the next message starts a new one. ``upgraded``: an
        eve upgrade stranded it — the next new session tells the person so, once (V5)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN, ChatState.COMPACTING, ChatState.RELEASED)
            inflight = await self._ack_inflight(chat)
            await self._write(address, _IDLE, _fresh(chat), reset_mark=True,
                              upgraded_from=chat.eve_session if upgraded else chat.upgraded_from)
            return chat, inflight

    async def built_by(self, address: str, claim: str, eve_version: str) -> None:
        """The session's first event names the eve that built it (V5: what strands it later);
        the guess made when it was created (eve's version as last seen) is corrected."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN, ChatState.COMPACTING)
            if chat.session_eve != eve_version:
                await self._write(address, session_eve=eve_version)

    async def upgrade_told(self, address: str) -> None:
        """The person heard that an upgrade restarted the conversation (V5): not again."""
        await self._write(address, upgraded_from=None)

    async def _ack_inflight(self, chat: Chat) -> list[Message]:
        """The turn's messages are done; any other in flight (a steer eve never confirmed, F4)
        goes back to the head of the queue. Returns the turn's."""
        inflight = await self.queue.inflight(chat.address)
        mine = [m for m in inflight if m.claim == chat.claim]
        others = [m.id for m in inflight if m.claim != chat.claim]
        if mine:
            await self.queue.ack([m.id for m in mine], claim=chat.claim)
        if others:
            await self.queue.nack(others)
        return mine



class _Compactions(_Record):
    """busy(compacting): captured, posted, accepted, released and taken again, stopped, finished."""

    __slots__ = ()

    # -- compactions -----------------------------------------------------------------------

    async def capture_manual(self, address: str, *, before: int, reply_to: int, lang: str) -> str | None:
        """idle → busy(compacting, manual) (M1): the claim, or None if the chat is not free, has
        nothing to compact, or a released compaction may still start in eve (C5: never two)."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or state_of(chat) is not ChatState.IDLE or chat.reset_requested or not chat.eve_session \
                    or chat.reset_mark:
                return None
            claim = _claim_id()
            now = self.clock()
            await self._write(address, _IDLE, status=ChatStatus.BUSY, kind=Kind.COMPACT, origin=Origin.MANUAL,
                              claim=claim, busy_since=now, progress_at=now, compact_notified=False,
                              compact_before=before, compact_phase=CompactPhase.WANTED, compact_reply_to=reply_to,
                              compact_lang=lang)
            return claim

    async def capture_for_window(self, address: str, *, before: int, threshold: int) -> str | None:
        """idle → busy(compacting, auto) (D3): the chat now answers on a model whose threshold its
        conversation (``before``, the last measurement) no longer fits under; compacted before
        its next turn, silently as parking does (C11). The claim, or None when the chat is not
        free, has no session, fits, parking is off for it (C8) or backs off after a failure."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            now = self.clock()
            if chat is None or state_of(chat) is not ChatState.IDLE or chat.reset_requested or not chat.eve_session \
                    or chat.reset_mark or chat.compaction_disabled or before < threshold \
                    or (chat.compact_retry_at is not None and now < chat.compact_retry_at):
                return None
            claim = _claim_id()
            await self._write(address, _IDLE, status=ChatStatus.BUSY, kind=Kind.COMPACT, origin=Origin.AUTO,
                              claim=claim, busy_since=now, progress_at=now, compact_notified=False,
                              compact_before=before, compact_phase=CompactPhase.WANTED, compact_reply_to=None,
                              compact_lang=None)
            return claim

    async def compact_posted(self, address: str, claim: str) -> None:
        """The compact request goes out now (C5: once per compaction)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_phase is not CompactPhase.WANTED:
                raise IllegalTransition(f"{address}: compaction already {chat.compact_phase}")
            await self._write(address, compact_phase=CompactPhase.POSTED)

    async def compact_accepted(self, address: str, claim: str) -> None:
        """eve accepted the request or announced the compaction."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.COMPACTING)
            await self._write(address, compact_phase=CompactPhase.ACCEPTED)

    async def release(self, address: str, claim: str, cursor: Position) -> None:
        """busy(compacting) → released: eve did not accept within the ack window (C6)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_phase not in (CompactPhase.WANTED, CompactPhase.POSTED):
                raise IllegalTransition(f"{address}: eve has the compaction ({chat.compact_phase})")
            origin = chat.origin
            await self._write(address, _IDLE, cursor=cursor, origin=origin, compact_phase=CompactPhase.RELEASED)

    async def recapture(self, address: str) -> str | None:
        """released → busy(compacting): eve announced the compaction after all (C6). The new claim,
        or None when the chat is not released any more (a turn or a /new came first)."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or state_of(chat) is not ChatState.RELEASED or chat.reset_requested:
                return None
            claim = _claim_id()
            await self._write(address, status=ChatStatus.BUSY, kind=Kind.COMPACT, claim=claim,
                              busy_since=self.clock(), progress_at=self.clock(), compact_notified=False,
                              compact_phase=CompactPhase.ACCEPTED)
            return claim

    async def end_watch(self, address: str) -> bool:
        """released → idle: the watch of a released compaction ended without one (C6, C10)."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or state_of(chat) is not ChatState.RELEASED:
                return False
            await self._write(address, _IDLE)
            return True

    async def want_stop(self, address: str, *, draft: int | None = None) -> Chat | None:
        """busy(turn|compacting) → the same, with the stop mark (L*: the stop button, /stop): the
        consumer cancels in eve. The chat as it was (also when a stop was asked for already: the
        consumer is woken to try the cancel again); None when nothing runs (idle, released), or
        when ``draft`` (the stop button's draft id) belongs to a turn that is over — a late press
        never stops the turn that came after."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or not chat.busy or chat.reset_requested:
                return None
            if draft is not None and (chat.kind is not Kind.TURN or chat.claim is None
                                      or not draftids.of_turn(draft, chat.claim)):
                return None
            if not chat.stop_wanted:
                await self._write(address, stop_wanted=True)
            return chat

    async def want_cancel(self, address: str, claim: str) -> bool:
        """C4: a message wants the compaction cancelled; True the first time."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_cancel is not None:
                return False
            await self._write(address, compact_cancel=CancelMark.WANTED)
            return True

    async def cancel_sent(self, address: str, claim: str) -> None:
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_cancel is not CancelMark.WANTED:
                raise IllegalTransition(f"{address}: no cancel wanted")
            await self._write(address, compact_cancel=CancelMark.SENT)

    async def notify_compacting(self, address: str) -> bool:
        """C3: the first message during a compaction gets the notice; True when this one does."""
        # One guarded statement: it runs in every message's ingest transaction.
        return bool(await self.store.update_chat_if(
            address, {"status": ChatStatus.BUSY, "kind": Kind.COMPACT, "compact_notified": False},
            compact_notified=True))

    async def finish_compaction(self, address: str, claim: str | None, *, cursor: Position, ok: bool) -> Finished:
        """busy(compacting) or released → idle (C7): completed, cancelled (C4) or failed."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING, ChatState.RELEASED)
            now = self.clock()
            outcome = "completed" if ok else ("cancelled" if chat.compact_cancel is not None else "failed")
            fields: dict[str, Any] = {**_IDLE, "cursor": cursor, "progress_at": now}
            if ok:
                fields.update(after_pending=True, compact_failures=0, compact_retry_at=None,
                              compactions=chat.compactions + 1, after_report=chat.origin is Origin.MANUAL)
            elif outcome == "failed" and chat.origin is Origin.AUTO:
                failures = chat.compact_failures + 1
                fields.update(compact_failures=failures, compact_retry_at=now + parking.cooldown(failures))
            await self._write(address, fields)
            return Finished(chat, outcome)

    async def drop_compaction(self, address: str, claim: str) -> Chat:
        """busy(compacting) → idle: requested, but eve never began it (the answer was lost with a
        restart). Not a failure of the summarizer: no back-off counts it (R3)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            await self._write(address, _IDLE)
            return chat



class Transitions(_Turns, _TurnEnds, _Compactions):
    """The transitions of every chat, on the store and the queue: /new and start-up here, the
    rest in the bases by the part of the record they move."""

    __slots__ = ()

    # -- /new ------------------------------------------------------------------------------

    async def request_new(self, address: str, *, reply_to: int) -> int:
        """M7: any state → a /new waits; the queued messages are dropped (their number returned)."""
        async with self.store.db.transaction():
            chat = await self._chat(address)
            dropped = await self.queue.drop_queued(address)
            await self._write(address, reset_requested=True, reset_reply_to=reply_to,
                              reset_dropped=chat.reset_dropped + dropped)
            return dropped

    async def new_conversation(self, address: str) -> Chat:
        """A /new waited → idle in a fresh session (eve's session was reset or left behind)."""
        async with self.store.db.transaction():
            chat = await self._chat(address)
            if not chat.reset_requested:
                raise IllegalTransition(f"{address}: no /new waits")
            inflight = await self.queue.inflight(address)
            await self.queue.ack([m.id for m in inflight])  # /new: what was in flight is done with
            await self._write(address, _IDLE, _fresh(chat), reset_mark=False, reset_requested=False,
                              reset_reply_to=None, reset_dropped=0)
            return chat

    # -- start-up ---------------------------------------------------------------------------

    async def repair_at_start(self) -> int:
        """Before any worker runs: in-flight messages of chats that are not busy go back to the
        queue (a crash between claim and busy cannot happen, but an old schema's could). A
        released chat stays released: its worker reads eve's stream before anything is sent
        (C6; recovery.released_announced). Returns the number of messages requeued."""
        async with self.store.db.transaction():
            busy = {c.address for c in await self.store.busy_chats()}
            requeued = 0
            for address in await self.queue.addresses_with(State.INFLIGHT):
                if address not in busy:
                    requeued += await self.queue.requeue_inflight(address)
        await self._anchor_clock()
        return requeued

    async def _anchor_clock(self) -> None:
        """F9: read the last process's clock anchor, leave ours — best effort (a full disk must
        not stop the start: elapsed times then fall back to the clamped wall difference)."""
        try:
            self.previous_anchor = await self.store.clock_anchor()
            async with self.store.db.transaction():
                await self.store.set_people_meta("clock_anchor", self.steady.anchor())
        except sqlite3.OperationalError as exc:
            logger.warning("clock_anchor_not_written", error=str(exc))

