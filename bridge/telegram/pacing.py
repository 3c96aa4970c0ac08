"""One pacer in front of every Bot API call that posts or edits a message (Q1–Q4, docs/pacing.md).

Telegram's Bots FAQ: about 30 messages a second overall, about 1 a second in one chat (short
bursts are fine), 20 a minute in one group; past them come 429s with growing waits. The
:class:`Pacer` is an aiogram request middleware on the bot's session, so no call can go around
it — answers and their parts, notices, command answers, prompts, pushed notifications, drafts,
typing and reactions all pass here, shared by every chat:

- **A message** (``send*``, ``edit*``, ``copy*``, ``forward*``, and ``createForumTopic``, which
  posts the topic's first service message) waits for its chat's budget (a
  private chat: a burst of ``IVA_SEND_CHAT_BURST``, then ``IVA_SEND_CHAT_RATE`` a second; a group
  or forum: ``IVA_SEND_GROUP_PER_MINUTE`` in any minute) and then for the global one
  (``IVA_SEND_RATE`` a second). Both are :class:`aiolimiter.AsyncLimiter` leaky buckets, whose
  waiters are served first come, first served: a chat with a 20-part answer has one part waiting
  at a time, so the other chats take turns with it part by part.
- **A draft frame** has a budget of its own per chat (``IVA_DRAFT_RATE`` frames a second) and takes
  the global budget only when it is free (now, or within one slot while no message waits): it
  never joins the budget's queue, and a frame that would have to is skipped (:class:`Paced`) —
  a final answer never queues behind one.
- **Typing** is lowest: skipped when the global budget is short or when its chat had it within
  the indicator's 5 s.
- **A reaction** (a receipt) waits for the global budget only.

A 429 holds its chat for ``retry_after`` (every call to it waits or is skipped; the other chats
go on). When several chats are told to wait at once, the limit hit is the global one: the global
budget runs at half speed for a while — the same bucket, its rate changed in place, so the
messages already waiting in it go at the new pace too (a fresh bucket beside it would let a
burst through while they drained the old one). The caller decides what a 429 costs: a message is sent
again (it waits out the hold here), a draft frame is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiogram.client.session.middlewares.base import BaseRequestMiddleware, NextRequestMiddlewareType
from aiogram.exceptions import TelegramRetryAfter
from aiogram.methods.base import TelegramType
from aiolimiter import AsyncLimiter

from .. import log
from ..errors import BridgeError
from ..metrics import METRICS

if TYPE_CHECKING:
    from aiogram import Bot
    from aiogram.methods import Response, TelegramMethod

    from ..config import Settings

__all__ = ["Bucket", "Budget", "Paced", "Pacer", "kind_of", "pacer_of"]

logger = log.get(__name__)

Kind = Literal["message", "draft", "typing", "reaction"]

GLOBAL_BURST = 1.5  # the global bucket's size in messages (see Budget.global_limiter)
TYPING_SHOWS = 5.0  # seconds Telegram shows a chat action: never sent again within them
TOLD_AT_ONCE = 3  # this many chats told to wait within ONCE seconds: the global limit was hit
ONCE = 1.0
SLOW_FOR = 30.0  # seconds the global budget runs at half speed after that
POSTS_TOO = frozenset({"createForumTopic"})  # posts to its chat (the topic's service message), by another name
_IDLE_CHAT = 120.0  # a chat's budgets are forgotten after this long without a call (when many)


class Paced(BridgeError):
    """A draft frame or a typing action not sent now (never queued): try again in ``retry_in``."""

    def __init__(self, kind: Kind, why: str, retry_in: float) -> None:
        super().__init__(f"{kind} skipped: {why}")
        self.kind = kind
        self.why = why
        self.retry_in = retry_in


def kind_of(api_method: str) -> Kind | None:
    """What a Bot API method is to the pacer; None: not paced (getUpdates, getFile, setWebhook…)."""
    if api_method == "sendMessageDraft":
        return "draft"
    if api_method == "sendChatAction":
        return "typing"
    if api_method == "setMessageReaction":
        return "reaction"
    if api_method.startswith(("send", "edit", "copy", "forward")) or api_method in POSTS_TOO:
        return "message"
    return None


@dataclass(frozen=True, slots=True)
class Budget:
    """The pacer's knobs (defaults: Telegram's limits, a little under)."""

    rate: float = 28.0  # messages a second overall
    chat_burst: int = 3  # a private chat: this many at once...
    chat_rate: float = 1.0  # ... then this many a second
    group_per_minute: float = 20.0  # a group or forum: this many in any minute...
    group_burst: int = 3  # ... of them this many at once
    draft_rate: float = 1.0  # draft frames a second per chat
    draft_timeout: float = 5.0  # seconds a draft frame may take (aiogram's own is 60)
    typing_every: float = TYPING_SHOWS

    @classmethod
    def of(cls, settings: Settings) -> Budget:
        return cls(rate=settings.pacing.rate, chat_burst=settings.pacing.chat_burst,
                   chat_rate=settings.pacing.chat_rate, group_per_minute=settings.pacing.group_per_minute,
                   group_burst=settings.pacing.group_burst, draft_rate=settings.pacing.draft_rate,
                   draft_timeout=settings.pacing.draft_timeout)

    def chat_limiter(self, chat_id: int | str) -> AsyncLimiter:
        """A private chat: a burst, then the chat's rate. A group (a negative id or a @channel):
        a burst and then a pace such that no minute holds more than its limit (a leaky bucket of
        size b and rate r lets b + 60·r through in a minute; 5% spare for the network's jitter)."""
        if isinstance(chat_id, int) and chat_id > 0:
            return AsyncLimiter(self.chat_burst, self.chat_burst / self.chat_rate)
        burst = max(1, min(self.group_burst, int(self.group_per_minute) - 1))
        per_second = max(self.group_per_minute - burst, 1.0) / 60 / 1.05
        return AsyncLimiter(burst, burst / per_second)

    def global_limiter(self) -> Bucket:
        """One message every 1/rate seconds, with half a message of slack. A leaky bucket of size
        b and rate r passes at most ⌊b + r⌋ in any second: 29 at the default for any b < 2, under
        Telegram's 30 with one to spare for the network. The half message is what keeps the rate:
        the next waiter resumes a little after its slot (the event loop is late, more so under
        load); a bucket of 1 is then empty and that lateness is lost at every slot (the loaded
        benchmark machine delivered 24/s of 28, 1.27× the 30/s floor), while a bucket of 1.5 takes
        it up to half a slot (18 ms) each time (28/s, 1.07–1.11×; docs/benchmarks.md, "Pacing, benchmark 1 again"). A
        bucket of 2 passes 30 in a second and its pairs bunch: 1 to 17 429s of 600 there."""
        return Bucket(GLOBAL_BURST, GLOBAL_BURST / self.rate)


class Bucket(AsyncLimiter):
    """aiolimiter's leaky bucket whose rate may change while messages wait in it (the global
    budget's slow-down after a 429 storm): what leaked until now leaked at the old rate, and the next
    waiter is woken at the new one. aiolimiter has no public setter; this keeps to its
    ``_leak``/``_wake_next`` contract (1.3), which ``test_pacing.py`` holds to."""

    __slots__ = ()

    @property
    def rate(self) -> float:
        """Messages a second the bucket lets through now."""
        return self._rate_per_sec

    def pace(self, rate: float) -> None:
        self._leak()  # the level as of now, at the old rate
        self.time_period = self.max_rate / rate
        self._rate_per_sec = rate
        self._wake_next()  # the first waiter's wake-up, rescheduled at the new rate


class _Chat:
    __slots__ = ("held_until", "last_draft", "last_typing", "limiter", "used_at")

    def __init__(self, limiter: AsyncLimiter, now: float) -> None:
        self.limiter = limiter
        self.held_until = 0.0
        self.last_draft = -1e9
        self.last_typing = -1e9
        self.used_at = now


class Pacer(BaseRequestMiddleware):
    """The one pacer of a bot (see the module's docstring). ``clock`` and ``sleep`` time the
    holds a 429 puts on a chat and the draft and typing gaps (a test injects its own clock);
    the leaky buckets run on the event loop's clock."""

    def __init__(self, budget: Budget, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.budget = budget
        self.clock = clock
        self.sleep = sleep
        self._chats: dict[int | str, _Chat] = {}
        self._global = budget.global_limiter()
        self._slow_until: float | None = None
        self._told: deque[tuple[float, int | str]] = deque()
        self.waiting = 0  # messages waiting for a budget, any
        self._waiting_global = 0  # of them, waiting for the global budget
        self.holds = 0  # 429s seen (each holds its chat)
        self.skipped: dict[str, int] = {"draft": 0, "typing": 0}

    # -- the middleware ---------------------------------------------------------------------

    async def __call__(self, make_request: NextRequestMiddlewareType[TelegramType], bot: Bot,
                       method: TelegramMethod[TelegramType]) -> Response[TelegramType]:
        kind = kind_of(method.__api_method__)
        chat_id: int | str | None = getattr(method, "chat_id", None)
        if kind is None or chat_id is None:
            return await make_request(bot, method)
        if kind == "message":
            await self.message_turn(chat_id)
        elif kind == "reaction":
            await self._global_turn()
        else:
            await self.light_turn(kind, chat_id)
        try:
            return await make_request(bot, method)
        except TelegramRetryAfter as exc:
            self.told_to_wait(chat_id, exc.retry_after, what=method.__api_method__)
            raise

    # -- turns --------------------------------------------------------------------------------

    def _chat(self, chat_id: int | str) -> _Chat:
        now = self.clock()
        chat = self._chats.get(chat_id)
        if chat is None:
            if len(self._chats) > 4096:
                self._forget_idle(now)
            chat = self._chats[chat_id] = _Chat(self.budget.chat_limiter(chat_id), now)
        chat.used_at = now
        return chat

    def _forget_idle(self, now: float) -> None:
        for key, chat in list(self._chats.items()):
            if now - chat.used_at > _IDLE_CHAT and chat.held_until <= now:
                del self._chats[key]

    def held_for(self, chat_id: int | str) -> float:
        """Seconds the chat is still held by a 429 (0: free)."""
        chat = self._chats.get(chat_id)
        return max(0.0, chat.held_until - self.clock()) if chat is not None else 0.0

    async def _hold(self, chat: _Chat) -> None:
        while (left := chat.held_until - self.clock()) > 0:
            await self.sleep(left)

    async def message_turn(self, chat_id: int | str) -> None:
        """Wait until a message to the chat may go: its 429 hold, its budget, the global one."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        chat = self._chat(chat_id)
        self.waiting += 1
        METRICS.pacer_waiting.set(self.waiting)
        try:
            await self._hold(chat)
            await chat.limiter.acquire()
            await self._hold(chat)  # a 429 of a call to the chat that went meanwhile (a command's answer)
            await self._global_turn()
        finally:
            self.waiting -= 1
            METRICS.pacer_waiting.set(self.waiting)
        waited = loop.time() - started
        METRICS.pacer_wait.observe(waited)
        if waited > 5:
            logger.info("send_paced", chat_id=chat_id, waited=round(waited, 1))

    async def _global_turn(self) -> None:
        self._waiting_global += 1
        try:
            await self._current_global().acquire()
        finally:
            self._waiting_global -= 1

    def _current_global(self) -> Bucket:
        """The one global bucket, at full speed again once a slow-down is over (in place: the
        messages waiting in it are paced by it either way)."""
        if self._slow_until is not None and self.clock() >= self._slow_until:
            self._slow_until = None
            self._global.pace(self.budget.rate)
            logger.info("send_pace_restored", rate=self.budget.rate)
        return self._global

    @property
    def global_rate(self) -> float:
        """Messages a second the global budget lets through now (halved during a slow-down)."""
        return self._current_global().rate

    async def light_turn(self, kind: Kind, chat_id: int | str) -> None:
        """A draft frame or typing: now, or :class:`Paced` (it never queues for a budget)."""
        chat = self._chat(chat_id)
        now = self.clock()
        gap = 1 / self.budget.draft_rate if kind == "draft" else self.budget.typing_every
        last = chat.last_draft if kind == "draft" else chat.last_typing
        limiter = self._current_global()
        why, retry_in = "", 0.0
        if chat.held_until > now:
            why, retry_in = "its chat was told to wait", chat.held_until - now
        elif now - last < gap:
            why, retry_in = "its own budget", gap - (now - last)
        elif self._waiting_global or not await self._free_soon(limiter, kind):
            why, retry_in = "the global budget is short", min(gap, 1.0) / 2
        if why:
            self.skipped[kind] = self.skipped.get(kind, 0) + 1
            METRICS.pacer_skipped.labels(kind=kind).inc()
            raise Paced(kind, why, retry_in)
        if kind == "draft":
            chat.last_draft = self.clock()  # after a wait for the slot: the gap counts from the send
        else:
            chat.last_typing = self.clock()
        await limiter.acquire()  # has capacity: never waits

    async def _free_soon(self, limiter: Bucket, kind: Kind) -> bool:
        """The global budget has room now — or, for a draft, within one slot (1/rate) while no
        message waits for it. The draft does not join the budget's queue meanwhile: a message
        that comes in that slot goes first, and the draft is skipped."""
        if limiter.has_capacity():
            return True
        if kind != "draft":
            return False
        await asyncio.sleep(1 / self.budget.rate)
        return not self._waiting_global and limiter.has_capacity()

    # -- 429 ------------------------------------------------------------------------------------

    def told_to_wait(self, chat_id: int | str, seconds: float, *, what: str = "") -> None:
        """Telegram answered 429: the chat waits ``seconds``; several chats at once slow the
        global budget for a while."""
        now = self.clock()
        chat = self._chat(chat_id)
        chat.held_until = max(chat.held_until, now + seconds)
        self.holds += 1
        METRICS.pacer_holds.inc()
        logger.warning("telegram_flood_wait", chat_id=chat_id, retry_after=seconds, method=what)
        self._told.append((now, chat_id))
        while self._told and now - self._told[0][0] > ONCE:
            self._told.popleft()
        if len({c for _, c in self._told}) >= TOLD_AT_ONCE and self._slow_until is None:
            self._slow_until = now + max(SLOW_FOR, seconds)
            self._global.pace(self.budget.rate / 2)
            METRICS.pacer_slowdowns.inc()
            logger.warning("send_pace_halved", chats=len({c for _, c in self._told}), seconds=SLOW_FOR)


def pacer_of(bot: Bot) -> Pacer | None:
    """The pacer on a bot's session (``make_bot`` puts one there)."""
    for middleware in bot.session.middleware:
        if isinstance(middleware, Pacer):
            return middleware
    return None
