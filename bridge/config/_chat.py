"""The chat's side: eve, the turns, compaction, who may talk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ._env import Env

__all__ = [
    "DEFAULT_BATCH", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_COMPACT_ACK_SECONDS", "DEFAULT_COMPACT_CEILING",
    "DEFAULT_COMPACT_PERCENT", "DEFAULT_EVE_GRACE", "DEFAULT_INVITE_HOURS", "DEFAULT_MANUAL_COMPACT_MIN",
    "DEFAULT_MAX_TURNS", "DEFAULT_SEND_ATTEMPTS", "DEFAULT_SEND_MAX_AGE", "ChatConfig", "CompactionConfig",
    "EveConfig", "PeopleConfig", "read_chat", "read_compaction", "read_eve", "read_people",
]

DEFAULT_EVE_GRACE = 3.0  # seconds eve may take to start a turn with a message we are unsure it has (F4)
# a message eve answers 5xx (and never started) goes this often, then the person is told (F6)
DEFAULT_SEND_ATTEMPTS = 5
# seconds: a message eve failed on and still fails on this long after it came is given up (F6)
DEFAULT_SEND_MAX_AGE = 3600.0
DEFAULT_BUSY_TIMEOUT = 900.0
DEFAULT_MAX_TURNS = 16
DEFAULT_BATCH = 10
DEFAULT_COMPACT_PERCENT = 60
DEFAULT_COMPACT_CEILING = 110_000
DEFAULT_MANUAL_COMPACT_MIN = 30_000
DEFAULT_COMPACT_ACK_SECONDS = 5.0
DEFAULT_INVITE_HOURS = 24  # how long an /invite link stays good (P2)

TurnPolicy = Literal["queue", "immediate"]
Streaming = Literal["draft", "off"]


@dataclass(frozen=True, slots=True)
class EveConfig:
    """The eve server (IVA_EVE_URL, IVA_EVE_TOKEN); how long it may take to start a turn with a
    message whose send's answer was lost (``grace``, F4); how often and how long a message it
    fails on is sent again before the person is told (``send_attempts``, ``send_max_age``, F6)."""

    url: str
    token: str | None = field(default=None, repr=False)
    grace: float = DEFAULT_EVE_GRACE
    send_attempts: int = DEFAULT_SEND_ATTEMPTS
    send_max_age: float = DEFAULT_SEND_MAX_AGE


@dataclass(frozen=True, slots=True)
class ChatConfig:
    """How a chat's turns run: whether a message waits its turn or steers the running one
    (``turn_policy``), the answer shown live as a draft (``streaming``), how long a busy chat may
    go without progress (``busy_timeout``), turns at once (``max_turns``), messages per turn
    (``batch_size``)."""

    turn_policy: TurnPolicy = "queue"
    streaming: Streaming = "draft"
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    max_turns: int = DEFAULT_MAX_TURNS
    batch_size: int = DEFAULT_BATCH


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """Parking and compaction (C1-C9, N6′): the threshold is min(``percent`` × window,
    ``ceiling``), the window ``context_window`` (None: eve's, or the chat's model's); /compact's
    floor (``manual_min``); how long the chat is held for eve's answer to a compact request
    (``ack_seconds``); eve's in-turn safety net as a percent of the window when the agent sets it
    otherwise than min(75% × window, 137 500) (``inturn_percent``, C9; the [window] wall while
    parking is off)."""

    context_window: int | None = None
    percent: int = DEFAULT_COMPACT_PERCENT
    ceiling: int = DEFAULT_COMPACT_CEILING
    inturn_percent: float | None = None
    manual_min: int = DEFAULT_MANUAL_COMPACT_MIN
    ack_seconds: float = DEFAULT_COMPACT_ACK_SECONDS


@dataclass(frozen=True, slots=True)
class PeopleConfig:
    """Who may talk from the environment (IVA_OWNER_IDS, IVA_ALLOWED_USER_IDS; without owners the
    first person to open the pairing link becomes one, kept in the state database, P1) and how
    long an /invite link stays good (P2)."""

    owner_ids: frozenset[int] = frozenset()
    allowed_user_ids: frozenset[int] = frozenset()
    invite_hours: int = DEFAULT_INVITE_HOURS

    def may_talk(self, user_id: int) -> bool:
        return user_id in self.owner_ids or user_id in self.allowed_user_ids


def read_eve(env: Env) -> EveConfig:
    return EveConfig(
        url=env.url("IVA_EVE_URL", None) or "",
        token=env.get("IVA_EVE_TOKEN"),
        grace=env.number("IVA_EVE_GRACE", DEFAULT_EVE_GRACE, low=0.5),
        send_attempts=env.integer("IVA_EVE_SEND_ATTEMPTS", DEFAULT_SEND_ATTEMPTS, low=1, high=100),
        send_max_age=env.number("IVA_EVE_SEND_MAX_AGE", DEFAULT_SEND_MAX_AGE, low=1.0),
    )


def read_chat(env: Env) -> ChatConfig:
    return ChatConfig(
        turn_policy=env.choice("IVA_TURN_POLICY", ("queue", "immediate"), "queue"),
        streaming=env.choice("IVA_STREAMING", ("draft", "off"), "draft"),
        busy_timeout=env.number("IVA_BUSY_TIMEOUT", DEFAULT_BUSY_TIMEOUT, low=1.0),
        max_turns=env.integer("IVA_MAX_TURNS", DEFAULT_MAX_TURNS, low=1, high=10_000),
        batch_size=env.integer("IVA_BATCH", DEFAULT_BATCH, low=1, high=100),
    )


def read_compaction(env: Env) -> CompactionConfig:
    return CompactionConfig(
        context_window=env.whole("IVA_CONTEXT_WINDOW", None, low=1000),
        percent=env.integer("IVA_COMPACT_PERCENT", DEFAULT_COMPACT_PERCENT, low=1, high=100),
        ceiling=env.integer("IVA_COMPACT_CEILING", DEFAULT_COMPACT_CEILING, low=1000),
        inturn_percent=min(100.0, env.number("IVA_INTURN_PERCENT", 0.0, low=1, what="a percent")) or None,
        manual_min=env.integer("IVA_MANUAL_COMPACT_MIN", DEFAULT_MANUAL_COMPACT_MIN, low=0),
        ack_seconds=env.number("IVA_COMPACT_ACK_SECONDS", DEFAULT_COMPACT_ACK_SECONDS, low=0.1),
    )


def read_people(env: Env) -> PeopleConfig:
    # Optional since P1: without owners the first person to open the pairing link printed at
    # start becomes the owner, kept in the state database.
    return PeopleConfig(
        owner_ids=env.ids("IVA_OWNER_IDS"),
        allowed_user_ids=env.ids("IVA_ALLOWED_USER_IDS"),
        invite_hours=env.integer("IVA_INVITE_HOURS", DEFAULT_INVITE_HOURS, low=1, high=24 * 30),
    )
