"""Typed events of eve's durable session stream (PROTOCOL.md §3-§7).

Every event carries its absolute stream index, eve's stable ``meta.id`` and the delivery ids
of the messages it belongs to. Unknown types come through as :class:`Event` itself, so a newer
eve never breaks the reader; a line that is not an event is a :class:`MalformedLine`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "ActionInputAppended",
    "ActionResult",
    "ActionsRequested",
    "CompactionCompleted",
    "CompactionRequested",
    "ContextCleared",
    "Event",
    "InputOption",
    "InputRequest",
    "InputRequested",
    "InputResolved",
    "MalformedLine",
    "MessageAppended",
    "MessageCompleted",
    "MessageReceived",
    "SessionCompleted",
    "SessionFailed",
    "SessionStarted",
    "SessionWaiting",
    "StepCompleted",
    "StepFailed",
    "StepStarted",
    "TurnCancelled",
    "TurnCompleted",
    "TurnFailed",
    "TurnStarted",
    "TurnWaiting",
    "Usage",
    "parse_event",
]


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Usage | None:
        if not isinstance(raw, Mapping):
            return None

        def num(key: str) -> int | None:
            value = raw.get(key)
            return int(value) if isinstance(value, int | float) else None

        return cls(num("inputTokens"), num("outputTokens"), num("cacheReadTokens"))


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A stream line that is not a JSON event; reported and skipped, never fatal."""

    index: int
    line: str
    error: str


@dataclass(frozen=True, slots=True)
class Event:
    """Any stream event. Subclasses add typed views of ``data`` for the types we act on."""

    TYPE: ClassVar[str] = ""

    index: int
    type: str
    id: str
    at: str | None
    delivery_ids: tuple[str, ...]
    data: Mapping[str, Any] = field(repr=False)

    @property
    def turn_id(self) -> str | None:
        value = self.data.get("turnId")
        return value if isinstance(value, str) else None

    @property
    def terminal(self) -> bool:
        """True for the events that end a turn."""
        return False


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class SessionStarted(Event):
    TYPE: ClassVar[str] = "session.started"


@dataclass(frozen=True, slots=True)
class TurnStarted(Event):
    TYPE: ClassVar[str] = "turn.started"


@dataclass(frozen=True, slots=True)
class MessageReceived(Event):
    TYPE: ClassVar[str] = "message.received"

    @property
    def message(self) -> str:
        return _text(self.data, "message")


@dataclass(frozen=True, slots=True)
class StepStarted(Event):
    TYPE: ClassVar[str] = "step.started"


@dataclass(frozen=True, slots=True)
class MessageAppended(Event):
    TYPE: ClassVar[str] = "message.appended"

    @property
    def delta(self) -> str:
        return _text(self.data, "messageDelta")


@dataclass(frozen=True, slots=True)
class MessageCompleted(Event):
    """A completed assistant text block: what the person gets to read."""

    TYPE: ClassVar[str] = "message.completed"

    @property
    def message(self) -> str:
        return _text(self.data, "message")

    @property
    def finish_reason(self) -> str | None:
        return self.data.get("finishReason")


@dataclass(frozen=True, slots=True)
class StepCompleted(Event):
    TYPE: ClassVar[str] = "step.completed"

    @property
    def usage(self) -> Usage | None:
        return Usage.from_json(self.data.get("usage"))

    @property
    def finish_reason(self) -> str | None:
        return self.data.get("finishReason")


@dataclass(frozen=True, slots=True)
class StepFailed(Event):
    TYPE: ClassVar[str] = "step.failed"


@dataclass(frozen=True, slots=True)
class ActionInputAppended(Event):
    """The model is writing a tool call's input: the first sign of a tool at work."""

    TYPE: ClassVar[str] = "action.input.appended"

    @property
    def tool_name(self) -> str:
        return _text(self.data, "toolName")


@dataclass(frozen=True, slots=True)
class ActionsRequested(Event):
    TYPE: ClassVar[str] = "actions.requested"

    @property
    def tool_names(self) -> tuple[str, ...]:
        raw = self.data.get("actions")
        if not isinstance(raw, list):
            return ()
        return tuple(a["toolName"] for a in raw if isinstance(a, Mapping) and isinstance(a.get("toolName"), str))


@dataclass(frozen=True, slots=True)
class ActionResult(Event):
    TYPE: ClassVar[str] = "action.result"


