"""The turn phase of a busy period: eve's turn events, prompts, the live draft, the stop and the
parking that ends it (T4, T5, L*, F4, F5, C1, C2, C6).

It reads Iva's events of eve's stream (eve_client's model, never a wire shape); the words go
through :mod:`.reply`, questions through :mod:`.prompts`, and when the turn is over and eve is
idle, :mod:`.park` releases the chat or moves it into a compaction."""

from __future__ import annotations

import asyncio
import enum

import eve_client as eve

from ... import backoff, log
from ...metrics import METRICS
from ...push import turns as pushed
from ...storage.payloads import Kind
from ...storage.store import Chat, CompactPhase
from ...telegram.sender import Typing
from ...telegram.texts import t
from .. import askers
from ..endings import Outcome, SessionLost
from ..live import Draft
from . import prompts, steer
from .base import Ended, Period, Phase, Stage, Stop
from .park import park
from .reply import Reply

__all__ = ["TurnPhase"]

logger = log.get(__name__)

WAITING_ON_PERSON = 7 * 24 * 3600.0  # a question open this long without an answer: the turn is lost


class Late(enum.Enum):
    """C6: a compaction released before this turn may still be announced by eve; if it is, outside
    a turn, the person hears the C3 notice and the turn's end need not watch for it."""

    NONE = "none"
    OUTSTANDING = "outstanding"
    ANNOUNCED = "announced"


