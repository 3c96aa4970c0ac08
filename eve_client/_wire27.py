"""The version 27 wire (eve ≥ 0.84, 1.x; PROTOCOL-27.md §3–§9).

A stream is records, one a line: event lines ``{"at", "facts": [{type, data, scope?}, …]}``,
progress records ``{"progress": {type, data, scope?}}`` (both numbered lines), and transport
records ``{"$eve": …}`` (not lines). A fact's position is (line, index in ``facts``). Unknown
fact types, progress types, fields and outcomes are ignored as eve's stability rules say; a
new outcome still ends what it settles.

eve says nothing like version 26's ``session.waiting``: the end of a line that settled a turn
(or a context change outside a turn) is where eve is idle, and the reader says so
(:class:`~._model.Idle`, at the index after the line's last fact)."""

from __future__ import annotations

import dataclasses
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
from ._wire import Malformed, Transport, load, mapping, number, options, text

__all__ = ["Reader27"]

VERSION = 27
_PARTS_REMEMBERED = 256


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _question(data: Mapping[str, Any]) -> Question | None:
    interaction = _str(data.get("interactionId"))
    if interaction is None:
        return None
    request = mapping(data.get("request"))
    # A sign-in's challenge is ``request.signIn`` (url, userCode, instructions, displayName: eve's
    # docs, connections/index.mdx); the flat names are read too, in case a channel flattens it.
    sign_in = mapping(request.get("signIn"))
    link = next((v for k in ("url", "link", "authorizationUrl", "signInUrl")
                 for where in (sign_in, request) if (v := _str(where.get(k)))), None)
    prompt = text(request, "prompt") or text(sign_in, "instructions")
    return Question(interaction, str(request.get("kind") or "question"), prompt,
                    options(request.get("options")),
                    bool(request.get("allowFreeform")), link,
                    code=_str(sign_in.get("userCode")), provider=_str(sign_in.get("displayName")))


