"""The version 26 wire (eve 0.80.x, PROTOCOL.md §3–§7): one event a line, ``{type, data,
meta: {id, at, deliveryIds}}``; the line's number is its position. Kept for one deprecation
window (SPEC V1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._model import (
    ContextSettled,
    ContextStarted,
    Event,
    Idle,
    InputTaken,
    Phase,
    Position,
    Question,
    QuestionOpened,
    QuestionSettled,
    RunBegan,
    RunEnded,
    SessionBegan,
    SessionEnded,
    TextDelta,
    TextDone,
    ToolCalled,
    ToolSettled,
    TurnBegan,
    TurnEnded,
    TurnPaused,
    Usage,
    UsageRecorded,
)
from ._wire import Malformed, load, mapping, number, options, text

__all__ = ["Reader26"]

VERSION = 26


def _question(raw: Mapping[str, Any]) -> Question | None:
    request_id = raw.get("requestId")
    if not isinstance(request_id, str):
        return None
    kind = {"tool-approval": "approval", "session-limit": "budget"}.get(str(raw.get("kind")),
                                                                       str(raw.get("kind") or "question"))
    return Question(request_id, kind, str(raw.get("prompt") or ""), options(raw.get("options")),
                    bool(raw.get("allowFreeform")))


class Reader26:
    """Turns the lines of a version 26 stream into Iva's events."""

    version = VERSION

    def line(self, raw_line: bytes, line_no: int) -> list[Event] | Malformed:
        raw = load(raw_line, line_no)
        if isinstance(raw, Malformed):
            return raw
        type_ = raw.get("type")
        if not isinstance(type_, str):
            return Malformed(line_no, raw_line[:300].decode("utf-8", "replace"), "not an event object with a type")
        meta, data = mapping(raw.get("meta")), mapping(raw.get("data"))
        event_id = meta.get("id")
        if not isinstance(event_id, str) or not event_id:
            return Malformed(line_no, raw_line[:300].decode("utf-8", "replace"), "event without meta.id")
        listed = meta.get("deliveryIds")
        deliveries = tuple(d for d in listed if isinstance(d, str)) if isinstance(listed, list) else ()
        at = meta.get("at") if isinstance(meta.get("at"), str) else None
        pos, after = Position(line_no, 0, VERSION), Position(line_no + 1, 0, VERSION)
        base: dict[str, Any] = {"position": pos, "after": after, "key": event_id, "at": at}
        turn = data.get("turnId") if isinstance(data.get("turnId"), str) else None
        event: Event | None = None
        extra: Event | None = None  # a second event of the line, at index 1
        match type_:
            case "session.started":
                runtime = mapping(data.get("runtime"))
                version = runtime.get("eveVersion")
                event = SessionBegan(**base, eve_version=version if isinstance(version, str) else None)
            case "turn.started":
                event = TurnBegan(**base, turn_id=turn, deliveries=deliveries)
            case "message.received":
                event = InputTaken(**base, turn_id=turn, deliveries=deliveries, text=text(data, "message"))
            case "step.started":
                event = RunBegan(**base, turn_id=turn)
            case "message.appended":
                event = TextDelta(**base, delta=text(data, "messageDelta"))
            case "message.completed":
                event = TextDone(**base, text=text(data, "message"), phase=Phase.REPLY,
                                 final=data.get("finishReason") == "stop")
            case "step.completed":
                usage = Usage.from_json(data.get("usage"))
                finish = data.get("finishReason") if isinstance(data.get("finishReason"), str) else None
                ended = RunEnded(position=pos, after=after, key=event_id, at=at, finish_reason=finish)
                if usage is not None:
                    event = UsageRecorded(**{**base, "after": Position(line_no, 1, VERSION)}, usage=usage, turn_id=turn)
                    extra = RunEnded(position=Position(line_no, 1, VERSION), after=after, key=f"{event_id}/1", at=at,
                                     finish_reason=finish)
                else:
                    event = ended
            case "action.input.appended":
                event = ToolCalled(**base, names=(text(data, "toolName"),))
            case "actions.requested":
                actions = data.get("actions")
                names = tuple(a["toolName"] for a in actions if isinstance(a, Mapping)
                              and isinstance(a.get("toolName"), str)) if isinstance(actions, list) else ()
                event = ToolCalled(**base, names=names)
            case "action.result":
                event = ToolSettled(**base, outcome=str(data.get("status") or "completed"))
            case "turn.completed" | "turn.failed" | "turn.cancelled":
                details = mapping(data.get("details"))
                message = details.get("message") if isinstance(details.get("message"), str) else text(data, "message")
                code = data.get("code") if isinstance(data.get("code"), str) else None
                event = TurnEnded(**base, turn_id=turn, outcome=type_.removeprefix("turn."), code=code,
                                  message=str(message), deliveries=deliveries)
            case "turn.waiting" if data.get("on") == "input":
                event = TurnPaused(**base)
            case "input.requested":
                requests = data.get("requests")
                parsed = [_question(r) for r in (requests if isinstance(requests, list) else [])
                          if isinstance(r, Mapping)]
                event = QuestionOpened(**base, questions=tuple(q for q in parsed if q is not None))
            case "input.resolved":
                resolutions = data.get("resolutions")
                ids = tuple(r["requestId"] for r in (resolutions if isinstance(resolutions, list) else [])
                            if isinstance(r, Mapping) and isinstance(r.get("requestId"), str))
                event = QuestionSettled(**base, ids=ids)
            case "session.waiting":
                event = Idle(**base, usage=Usage.from_json(data.get("usage")))
            case "session.completed" | "session.failed":
                event = SessionEnded(**base, outcome="completed" if type_ == "session.completed" else "failed")
            case "compaction.requested":
                estimate = data.get("usageInputTokens")
                event = ContextStarted(**base, kind="compaction", estimate=number(estimate))
            case "compaction.completed":
                event = ContextSettled(**base, kind="compaction", outcome="completed")
            case "context.cleared":
                event = ContextSettled(**base, kind="clear", outcome="completed")
        return [e for e in (event, extra) if e is not None]
