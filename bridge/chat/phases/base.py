"""What every phase of a busy period shares: the typed inbox, the results a phase returns, the
facts of the period (:class:`Period`), and the small records of a turn (:class:`Stage`,
:class:`Stop`, :class:`Spend`)."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

import eve_client as eve

from ... import log
from ...metrics import METRICS
from ...storage.store import Chat, Store
from ...telegram.sender import Typing
from ..endings import Outcome, SessionLost
from ..live import Draft
from ..services import Services, Slot
from ..transitions import Superseded

__all__ = [
    "BAD_EVENT", "POKE", "CompactAnswer", "Ended", "Inbox", "Item", "Period", "Phase", "Poke",
    "ReaderFailed", "Spend", "Stage", "Stop", "StreamEnded", "apply",
]

logger = log.get(__name__)

RESUME_GRACE = 10.0
# What a handler raises on an event of a shape it does not expect (a bad event, F6).
BAD_EVENT = (LookupError, TypeError, ValueError, AttributeError, ArithmeticError)


# -- the inbox -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Poke:
    """Something arrived for the chat while it is busy (a message, a /stop, a timer's look)."""


POKE = Poke()


@dataclass(frozen=True, slots=True)
class CompactAnswer:
    """eve's answer to our compact request (or the error in its place)."""

    result: eve.Accepted | eve.EveError
    claim: str  # the compaction whose request this answers (an old answer is not this one's)


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """eve closed the session's stream."""


@dataclass(frozen=True, slots=True)
class ReaderFailed:
    """The stream's reader ended in an error (eve's, or one eve_client did not translate)."""

    error: Exception


Item = Poke | CompactAnswer | eve.Event | StreamEnded | ReaderFailed
Inbox = asyncio.Queue[Item]


# -- what a phase returns ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ended:
    """The busy period is over: ``outcome`` is ended by :func:`~bridge.chat.endings.end`, or None
    when the phase committed its own end (parked, finished, given back, a /new)."""

    outcome: Outcome | None = None



# -- the records of a turn -----------------------------------------------------------------------

class Stage(enum.Enum):
    """Where the turn stands at eve."""

    SENT = "sent"  # our message went (or a steer): eve began no turn of it yet
    RUNNING = "running"  # between turn.started and the turn's end
    ASKING = "asking"  # a question waits on the person (T5): no busy timeout (F5)
    ANSWERED = "answered"  # the person answered it: eve must go on within the busy timeout
    ENDED = "ended"  # the turn ended at eve; eve idle after it parks the chat


class Stop(enum.Flag):
    """L*: the person's stop (the draft's button, /stop; durable on the record), as far as it got."""

    NONE = 0
    WANTED = enum.auto()
    CANCELLED = enum.auto()  # eve accepted the cancel (until then a poke tries again)
    SHOWN = enum.auto()  # what was written before it reached eve is shown, marked as stopped


@dataclass(slots=True)
class Spend:
    """eve's usage read since the last commit; committed once, with the cursor that passed it."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0

    def add(self, usage: eve.Usage) -> None:
        self.calls += 1
        self.input_tokens += usage.input_tokens or 0
        self.output_tokens += usage.output_tokens or 0
        self.cache_read_tokens += usage.cache_read_tokens or 0

    async def commit(self, store: Store, address: str) -> None:
        """Inside a transaction that moves the cursor: the usage read up to it, exactly once."""
        if self.calls:
            await store.add_spend(address, "turns", calls=self.calls, input_tokens=self.input_tokens,
                                  output_tokens=self.output_tokens, cache_read_tokens=self.cache_read_tokens)
            self.calls = self.input_tokens = self.output_tokens = self.cache_read_tokens = 0


# -- the period ------------------------------------------------------------------------------------

class Period:
    """The facts of one busy period every phase reads and moves: the record it follows (its
    claim, None while a released compaction is only watched), how far it read, the time of
    its last progress, the spend not yet committed, the typing and the live draft."""

    def __init__(self, s: Services, inbox: Inbox, chat: Chat, *, slot: Slot | None = None) -> None:
        assert chat.eve_session
        self.s = s
        self.inbox = inbox
        self.clock = s.clock
        self.address = chat.address
        self.session = chat.eve_session
        self.claim: str | None = chat.claim
        self.cursor = chat.cursor
        self.slot = slot
        self.spend = Spend()
        self.typing: Typing | None = None
        self.draft: Draft | None = None
        self.progress = self.clock.now()
        timeout = s.settings.chat.busy_timeout
        if chat.progress_at:
            # The time since the last persisted progress counts (a restart does not reset it), but
            # a resumed consumer always gets a moment to read what eve wrote meanwhile.
            grace = min(timeout, RESUME_GRACE)
            self.progress -= s.transitions.spent(chat.progress_at, limit=timeout - grace)  # F9: no step counts

    def owned(self) -> str:
        if self.claim is None:
            raise Superseded(f"{self.address}: the chat was released")
        return self.claim

    def moved(self) -> None:
        """Progress: the busy timeout counts from now."""
        self.progress = self.clock.now()

    def busy_left(self) -> float:
        return self.s.settings.chat.busy_timeout - (self.clock.now() - self.progress)

    def poke(self, after: float = 0.0) -> asyncio.TimerHandle | None:
        """Look again (now, or after ``after`` seconds): a poke in the inbox."""
        if after <= 0:
            self.inbox.put_nowait(POKE)
            return None
        return self.clock.later(after, lambda: self.inbox.put_nowait(POKE))

    async def stop_typing(self) -> None:
        if self.typing is not None:
            await self.typing.stop()

    async def end_draft(self) -> None:
        """Before a message of ours goes out in the middle of a turn (a question, a notice): the
        draft shows nothing more and no frame can land after the message."""
        if self.draft is not None:
            await self.draft.settle()

    async def close(self) -> None:
        """The period is over: typing and the draft end with it."""
        if self.typing is not None:
            await self.typing.stop()
            self.typing = None
        if self.draft is not None:
            await self.draft.close()
            self.draft = None


class Phase:
    """One phase of the period: it is handed what arrives and says what comes next."""

    def __init__(self, p: Period) -> None:
        self.p = p

    async def enter(self) -> None:
        """The phase begins (the period's first, or the one a transition led to)."""

    def deadline(self) -> tuple[float, str]:
        """Seconds until the phase's next time rule, and which one."""
        return self.p.busy_left(), "busy"

    async def on_timeout(self, why: str) -> Phase | Ended | None:
        logger.warning("busy_timeout", seconds=self.p.s.settings.chat.busy_timeout)
        return Ended(self.lost("no progress within the busy timeout"))

    async def on_poke(self, chat: Chat) -> Phase | Ended | None:
        return None

    async def on_answer(self, answer: CompactAnswer) -> Phase | Ended | None:
        return None  # a compact request's answer outside a compaction: an old one

    async def on_event(self, event: eve.Event) -> Phase | Ended | None:
        return None

    def lost(self, why: str) -> Outcome:
        """The outcome when the session is gone or stuck in this phase."""
        return SessionLost(why)


async def apply(phase: Phase, event: eve.Event) -> Phase | Ended | None:
    """One event of eve's stream, in ``phase``: the cursor moves past it (V2: a position read
    before — the first facts of a line a restart cut — is not applied again)."""
    p = phase.p
    if event.position < p.cursor:
        return None  # applied already (read ahead of the stream, or the rest of a line)
    p.moved()
    p.cursor = event.after
    if isinstance(event, eve.SessionEnded):
        return Ended(phase.lost(f"session {event.outcome}"))
    if isinstance(event, eve.SessionBegan) and event.eve_version:
        # V5: which eve built the session, as the session itself says (eve may have been
        # upgraded since Iva last asked); the newest eve seen is the one `iva status` names
        await p.s.transitions.built_by(p.address, p.owned(), event.eve_version)
        if p.s.eve.eve_version == event.eve_version:
            await p.s.store.set_meta("eve_version", event.eve_version)
    try:
        return await phase.on_event(event)
    except BAD_EVENT:
        # F6: an event we cannot take (a field of a shape no handler expects) is logged and
        # skipped: its transaction rolled back, the next effect moves the cursor past it.
        # Replaying it after a restart skips it again; it never wedges the chat. Faults of the
        # database, eve or Telegram are not in BAD_EVENT: they propagate and the worker
        # retries from the cursor.
        METRICS.eve_errors.labels(kind="event").inc()
        logger.exception("eve_event_skipped", what=event.what, position=str(event.position), key=event.key)
        return None