class Reader27:
    """Turns the records of a version 27 stream into Iva's events. One reader follows one
    session across reconnects: it remembers which text parts are text (only a part's first
    delta says so)."""

    version = VERSION

    def __init__(self, session_id: str) -> None:
        self._session = session_id
        self._kinds: dict[str, str] = {}

    def line(self, raw_line: bytes, number_: int) -> list[Event] | Malformed | Transport:
        raw = load(raw_line, number_)
        if isinstance(raw, Malformed):
            return raw
        if "$eve" in raw:
            return Transport(str(raw.get("$eve")), number(raw.get("next")))
        at = _str(raw.get("at"))
        if isinstance(raw.get("facts"), list):
            facts = raw["facts"]
        elif isinstance(raw.get("progress"), Mapping):
            facts = [raw["progress"]]
        else:
            return Malformed(number_, raw_line[:300].decode("utf-8", "replace"), "neither facts, progress nor $eve")
        events: list[Event] = []
        settled = False  # the line ended a turn, or a context change outside one
        for index, fact in enumerate(facts):
            if not isinstance(fact, Mapping) or not isinstance(fact.get("type"), str):
                continue
            base = {"position": Position(number_, index, VERSION), "after": Position(number_, index + 1, VERSION),
                    "key": f"{self._session}/{number_}.{index}", "at": at}
            event = self._fact(fact["type"], mapping(fact.get("data")), mapping(fact.get("scope")), facts, base)
            if event is None:
                continue
            events.append(event)
            if isinstance(event, TurnEnded) or (isinstance(event, ContextSettled) and not event.in_turn):
                settled = True
            elif isinstance(event, TurnBegan | ContextStarted | RunBegan):
                settled = False  # something runs again by the line's end
        if settled:
            events.append(Idle(position=Position(number_, len(facts), VERSION),
                               after=Position(number_ + 1, 0, VERSION),
                               key=f"{self._session}/{number_}.{len(facts)}", at=at))
        if events:
            events[-1] = dataclasses.replace(events[-1], after=Position(number_ + 1, 0, VERSION))
        return events

    def _fact(self, type_: str, data: Mapping[str, Any], scope: Mapping[str, Any], facts: list[Any],
              base: dict[str, Any]) -> Event | None:
        turn = _str(data.get("turnId")) or _str(scope.get("turnId"))
        match type_:
            case "session.started":
                return SessionBegan(**base, eve_version=_str(mapping(data.get("runtime")).get("eveVersion")))
            case "turn.started":
                cause = _str(mapping(data.get("cause")).get("deliveryId"))
                return TurnBegan(**base, turn_id=turn, deliveries=(cause,) if cause else ())
            case "delivery.consumed":
                delivery = _str(data.get("deliveryId"))
                parts = data.get("parts")
                words = "\n".join(p["text"] for p in (parts if isinstance(parts, list) else [])
                                  if isinstance(p, Mapping) and isinstance(p.get("text"), str))
                return InputTaken(**base, turn_id=turn, deliveries=(delivery,) if delivery else (), text=words)
            case "model.requested":
                owner = mapping(data.get("owner"))
                return RunBegan(**base, turn_id=turn or _str(owner.get("turnId")),
                                context="changeId" in scope or "changeId" in owner)
            case "model.settled":
                return RunEnded(**base, finish_reason=_str(data.get("finishReason")),
                                outcome=str(data.get("outcome") or "completed"))
            case "content.delta":
                part = text(data, "partId")
                kind = _str(data.get("kind"))
                if kind is not None:
                    self._remember(part, kind)
                if (kind or self._kinds.get(part, "text")) != "text":
                    return None
                return TextDelta(**base, part=part, delta=text(data, "delta"))
            case "content.completed":
                part = text(data, "partId")
                self._kinds.pop(part, None)
                if data.get("kind", "text") != "text":
                    return None
                phase = Phase.REPLY if data.get("phase") == "reply" else Phase.NARRATION
                return TextDone(**base, part=part, text=text(data, "value"), phase=phase,
                                interrupted=data.get("interrupted") is True, final=phase is Phase.REPLY)
            case "call.input":
                return ToolCalled(**base, names=(text(data, "name"),))
            case "call.requested":
                capability = mapping(data.get("capability"))
                if capability.get("hidden") is True:
                    return None
                return ToolCalled(**base, names=(text(capability, "name"),), label=_str(capability.get("label")))
            case "call.settled":
                return ToolSettled(**base, outcome=str(data.get("outcome") or "completed"))
            case "usage.recorded":
                usage = Usage.from_json(data.get("usage"))
                if usage is None:
                    return None
                return UsageRecorded(**base, usage=usage, turn_id=_str(scope.get("turnId")),
                                     context="changeId" in scope)
            case "interaction.opened":
                question = _question(data)
                return QuestionOpened(**base, questions=(question,)) if question else None
            case "turn.paused":
                return TurnPaused(**base)
            case "interaction.settled":
                interaction = _str(data.get("interactionId"))
                return QuestionSettled(**base, ids=(interaction,) if interaction else ())
            case "turn.settled":
                error = mapping(data.get("error"))
                reply = data.get("reply")
                handled = tuple(
                    d for f in facts if isinstance(f, Mapping) and f.get("type") == "delivery.settled"
                    and (d := _str(mapping(f.get("data")).get("deliveryId")))
                    and _str(mapping(f.get("data")).get("turnId")) in (None, turn)
                )
                return TurnEnded(**base, turn_id=turn, outcome=str(data.get("outcome") or "completed"),
                                 code=_str(error.get("code")), message=text(error, "message"), deliveries=handled,
                                 reply=tuple(r for r in (reply if isinstance(reply, list) else [])
                                             if isinstance(r, str)))
            case "context.started":
                trigger = mapping(data.get("trigger"))
                return ContextStarted(**base, change_id=_str(data.get("changeId")), kind=str(data.get("kind") or ""),
                                      estimate=number(trigger.get("inputTokens")), in_turn=turn is not None)
            case "context.settled":
                return ContextSettled(**base, change_id=_str(data.get("changeId")), kind=str(data.get("kind") or ""),
                                      outcome=str(data.get("outcome") or "completed"), in_turn=turn is not None)
            case "session.ended":
                return SessionEnded(**base, outcome=str(data.get("outcome") or "completed"))
        return None

    def _remember(self, part: str, kind: str) -> None:
        if len(self._kinds) >= _PARTS_REMEMBERED:
            self._kinds.pop(next(iter(self._kinds)))
        self._kinds[part] = kind
