"""Reminders (W7-W9): set by the owner (the owner API, ``/reminders`` lists and cancels) or by the
assistant itself (the MCP tools, :mod:`.tools`); each falls due as a pushed turn of its chat.

A reminder is either one instant (``at``: ISO 8601 with its offset) or a cron expression
(``cron``: five fields, minute granularity, read in ``tz``, an IANA zone; DST by ``zoneinfo``
and ``cronsim``). Due instants are stored in UTC seconds (``next_at``), with the last instant
that fired (``last_fired``), durably.

Time, honestly:

- Reminders read the bridge's steady clock (:mod:`bridge.clock`: the wall clock read at start plus
  the monotonic time since, F12): a step of the wall clock while Iva runs, forward or back, moves
  no reminder — none fires early marked late during a forward step, none falls silent for the
  length of the step once it is corrected. The loop sleeps on the event loop's clock (monotonic),
  never longer than :data:`LOOK_EVERY` at a time.
- A correction reaches the reminders at a start (the steady clock anchored to the wall clock
  again) — a process that ran with the clock ahead computed next instants too far ahead: at the
  first look of each start (and whenever the clock reads earlier than at the last look) a
  recurring reminder's next instant is recomputed from the later of now and its last real fire,
  when that comes sooner than the stored one.
- A fire is the pushed turn's queue row keyed ``reminder:<id>:<due instant>``, committed with
  the reminder's next due instant and its ``last_fired``: a restart anywhere fires it once.
- Due while Iva was down, or the clock stepped forward past it: it fires once, marked late
  (more than :data:`LATE_AFTER` after its instant); a recurring one's next instant is the first
  after *now*, so the missed minutes never fire one by one (at most one catch-up).
- The clock stepped back: the next instant is still after the last fired one, so nothing fires
  twice; an instant at or before ``last_fired`` is never fired again.
- A chat that blocked the bot or is gone pauses its reminders (kept and listed as paused); a new
  message from it unblocks the chat and they go on (a missed one catches up once, late).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cronsim import CronSim, CronSimError

from diskqueue import Database

from .. import log
from ..storage import outbox
from ..storage.payloads import PushedTurn
from ..storage.pushes import PushStore
from ..storage.state import StateCorrupt, corrupt
from ..storage.store import Store
from .turns import PushError, Pushes, iso, whole

__all__ = ["ASSISTANT_EVERY", "ASSISTANT_MAX", "ASSISTANT_RECURRING", "LATE_AFTER", "LOOK_EVERY", "MAX_PER_CHAT",
           "MAX_TEXT", "Reminder", "Reminders"]

logger = log.get(__name__)

MAX_PER_CHAT = 100
MAX_TEXT = 2_000
LATE_AFTER = 60.0  # seconds past its instant: a fire is marked late
LOOK_EVERY = 30.0  # the loop reads the wall clock at least this often
BATCH = 50  # reminders fired in one transaction, at most
# S9: what the assistant may set on its own (the owner's own reminders: MAX_PER_CHAT). Each fire
# is an owner turn with the tools, so a reminder the assistant was talked into setting can keep an
# injected instruction alive; bounded, the worst a chat gets is ASSISTANT_RECURRING turns an hour
# (120 a day; before: 100 reminders every minute, 144 000 a day). docs/security.md says why these.
ASSISTANT_MAX = 20  # active reminders the assistant set, per chat
ASSISTANT_RECURRING = 5  # of which recurring
ASSISTANT_EVERY = 3600.0  # seconds: an assistant's recurring reminder falls due at most once an hour


@dataclass(frozen=True, slots=True)
class Reminder:
    id: str
    address: str
    text: str
    at: str | None
    cron: str | None
    tz: str
    next_at: float | None
    last_fired: float | None
    state: str  # active | done | cancelled
    author: str  # owner | assistant
    created_at: float
    paused: bool = False
    set_in: str | None = None  # the assistant's: the turn it was set in, in words (S9)

    def as_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text}
        out.update({"at": self.at} if self.at is not None else {"cron": self.cron})
        out.update(tz=self.tz, next_at=iso(self.next_at), paused=self.paused, last_fired=iso(self.last_fired),
                   set_by=self.author)
        return out


def _zone(tz: object, default: str) -> tuple[str, zoneinfo.ZoneInfo]:
    name = default if tz is None else tz
    if not isinstance(name, str) or not name:
        raise PushError("tz", "tz is an IANA time zone name, e.g. Europe/Berlin or UTC (or leave it out).")
    try:
        return name, zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "Europe" is a directory
        raise PushError("tz", f"Unknown time zone {name!r}: give an IANA name, e.g. Europe/Berlin, "
                              "America/New_York or UTC.") from None


def _cron_next(cron: str, zone: zoneinfo.ZoneInfo, after: float) -> float:
    """The first instant of ``cron`` (read in ``zone``) strictly after ``after``.

    Started in the repeated hour of a DST fall-back (the second 02:10), cronsim may give the
    first occurrence of a wall time already passed (the first 02:15): such an instant is skipped,
    or a reminder would be due in the past, fire at once and then never get ahead of the clock."""
    start = datetime.fromtimestamp(after, zone)
    for instant in CronSim(cron, start):
        if (at := instant.timestamp()) > after:
            return at
    raise StopIteration


def _parse_cron(value: object, zone: zoneinfo.ZoneInfo, now: float) -> tuple[str, float]:
    if not isinstance(value, str) or len(value.split()) != 5:
        raise PushError("cron", "cron is five fields: minute hour day-of-month month day-of-week, e.g. "
                                "\"0 9 * * 1-5\" (09:00 on weekdays); at most once a minute.")
    cron = " ".join(value.split())
    try:
        return cron, _cron_next(cron, zone, now)
    except (CronSimError, StopIteration, ValueError) as exc:
        raise PushError("cron", f"Bad cron {cron!r}: {exc}. Five fields: minute hour day-of-month month "
                                "day-of-week, e.g. \"30 8 * * *\".") from None


def _often(cron: str, zone: zoneinfo.ZoneInfo, now: float) -> None:
    """S9: the assistant's recurring reminder falls due at most once per :data:`ASSISTANT_EVERY`.
    A cron's instants repeat day by day, so more than 24 a day show a gap under an hour within
    the first 25 of them."""
    at = _cron_next(cron, zone, now)
    for _ in range(25):
        after = _cron_next(cron, zone, at)
        if after - at < ASSISTANT_EVERY:
            raise PushError("cron", f"{cron!r} falls due more often than once an hour; a reminder you set on your "
                                    "own may fall due at most hourly (e.g. \"0 * * * *\"). The owner can set a "
                                    "more frequent one.")
        at = after


def _parse_at(value: object, now: float) -> tuple[str, float]:
    problem = ("at is an ISO 8601 date and time with its offset, e.g. \"2026-12-24T09:00:00+01:00\" or "
               "\"2026-12-24T08:00:00Z\".")
    if not isinstance(value, str):
        raise PushError("at", problem)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise PushError("at", problem) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise PushError("at", f"{value!r} has no offset. {problem}")
    instant = when.timestamp()
    try:
        datetime.fromtimestamp(instant, UTC)  # 9999-12-31T23:59-23:59 is the year 10000 in UTC
    except (ValueError, OverflowError, OSError):
        raise PushError("at", f"{value!r} is too far ahead: give a time before the year 10000 in UTC.") from None
    if instant <= now:
        raise PushError("at", f"{value!r} is in the past (it is {iso(now)} now): give a later time.")
    return when.isoformat(), instant


class Reminders:
    """The reminders of every chat, and the loop that fires them."""

    def __init__(self, db: Database, store: Store, pushes: Pushes, *, default_tz: str = "UTC",
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.sql = PushStore(db)
        self.store = store
        self.pushes = pushes
        self.default_tz = default_tz
        self.clock = clock
        self.changed = asyncio.Event()  # a reminder was set or cancelled, a chat unblocked: look again
        self.looked: float | None = None  # the clock at the last look (None: none yet in this process)

    # -- reading ----------------------------------------------------------------------------

    @staticmethod
    def _of(row: Any) -> Reminder:
        return Reminder(id=row["id"], address=row["address"], text=row["text"], at=row["at"], cron=row["cron"],
                        tz=row["tz"], next_at=row["next_at"], last_fired=row["last_fired"], state=row["state"],
                        author=row["author"], created_at=row["created_at"], paused=bool(row["paused"]),
                        set_in=row["set_in"])

    async def active(self, address: str) -> list[Reminder]:
        """The chat's active reminders, the next due first."""
        return [self._of(r) for r in await self.sql.reminders(address)]

    async def get(self, address: str, reminder_id: str) -> Reminder | None:
        row = await self.sql.reminder(address, reminder_id)
        return None if row is None else self._of(row)

    # -- writing ----------------------------------------------------------------------------

    async def set(self, address: str, text: object, *, at: object = None, cron: object = None, tz: object = None,
                  author: str = "owner", set_in: str | None = None) -> Reminder:
        """A new reminder of the chat (W7); :class:`PushError` names the field at fault. The
        assistant's (``author="assistant"``, ``set_in`` the turn it sets it in) are bounded (S9)."""
        if not isinstance(text, str) or not text.strip():
            raise PushError("text", "text is what the reminder asks of you when it falls due: a non-empty string.")
        if len(text) > MAX_TEXT:
            raise PushError("text", f"text has {len(text)} characters; at most {MAX_TEXT}.")
        text = whole(text)
        if (at is None) == (cron is None):
            raise PushError("at" if at is None else "cron",
                            "Give exactly one of at (one time, ISO 8601 with offset) or cron (five fields, recurring).")
        now = self.clock()
        zone_name, zone = _zone(tz, self.default_tz)
        if at is not None:
            at_text, next_at = _parse_at(at, now)
            cron_text = None
        else:
            cron_text, next_at = _parse_cron(cron, zone, now)
            at_text = None
            if author == "assistant":
                _often(cron_text, zone, now)
        reminder_id = f"r{uuid.uuid4().hex[:12]}"
        async with self.db.transaction():
            if await self.store.chat(address) is None:
                raise PushError("chat", f"Iva has no chat {address}.", status=404, code="no_chat")
            if await self.sql.active_count(address) >= MAX_PER_CHAT:
                raise PushError("chat", f"This chat has {MAX_PER_CHAT} reminders already, the most it may have: "
                                        "cancel one first.", status=422, code="too_many")
            if author == "assistant":
                await self._within_the_assistants_share(address, recurring=cron_text is not None)
            await self.sql.add_reminder(id=reminder_id, address=address, text=text, at=at_text, cron=cron_text,
                                        tz=zone_name, next_at=next_at, author=author, set_in=set_in, created_at=now,
                                        updated_at=now)
            found = await self.get(address, reminder_id)  # before the commit, the last step (F14)
        assert found is not None
        logger.info("reminder_set", address=address, reminder=reminder_id, at=at_text, cron=cron_text, tz=zone_name,
                    next_at=iso(next_at), author=author)
        self.changed.set()
        return found

    async def _within_the_assistants_share(self, address: str, *, recurring: bool) -> None:
        """S9: the assistant's active reminders of the chat leave room for one more."""
        mine = await self.sql.assistants(address)
        if len(mine) >= ASSISTANT_MAX:
            raise PushError("chat", f"You have set {ASSISTANT_MAX} reminders in this chat already, the most you may "
                                    "set on your own: cancel one, or ask the owner to set it (/reminders, the owner "
                                    "API).", status=422, code="too_many")
        if recurring and sum(r["cron"] is not None for r in mine) >= ASSISTANT_RECURRING:
            raise PushError("cron", f"You have {ASSISTANT_RECURRING} recurring reminders in this chat already, the "
                                    "most you may set on your own: cancel one, set a one-time one (at), or ask the "
                                    "owner to set it.", status=422, code="too_many")

    async def cancel(self, address: str, reminder_id: str) -> bool:
        """True when an active reminder of the chat was cancelled."""
        async with self.db.transaction():
            done = await self.sql.cancel_reminder(address, reminder_id, self.clock())
        if done:
            logger.info("reminder_cancelled", address=address, reminder=reminder_id)
            self.changed.set()
        return bool(done)

    # -- firing -----------------------------------------------------------------------------

    async def fire_due(self) -> list[str]:
        """Fire what is due now (on the wall clock): each a pushed turn committed with the
        reminder's next instant. Returns the addresses woken."""
        woken: list[str] = []
        now = self.clock()
        if self.looked is None or now < self.looked:
            await self.recompute(now)
        self.looked = now
        while True:
            now = self.clock()
            fired: list[str] = []
            with outbox.detached():  # a broken one's line is sent after the commit, in a task of its own
                async with self.db.transaction():
                    rows = await self.sql.due_reminders(now, BATCH)
                    for row in rows:
                        reminder = self._of(row)
                        if await self._fire(reminder, now):
                            fired.append(reminder.address)
            for address in dict.fromkeys(fired):
                self.pushes.wake(address)
            woken.extend(fired)
            if len(rows) < BATCH:
                return list(dict.fromkeys(woken))

    async def _fire(self, r: Reminder, now: float) -> bool:
        """In the caller's transaction: one reminder's fire and its next instant."""
        assert r.next_at is not None
        due = r.next_at
        fresh = r.last_fired is None or due > r.last_fired
        last = max(due, r.last_fired or due)
        try:
            # A recurring one's next instant is the first after now (and after the last fire):
            # missed ones never fire one by one. Read first: a fault here touches nothing.
            upcoming = None if r.cron is None else _cron_next(r.cron, _zone(r.tz, "UTC")[1], max(now, last))
        except (PushError, StopIteration, ValueError, OverflowError) as exc:
            await self._broken(r, now, exc)
            return False
        if fresh:
            late = now - due > LATE_AFTER
            turn = PushedTurn(text=r.text, source="reminder", key=f"reminder:{r.id}:{iso(due)}", reminder=r.id,
                              due=due, late=late, set_by=r.author, set_in=r.set_in)
            row, created = await self.pushes.enqueue(r.address, turn)
            logger.info("reminder_fired", address=r.address, reminder=r.id, due=iso(due), late=late, queue_id=row,
                        new=created)
        await self.sql.reminder_fired(r.id, last_fired=last, next_at=upcoming, now=now)
        return fresh

    async def recompute(self, now: float) -> int:
        """F12: each recurring reminder's next instant, from the later of ``now`` and its last
        real fire, where that is sooner than the stored one (computed on a clock that was ahead
        since). How many moved."""
        moved = 0
        async with self.db.transaction():
            for row in await self.sql.recurring():
                r = self._of(row)
                assert r.cron is not None
                try:
                    upcoming = _cron_next(r.cron, _zone(r.tz, "UTC")[1], max(now, r.last_fired or now))
                except (PushError, StopIteration, ValueError):
                    continue  # its fire says so (a zone gone from tzdata)
                if r.next_at is None or upcoming < r.next_at:
                    await self.sql.reminder_moved(r.id, next_at=upcoming, now=now)
                    logger.info("reminder_recomputed", address=r.address, reminder=r.id, stored=iso(r.next_at),
                                next_at=iso(upcoming))
                    moved += 1
        return moved

    async def _broken(self, r: Reminder, now: float, exc: Exception) -> None:
        """In the caller's transaction: a reminder whose next instant cannot be read (its zone gone
        from tzdata) stops — it alone, never the batch nor any other chat's — and its chat is told
        once (the outbox key names it)."""
        logger.error("reminder_broken", address=r.address, reminder=r.id, tz=r.tz, cron=r.cron, error=str(exc)[:300])
        await self.sql.reminder_broken(r.id, now)
        chat = await self.store.chat(r.address)
        if chat is not None:
            await self.store.put_outgoing(
                r.address, f"reminder-broken:{r.id}", chat.chat_id, chat.thread_id,
                f"⚠️ The reminder “{' '.join(r.text.split())[:80]}” ({r.id}) stopped: its time could not be read "
                f"({' '.join(str(exc).split())[:120]}). Set it again (time zone {r.tz!r}).", format="plain")

    async def next_due(self) -> float | None:
        return await self.sql.next_due()

    async def run(self, *, look_every: float = LOOK_EVERY) -> None:
        """Forever: fire what is due, then sleep until the next instant (on the monotonic clock,
        at most ``look_every``) or until a reminder changes. A fault is logged and tried again."""
        failures = 0
        while True:
            self.changed.clear()
            try:
                await self.fire_due()
                upcoming = await self.next_due()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if corrupt(exc):  # F2: a bad file stops the bridge; the restart's check moves it aside
                    logger.error("state_database_corrupt", error=str(exc), during="reminders")
                    raise StateCorrupt(str(exc)) from exc
                failures += 1
                logger.warning("reminders_fire_failed", error=str(exc)[:300], failures=failures)
                upcoming = None
            wait = look_every if upcoming is None else min(look_every, max(0.0, upcoming - self.clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.changed.wait()
