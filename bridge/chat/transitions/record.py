"""What every transition stands on (:class:`_Record`): the states as read from a record, the
errors, the field sets a transition writes over, the typed results, and the reading and writing
of one chat's record. The package's docstring (:mod:`bridge.chat.transitions`) has the rules."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diskqueue import DiskQueue, Message
from eve_client import START

from ...clock import CLOCK, Clock
from ...errors import BridgeError
from ...storage.payloads import Kind, Queued
from ...storage.store import Chat, ChatStatus, CompactPhase, Store
from .. import albums, parking

if TYPE_CHECKING:
    from ...notebook import Notebook

__all__ = ["FRESH_SESSION", "ChatState", "Claim", "Finished", "IllegalTransition", "Parked", "Settling", "Superseded",
           "state_of", "steer_claim"]



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
