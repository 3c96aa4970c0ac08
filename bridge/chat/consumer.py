"""One busy period of a chat, followed on eve's durable stream: a loop over its phases.

The consumer reads events from the saved cursor and commits each effect (an outbox row, the
chat's release, the move into compaction) together with the cursor, through the transitions. A
restart starts the same consumer from the saved cursor, for a turn and a compaction alike (R1,
R2): there is one busy record and one procedure.

The period is in one phase at a time (:mod:`.phases`: a turn, a compaction, a released
compaction's watch). The loop hands the phase what arrives in the typed inbox — a
:class:`~.phases.base.Poke` (something arrived for the chat), eve's answer to a compact
request, an event of the stream, the stream's end or its reader's failure — or the passing of
its deadline; the phase answers with nothing (go on), the next phase, or
:class:`~.phases.base.Ended` with the outcome that :func:`~.endings.end` ends.

The consumer is given the services and the worker's inbox, never the worker.
"""

from __future__ import annotations

import asyncio

import structlog

import eve_client as eve

from .. import backoff, log
from ..metrics import METRICS
from ..storage.payloads import Kind
from ..storage.store import Chat
from . import endings
from .endings import Outcome, gone
from .phases.base import (
    POKE,
    CompactAnswer,
    Ended,
    Inbox,
    Item,
    Period,
    Phase,
    Poke,
    ReaderFailed,
    Stop,
    StreamEnded,
    apply,
)
from .phases.compaction import Compaction, CompactionPhase
from .phases.turn import TurnPhase
from .services import Services, Slot
from .transitions import Superseded

__all__ = ["POKE", "BusyPeriod", "Inbox"]

logger = log.get(__name__)


class BusyPeriod:
    def __init__(self, s: Services, inbox: Inbox, chat: Chat, *, slot: Slot | None = None) -> None:
        assert chat.eve_session and chat.busy
        self.p = Period(s, inbox, chat, slot=slot)
        self.phase: Phase = (CompactionPhase(self.p, Compaction(chat), stop=_stop_of(chat))
                             if chat.kind is Kind.COMPACT else TurnPhase(self.p, chat))
        self.reader: asyncio.Task[None]  # the stream's reader (a new one after an unexpected error)
        self.reader_failures = 0

    async def run(self) -> None:
        p = self.p
        structlog.contextvars.bind_contextvars(session=p.session)
        self.reader = asyncio.create_task(self._reader(), name=f"stream:{p.address}")
        started = p.clock.now()
        try:
            await self.phase.enter()
            await self._loop()
        except Superseded as exc:
            # The record moved on without us (a /new retired the period): nothing more to do here.
            logger.info("busy_period_superseded", reason=str(exc))
        finally:
            await p.close()
            self.reader.cancel()
            # Wait for the reader without taking its cancellation for ours: a consumer cancelled
            # here (shutdown) must still end, not swallow the CancelledError and go on.
            await asyncio.wait({self.reader})
            # What the reader had queued is dropped; a later consumer starts again from the cursor.
            while not p.inbox.empty():
                p.inbox.get_nowait()
        METRICS.turn_seconds.observe(p.clock.now() - started)

    async def _reader(self) -> None:
        p = self.p
        try:
            async for event in p.s.eve.stream(p.session, p.cursor):
                await p.inbox.put(event)
            await p.inbox.put(StreamEnded())
        except asyncio.CancelledError:
            # Only its period cancels the reader, and it waits for it. Ended quietly, the task
            # keeps no CancelledError, whose traceback would hold the stream's frames (httpx's
            # response and request, their buffers) in a reference cycle until the garbage
            # collector's next full pass (docs/benchmarks.md, section 18).
            return
        except Exception as exc:  # not only eve's errors: the loop must see any end
            # An error the client did not translate (a bug, a closed client) would otherwise end the
            # reader unseen and leave the loop waiting out the busy timeout, losing the turn.
            await p.inbox.put(ReaderFailed(exc))

    async def _loop(self) -> None:
        while True:
            remaining, why = self.phase.deadline()
            item = await self.p.clock.get(self.p.inbox, remaining)
            step = await (self.phase.on_timeout(why) if item is None else self._on(item))
            if isinstance(step, Phase):
                self.phase = step
                await step.enter()
            elif isinstance(step, Ended):
                if step.outcome is not None:
                    await self.end(step.outcome)
                return

    async def _on(self, item: Item) -> Phase | Ended | None:
        match item:
            case Poke():
                chat = await self.p.s.store.chat(self.p.address)
                assert chat is not None
                if chat.reset_requested:
                    return Ended()  # /new: the worker resets (eve's reset cancels a turn or a compaction)
                return await self.phase.on_poke(chat)
            case CompactAnswer():
                return await self.phase.on_answer(item)
            case StreamEnded():
                return Ended(self.phase.lost("eve closed the session stream"))
            case ReaderFailed(error=eve.SessionGone() as lost):
                return Ended(gone(self.phase.lost(str(lost)), lost))
            case ReaderFailed(error=eve.EveError() as error):
                METRICS.eve_errors.labels(kind="stream").inc()
                raise error  # the worker waits and starts over from the cursor
            case ReaderFailed(error=error):
                # The reader's unexpected end (an error eve_client did not translate): logged, and
                # a new reader from the cursor after a pause, in this busy period — so the busy
                # timeout still counts: the same error at the same place each time is a stuck
                # turn, lost when the timeout comes (F6), never a chat busy for ever.
                self.reader_failures += 1
                logger.error("stream_reader_failed", error=repr(error)[:300], failures=self.reader_failures)
                await self.p.clock.sleep(min(5.0, backoff.EVE.delay(self.reader_failures)))
                self.reader = asyncio.create_task(self._reader(), name=f"stream:{self.p.address}")
                return None
            case _:
                return await apply(self.phase, item)

    async def end(self, outcome: Outcome) -> None:
        """The period ends badly: the draft settles first (the "please repeat" line is the last
        thing shown), then the one ending of :mod:`.endings`."""
        await self.p.end_draft()
        await endings.end(self.p.s, self.p.address, self.p.claim, outcome)


def _stop_of(chat: Chat) -> Stop:
    return Stop.WANTED if chat.stop_wanted else Stop.NONE