@dataclass(frozen=True, slots=True)
class TurnCompleted(Event):
    TYPE: ClassVar[str] = "turn.completed"

    @property
    def terminal(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class TurnFailed(Event):
    TYPE: ClassVar[str] = "turn.failed"

    @property
    def terminal(self) -> bool:
        return True

    @property
    def code(self) -> str | None:
        return self.data.get("code")

    @property
    def message(self) -> str:
        details = self.data.get("details")
        if isinstance(details, Mapping):
            message = details.get("message")
            if isinstance(message, str):
                return message
        return _text(self.data, "message")


@dataclass(frozen=True, slots=True)
class TurnCancelled(Event):
    TYPE: ClassVar[str] = "turn.cancelled"

    @property
    def terminal(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class TurnWaiting(Event):
    """The turn waits on the person (``on: "input"``) or on something else."""

    TYPE: ClassVar[str] = "turn.waiting"

    @property
    def on(self) -> str | None:
        return self.data.get("on")


@dataclass(frozen=True, slots=True)
class InputOption:
    id: str
    label: str


@dataclass(frozen=True, slots=True)
class InputRequest:
    """One question or approval the turn waits on (eve's ``InputRequest``)."""

    request_id: str
    kind: str  # "question" | "tool-approval" | "session-limit"
    prompt: str
    options: tuple[InputOption, ...]
    allow_freeform: bool

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> InputRequest | None:
        request_id = raw.get("requestId")
        if not isinstance(request_id, str):
            return None
        listed = raw.get("options")
        options = tuple(
            InputOption(str(o["id"]), str(o.get("label") or o["id"]))
            for o in (listed if isinstance(listed, list) else [])  # a non-list must not raise (F6)
            if isinstance(o, Mapping) and isinstance(o.get("id"), str)
        )
        return cls(request_id, str(raw.get("kind") or "question"), str(raw.get("prompt") or ""), options,
                   bool(raw.get("allowFreeform")))


@dataclass(frozen=True, slots=True)
class InputRequested(Event):
    """The run paused for a person: approvals or questions, answered with ``inputResponses``."""

    TYPE: ClassVar[str] = "input.requested"

    @property
    def requests(self) -> tuple[InputRequest, ...]:
        raw = self.data.get("requests")
        if not isinstance(raw, list):
            return ()
        parsed = (InputRequest.from_json(r) for r in raw if isinstance(r, Mapping))
        return tuple(r for r in parsed if r is not None)


@dataclass(frozen=True, slots=True)
class InputResolved(Event):
    TYPE: ClassVar[str] = "input.resolved"

    @property
    def request_ids(self) -> tuple[str, ...]:
        raw = self.data.get("resolutions")
        if not isinstance(raw, list):
            return ()
        return tuple(r["requestId"] for r in raw if isinstance(r, Mapping) and isinstance(r.get("requestId"), str))


@dataclass(frozen=True, slots=True)
class SessionWaiting(Event):
    """The session is parked, waiting for the next message."""

    TYPE: ClassVar[str] = "session.waiting"

    @property
    def usage(self) -> Usage | None:
        return Usage.from_json(self.data.get("usage"))


@dataclass(frozen=True, slots=True)
class SessionCompleted(Event):
    """The session was retired (reset); the stream closes after it."""

    TYPE: ClassVar[str] = "session.completed"


@dataclass(frozen=True, slots=True)
class SessionFailed(Event):
    TYPE: ClassVar[str] = "session.failed"


@dataclass(frozen=True, slots=True)
class CompactionRequested(Event):
    TYPE: ClassVar[str] = "compaction.requested"

    @property
    def usage_input_tokens(self) -> float | None:
        value = self.data.get("usageInputTokens")
        return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True, slots=True)
class CompactionCompleted(Event):
    TYPE: ClassVar[str] = "compaction.completed"


@dataclass(frozen=True, slots=True)
class ContextCleared(Event):
    TYPE: ClassVar[str] = "context.cleared"


_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        SessionStarted,
        TurnStarted,
        MessageReceived,
        StepStarted,
        MessageAppended,
        MessageCompleted,
        StepCompleted,
        StepFailed,
        ActionInputAppended,
        ActionsRequested,
        ActionResult,
        TurnCompleted,
        TurnFailed,
        TurnCancelled,
        TurnWaiting,
        InputRequested,
        InputResolved,
        SessionWaiting,
        SessionCompleted,
        SessionFailed,
        CompactionRequested,
        CompactionCompleted,
        ContextCleared,
    )
}


def parse_event(line: str | bytes, index: int) -> Event | MalformedLine:
    """Parse one NDJSON line of the stream found at absolute ``index``."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        return MalformedLine(index, text[:300], f"not JSON: {exc}")
    except RecursionError:
        return MalformedLine(index, text[:300], "nested past the parser's depth")
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        return MalformedLine(index, text[:300], "not an event object with a type")
    meta_raw, data_raw = raw.get("meta"), raw.get("data")
    meta: dict[str, Any] = meta_raw if isinstance(meta_raw, dict) else {}
    data: dict[str, Any] = data_raw if isinstance(data_raw, dict) else {}
    event_id = meta.get("id")
    if not isinstance(event_id, str) or not event_id:
        return MalformedLine(index, text[:300], "event without meta.id")
    deliveries = meta.get("deliveryIds")
    delivery_ids = tuple(d for d in deliveries if isinstance(d, str)) if isinstance(deliveries, list) else ()
    at = meta.get("at") if isinstance(meta.get("at"), str) else None
    cls = _TYPES.get(raw["type"], Event)
    return cls(index=index, type=raw["type"], id=event_id, at=at, delivery_ids=delivery_ids, data=data)