class TurnPhase(Phase):
    def __init__(self, p: Period, chat: Chat) -> None:
        super().__init__(p)
        self.chat = chat
        self.stage = Stage.ASKING if chat.waiting_input else Stage.SENT
        # The turn's deliveries not yet ended at eve; None while our send's are unknown (an
        # ambiguous send, F4: eve shows the turn it made of it).
        # A paused turn has every delivery so far: eve settled them "awaiting input" at the pause,
        # and what comes while it waits is consumed by it (PROTOCOL-27.md §9).
        self.pending: set[str] | None = (set() if chat.waiting_input
                                         else set(chat.deliveries) if chat.deliveries else None)
        self.stop = Stop.WANTED if chat.stop_wanted else Stop.NONE
        outstanding = chat.kind is Kind.TURN and chat.compact_phase is CompactPhase.RELEASED
        self.late = Late.OUTSTANDING if outstanding else Late.NONE
        self.measurement: int | None = None
        self.first_measurement: int | None = None  # a compaction's "after" (seed 004)
        self.asked: set[str] = set()  # the questions shown (their events, T5), closed at the turn's end
        self.reply = Reply(p, chat)  # the text being written, the live draft (L*)
        self.turn_id: str | None = None
        self.steer_grace: float | None = None  # parking waits until then for eve's turn with an unsure steer
        self.unsent_grace: float | None = None  # an unrecorded send: resent if eve begins no turn by then
        self.cancel_failures = 0
        self.cancel_retry: asyncio.TimerHandle | None = None
        self.answerable = True  # F11: someone present may answer the open question (else: the busy timeout)
        self.budget = False  # V6: a budget prompt of this turn is open (owners only; a bounded wait)
        self.budget_asked = False  # one was asked in this turn (a cancel after it: the owner's Stop)

    async def enter(self) -> None:
        p, chat = self.p, self.chat
        if self.stage is Stage.ASKING:  # F11: after a restart, as when it was asked
            self.answerable = await askers.answerable(p.s.people, await askers.running(p.s.queue, chat))
            self.budget = self.budget_asked = await p.s.store.owners_prompt_open(p.session)
            self.answerable = self.answerable and not self.budget
        p.typing = Typing(p.s.sender.bot, chat.chat_id, chat.thread_id, ttl=p.s.settings.chat.busy_timeout)
        p.typing.start()
        if p.s.settings.chat.streaming == "draft" and chat.chat_id > 0:  # drafts: private chats only
            p.draft = Draft(p.s.sender.bot, chat.chat_id, chat.thread_id)
        if self.stop:
            await self._stop()  # asked for before a restart: a stop is durable

    def lost(self, why: str) -> Outcome:
        # The turn had ended in eve and every message of it was answered: nobody is asked to
        # repeat what was answered (eve 0.80 died before it was idle, PROTOCOL.md §9).
        return SessionLost(why, answered=self.stage is Stage.ENDED and not self.pending and not self.stop)

    # -- time --------------------------------------------------------------------------------

    def deadline(self) -> tuple[float, str]:
        now = self.p.clock.now()
        if self.steer_grace is not None:
            return self.steer_grace - now, "steer"
        if self.unsent_grace is not None:
            return self.unsent_grace - now, "unsent"
        if self.stage is Stage.ASKING and not self.stop and self.answerable:
            # F5: waiting on the person is not "no progress": no busy timeout while a question
            # is open; a late answer reaches the same session. Once answered, eve must go on
            # within the busy timeout again (a session stuck since eve restarted is lost then).
            return WAITING_ON_PERSON, "busy"
        return self.p.busy_left(), "busy"

    async def on_timeout(self, why: str) -> Phase | Ended | None:
        if why == "unsent":
            # eve is idle and began no turn with our message: it never had it. Back to the
            # head of the queue; the worker sends it again (F4, counted as before: F6).
            logger.info("unrecorded_send_not_at_eve")
            await self.p.s.transitions.give_back(self.p.address, self.p.owned())
            return Ended()
        if why == "busy" and self.budget and not self.stop:
            # V6: nobody allowed more usage in time. The turn is stopped, the person told in one
            # line; eve keeps the session over budget, so the next message meets the prompt again.
            logger.warning("budget_prompt_given_up", seconds=self.p.s.settings.chat.busy_timeout)
            chat = await self.p.s.transitions.want_stop(self.p.address)
            if chat is not None:
                async with self.p.s.store.db.transaction():
                    await self.p.s.outbox.say(chat, f"budget-given-up:{self.p.owned()}",
                                              t("budget_given_up", chat.lang))
            await self._stop()
            return None
        if why == "steer":
            # eve began no turn with the unsure steer: it never had it (parking puts it back at
            # the head of the queue, for the next turn).
            self.steer_grace = None
            logger.info("unsure_steer_not_at_eve")
            return await self.park()
        return await super().on_timeout(why)

    # -- what arrives while busy ---------------------------------------------------------------

    async def on_poke(self, chat: Chat) -> Phase | Ended | None:
        if chat.stop_wanted and Stop.CANCELLED not in self.stop:
            await self._stop()  # the first stop, or one whose cancel eve has not accepted yet
            return None
        if self.stop:
            return None  # what arrives after a stop waits for the next turn, never joins this one
        asking = self.stage in (Stage.ASKING, Stage.ANSWERED)
        if self.budget:
            # V6: only an owner's button answers a budget prompt (a plain "Approve" in the chat
            # would answer it at eve): what people write meanwhile waits for the next turn.
            steered = await steer.steer(self.p, chat, answers_only=True)
            if isinstance(steered, steer.Steered) and steered.answers:
                # the owner answered: eve goes on (or ends the turn); the busy timeout counts from
                # here as for any turn, and no longer gives the prompt up
                self.budget = False
                self.p.moved()
            return steered if isinstance(steered, Ended) else None
        if chat.kind is not Kind.TURN or not (asking or self.p.s.settings.chat.turn_policy == "immediate"):
            return None
        if not asking and (self.pending is None or await steer.unsure(self.p)):
            # One unsure send at a time: what eve shows next is matched to it. Not while a question
            # waits on the person: eve shows nothing until it is answered, so a press or another
            # reply must still go (if eve took the unsure reply, the question is already over).
            return None
        steered = await steer.steer(self.p, chat)
        if not isinstance(steered, steer.Steered):
            return steered
        self.p.moved()
        if self.stage is Stage.ASKING:
            self.stage = Stage.ANSWERED
        if steered.messages:
            if steered.delivery and self.pending is not None:
                self.pending.add(steered.delivery)
            if self.stage is Stage.ENDED:
                self.stage = Stage.SENT
        return None

    async def _stop(self) -> None:
        """L*: the person asked to stop. A turn is cancelled in eve by its id (the conversation stays)."""
        p = self.p
        first = Stop.WANTED not in self.stop
        self.stop |= Stop.WANTED
        if first and self.stage is Stage.ASKING:
            p.moved()  # the busy timeout counts from the stop, not the question
        await self.reply.end_draft()
        await p.stop_typing()
        if first:
            METRICS.stops.labels(kind="turn").inc()
        try:
            result = await p.s.eve.cancel(p.session, turn_id=self.turn_id)
        except eve.EveError as exc:
            # The mark stays and the cancel is tried again: on the next poke (a message, another
            # /stop), at turn.started, after a restart, and on its own after a backoff.
            self.cancel_failures += 1
            wait = backoff.EVE.delay(self.cancel_failures)
            logger.warning("eve_cancel_failed", error=str(exc), wait=round(wait, 1))
            if self.cancel_retry is None or self.cancel_retry.cancelled():
                def retry() -> None:
                    self.cancel_retry = None
                    p.poke()
                self.cancel_retry = p.clock.later(wait, retry)  # one timer at a time
            return
        self.stop |= Stop.CANCELLED
        logger.info("turn_stop_sent", turn=self.turn_id, status=result.status)

    # -- the turn's events ---------------------------------------------------------------------

    async def on_event(self, event: eve.Event) -> Phase | Ended | None:
        claim = self.p.owned()
        await self._match_unrecorded(event, claim)
        match event:
            case eve.TextDelta():
                self.reply.delta(event, self.stop)
            case eve.ToolCalled():
                self.reply.tool(event, self.stop)
            case eve.TextDone():
                self.stop = await self.reply.done(event, claim, self.stop)
            case eve.TurnBegan() | eve.RunBegan():
                await self._began(event)
            case eve.UsageRecorded():
                if event.usage.input_tokens is not None and not event.context:
                    # seed 004 on eve 1.x: the turn's own model calls, never a compaction's summary
                    self.measurement = event.usage.input_tokens
                    self.first_measurement = self.first_measurement or event.usage.input_tokens
                self.p.spend.add(event.usage)
            case eve.ContextStarted(kind="compaction") | eve.ContextSettled(kind="compaction"):
                await self._context(event, claim)
            case eve.QuestionOpened():
                if not await self._question(event, claim):
                    return None
            case eve.TurnPaused():
                await self._paused(claim)
            case eve.QuestionSettled():
                await self.p.s.store.close_prompts(self.p.session, event.ids)
                self.budget = self.budget and await self.p.s.store.owners_prompt_open(self.p.session)
            case eve.TurnEnded(outcome="failed"):
                await self._failed(event, claim)
            case eve.TurnEnded(outcome="cancelled") if self.budget_asked and not self.stop:
                # V6: an owner pressed Stop on the budget prompt: eve cancels the turn, and the
                # person it was for hears why it ends without an answer.
                await self._say(event, claim, f"budget-stopped:{event.key}", t("budget_stopped", self.chat.lang))
        return await self._after(event, claim)

    async def _match_unrecorded(self, event: eve.Event, claim: str) -> None:
        """F4: a turn of ours eve began, where our record lacks it (an ambiguous send on eve 0.80,
        or a steer's): recorded as this turn's; with no sign of it, a grace on eve's idle."""
        p, tr = self.p, self.p.s.transitions
        if isinstance(event, eve.TurnBegan | eve.InputTaken) and event.deliveries:
            if self.pending is None:
                # Our send's answer was lost (an ambiguous send, F4), so no delivery is on the
                # record: this is the turn eve made of it. Recorded now, so that a restart after the
                # cursor has passed this point follows the turn instead of sending again.
                for delivery in event.deliveries:
                    await tr.delivered(p.address, claim, delivery)
                self.pending = set(event.deliveries)
            elif adopted := await steer.adopt(p, event.deliveries):
                self.pending.update(adopted)
                self.steer_grace = None
                if self.stage is Stage.ENDED:
                    self.stage = Stage.SENT
                p.poke()  # messages that waited behind it may steer now
        if self.pending is None and self.stage is Stage.SENT:
            # Our send's answer was lost and eve has shown no turn of it yet: it may be queued behind
            # what eve runs (a compaction: its turn starts right after eve is idle, PROTOCOL.md §5).
            # Idle with no turn for a moment: eve never had it.
            grace = p.s.settings.eve.grace
            self.unsent_grace = p.clock.now() + grace if isinstance(event, eve.Idle) else None

    async def _began(self, event: eve.TurnBegan | eve.RunBegan) -> None:
        p = self.p
        if isinstance(event, eve.TurnBegan):
            self.turn_id = event.turn_id or self.turn_id
            if self.stage in (Stage.SENT, Stage.ENDED):
                self.stage = Stage.RUNNING
            if self.stop:
                await self._stop()  # stopped before eve began it: cancel it by its id now
        if p.typing is not None and not self.stop:
            p.typing.start()

    async def _context(self, event: eve.ContextStarted | eve.ContextSettled, claim: str) -> None:
        """A compaction eve announces: a released one of ours (C6, announced late), or its own."""
        p, tr = self.p, self.p.s.transitions
        if isinstance(event, eve.ContextSettled):
            if event.ok:
                await tr.in_turn_compacted(p.address, claim, p.cursor)
        elif not event.in_turn and self.late is Late.OUTSTANDING and self.stage in (Stage.SENT, Stage.ENDED):
            # C6: the compaction released before this turn, announced now; our message waits
            # behind it at eve: the person hears the C3 notice.
            self.late = Late.ANNOUNCED
            logger.info("compaction_announced_late", estimate=event.estimate)
            await self.reply.end_draft()
            await self._say(event, claim, f"c3:{event.key}", t("compacting_notice", self.chat.lang))
        else:
            logger.info("eve_in_turn_compaction", estimate=event.estimate)  # eve's, not ours

    async def _question(self, event: eve.QuestionOpened, claim: str) -> bool:
        """T5, V6: shown as its kind needs. False when the turn was stopped instead (a kind Iva
        cannot show is said in one line, never a silent wait on something nobody sees)."""
        p, chat = self.p, self.chat
        await self.reply.end_draft()
        shown = await prompts.show(p, chat, event, claim)
        self.asked.add(event.key)
        if shown.unknown is not None:
            logger.warning("eve_question_kind_unknown", kind=shown.unknown)
            if await p.s.transitions.want_stop(p.address) is not None:
                async with p.s.store.db.transaction():
                    await p.s.outbox.say(chat, f"unknown-kind:{event.key}",
                                         t("input_unknown_kind", chat.lang, kind=shown.unknown[:40]))
            await self._stop()
            return False
        self.answerable = shown.answerable
        self.budget = shown.budget
        self.budget_asked |= shown.budget
        return True

    async def _paused(self, claim: str) -> None:
        """T5: the turn cannot end until the person answers; their next message goes at once."""
        p = self.p
        self.stage = Stage.ASKING
        if self.pending is not None:
            self.pending.clear()  # eve has them all: the turn ends them when it ends
        await p.s.transitions.waiting_on_person(p.address, claim, waiting=True, cursor=p.cursor)
        if not self.budget and await p.s.store.owners_prompt_open(p.session):
            # V6: a budget prompt shown before a restart cut the turn short of its pause
            self.budget = self.budget_asked = True
            self.answerable = False
        await p.stop_typing()
        if p.slot is not None:
            p.slot.give_back()  # F5: other chats' turns go on meanwhile

    async def _failed(self, event: eve.TurnEnded, claim: str) -> None:
        p, s, chat = self.p, self.p.s, self.chat
        code = event.code or "error"
        logger.warning("eve_turn_failed", code=code, error=event.message[:300])
        METRICS.turns.labels(outcome="failed").inc()
        await self.reply.end_draft()
        async with s.store.db.transaction():
            await s.outbox.say(chat, f"failed:{event.key}", await pushed.turn_failed(s.queue, chat, code)
                               or t("turn_failed", chat.lang, reason=code))  # W4
            await s.transitions.advance(p.address, claim, p.cursor)
            await p.spend.commit(s.store, p.address)

    async def _say(self, event: eve.Event, claim: str, key: str, text: str) -> None:
        """One line to the chat, committed with the cursor past ``event``."""
        p, s = self.p, self.p.s
        async with s.store.db.transaction():
            await s.outbox.say(self.chat, key, text)
            await s.transitions.advance(p.address, claim, p.cursor)

    async def _after(self, event: eve.Event, claim: str) -> Phase | Ended | None:
        """What every event may move: a question answered, the turn's end, eve idle after it."""
        p, s = self.p, self.p.s
        ended = isinstance(event, eve.TurnEnded)
        if self.stage in (Stage.ASKING, Stage.ANSWERED) and (isinstance(event, eve.RunBegan | eve.QuestionSettled)
                                                             or ended):
            self.stage = Stage.RUNNING
            p.moved()
            await s.transitions.waiting_on_person(p.address, claim, waiting=False)
            if p.slot is not None and not ended:
                await p.slot.retake()
        if isinstance(event, eve.TurnEnded):
            await self._turn_ended(event, claim)
        if isinstance(event, eve.Idle) and self.stage is Stage.ENDED and not self.pending:
            if await steer.unsure(p):
                # A steer eve may have (its send's answer lost, or a restart before it was recorded)
                # and no sign of it yet: eve starts a turn with it right after it is idle if it has
                # it (PROTOCOL.md §4). Park only once that did not come (F4).
                self.steer_grace = p.clock.now() + s.settings.eve.grace
                return None
            return await self.park()
        return None

    async def _turn_ended(self, event: eve.TurnEnded, claim: str) -> None:
        self.stage = Stage.ENDED
        self.stop = await self.reply.ended(event, claim, self.stop)
        if self.asked:
            await self.p.s.store.close_prompts(self.p.session)
        if self.pending is not None:
            self.pending.difference_update(event.deliveries)

    # -- the end -------------------------------------------------------------------------------

    async def park(self) -> Phase | Ended | None:
        """The parking handler (:mod:`.park`)."""
        return await park(self.p, measurement=self.measurement, first=self.first_measurement,
                          announced=self.late is Late.ANNOUNCED)
