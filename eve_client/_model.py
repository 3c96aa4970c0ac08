"""Iva's own model of a session's stream: what happened, in Iva's words, at which position.

eve has spoken two wire forms (stream version 26, eve 0.80.x: one event a line; version 27,
eve ≥ 0.84 and 1.x: lines of several facts, progress records, transport records). Both readers
(:mod:`._wire26`, :mod:`._wire27`) produce these events and nothing else, so the bridge never
sees a wire shape or an eve event name (SPEC V1).

Every event has its :class:`Position` — (line, index of the fact in its line), with the stream
version it was read on — and ``after``, the cursor that follows it; ``key`` is unique per
session and position (an outbox row keyed on it is written once, V2).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ContextSettled", "ContextStarted", "Event", "Idle", "InputTaken", "Phase", "Position", "Question",
    "QuestionOpened", "QuestionOption", "QuestionSettled", "RunBegan", "RunEnded", "SessionBegan", "SessionEnded",
    "TextDelta", "TextDone", "ToolCalled", "ToolSettled", "TurnBegan", "TurnEnded", "TurnPaused", "Usage",
    "UsageRecorded",
]


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A place in a session's stream: the line and the fact's index in it. ``version`` is the
    stream version the position was read on (0: nothing read yet); it is not compared."""

    line: int = 0
    index: int = 0
    version: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return f"{self.line}.{self.index}"


@dataclass(frozen=True, slots=True)
class Usage:
    """One model call's tokens (v27), or a step's (v26)."""

    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Usage | None:
        if not isinstance(raw, Mapping):
            return None

        def num(key: str) -> int | None:
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return None  # NaN, ±Infinity or a string from a broken eve: no figure (F6)
            return int(value)

        return cls(num("inputTokens"), num("outputTokens"), num("cacheReadTokens"))


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened in the session. ``key`` names it uniquely in the session."""

    position: Position
    after: Position
    key: str
    at: str | None = field(default=None, kw_only=True)

    @property
    def what(self) -> str:
        """The kind of event in Iva's words (for logs)."""
        return type(self).__name__


@dataclass(frozen=True, slots=True)
class SessionBegan(Event):
    """The session's first event; ``eve_version``: the eve that started it, where eve says."""

    eve_version: str | None = None


@dataclass(frozen=True, slots=True)
class SessionEnded(Event):
    """The session is over at eve (ended, failed): nothing more will come."""

    outcome: str = "completed"


@dataclass(frozen=True, slots=True)
class TurnBegan(Event):
    """eve began a turn; ``deliveries`` are the messages it began with (when eve names them)."""

    turn_id: str | None = None
    deliveries: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InputTaken(Event):
    """A turn took messages in (its first, or a steer folded into it)."""

    turn_id: str | None = None
    deliveries: tuple[str, ...] = ()
    text: str = ""


@dataclass(frozen=True, slots=True)
class RunBegan(Event):
    """A model call (a step) began; ``context`` when it belongs to a context change."""

    turn_id: str | None = None
    context: bool = False


@dataclass(frozen=True, slots=True)
class RunEnded(Event):
    """A model call ended: ``finish_reason`` as the model said (``stop``, ``tool-calls``, …)."""

    finish_reason: str | None = None
    outcome: str = "completed"


class Phase(enum.StrEnum):
    """What a finished text block is: the answer, or words on the way to a tool (narration)."""

    REPLY = "reply"
    NARRATION = "narration"


@dataclass(frozen=True, slots=True)
class TextDelta(Event):
    part: str = ""
    delta: str = ""


@dataclass(frozen=True, slots=True)
class TextDone(Event):
    """A finished text block. ``final``: the model's last words of its call (no tool follows)."""

    part: str = ""
    text: str = ""
    phase: Phase = Phase.REPLY
    interrupted: bool = False
    final: bool = True


@dataclass(frozen=True, slots=True)
class ToolCalled(Event):
    """The model asked for tools (or began writing a call's input): the first sign of one."""

    names: tuple[str, ...] = ()
    label: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSettled(Event):
    name: str | None = None
    outcome: str = "completed"


@dataclass(frozen=True, slots=True)
class UsageRecorded(Event):
    """A model call's usage; ``context`` when the call belongs to a context change (a
    compaction's summary), not to the turn."""

    usage: Usage = Usage(None, None)
    turn_id: str | None = None
    context: bool = False


@dataclass(frozen=True, slots=True)
class QuestionOption:
    id: str
    label: str


# What a turn may wait on a person for (eve 1.x's interaction kinds; 0.80's input kinds mapped to
# them by its reader): ``budget`` is eve's session-usage guardrail (``limits.sessionUsage``).
KNOWN_QUESTIONS = frozenset({"approval", "question", "budget", "sign-in"})


@dataclass(frozen=True, slots=True)
class Question:
    """Something the turn waits on a person for: an approval, a question, a budget prompt, a
    sign-in (``kind`` as eve says it; ``link`` where eve gives one; a sign-in's device ``code``
    and the ``provider`` it signs in to)."""

    id: str
    kind: str
    prompt: str
    options: tuple[QuestionOption, ...] = ()
    allow_freeform: bool = False
    link: str | None = None
    code: str | None = None
    provider: str | None = None

    @property
    def known(self) -> bool:
        """A kind Iva knows how to show (V6): anything else is said and the turn stopped."""
        return self.kind in KNOWN_QUESTIONS


@dataclass(frozen=True, slots=True)
class QuestionOpened(Event):
    questions: tuple[Question, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnPaused(Event):
    """The turn cannot go on until a person answers."""


@dataclass(frozen=True, slots=True)
class QuestionSettled(Event):
    ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnEnded(Event):
    """The turn is over: ``outcome`` completed, failed, cancelled (or a newer word: still over).
    ``deliveries``: the messages it answered, where eve names them."""

    turn_id: str | None = None
    outcome: str = "completed"
    code: str | None = None
    message: str = ""
    deliveries: tuple[str, ...] = ()
    reply: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"


@dataclass(frozen=True, slots=True)
class ContextStarted(Event):
    """A context change began: ``kind`` compaction or clear; ``estimate`` the input that set off
    an automatic compaction; ``in_turn`` when it runs inside a turn (eve's safety net)."""

    change_id: str | None = None
    kind: str = "compaction"
    estimate: int | None = None
    in_turn: bool = False


@dataclass(frozen=True, slots=True)
class ContextSettled(Event):
    """A context change ended: ``outcome`` completed, failed, interrupted (or a newer word)."""

    change_id: str | None = None
    kind: str = "compaction"
    outcome: str = "completed"
    in_turn: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "completed"


@dataclass(frozen=True, slots=True)
class Idle(Event):
    """eve is idle: what ran (a turn, a context change) is over and nothing else runs. On
    version 26 eve says so (``session.waiting``); on 27 it is the end of the line that settled
    the turn or the change."""

    usage: Usage | None = None
