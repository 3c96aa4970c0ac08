"""A fake eve server following PROTOCOL.md (eve 0.80.1 as observed), with fault controls.

Messages understand the fake LLM's markers, so one scenario runs against this fake and the
real eve alike: ``[[tokens=N]]``, ``[[delay=S]]`` (before each step's output),
``[[chunkdelay=S]]`` (the reply word by word, S apart; a cancel cuts it off), ``[[fail=CODE]]``,
``[[reply=TEXT]]``, ``[[tool=noop]]``. Faults a test can set on :class:`FakeEve`:

- ``not_ready_sends``: the next N sends answer 409 ``session_not_ready``;
- ``cut_streams``: the next N stream responses are cut after ``cut_after`` lines (mid-line);
- ``garbage_every``: a malformed line is written before every Nth event of a stream;
- ``stuck``: sessions accept messages and never run them (eve restarted mid-turn, §9);
- ``server_errors``: the next N requests of any route answer 500;
- ``tamper``: fields laid over the next event of a type (an event a handler cannot take, F6);
- ``failing_texts``: a send whose text holds one of these answers 500 and is never taken (F6);
- ``compact_ack_delay`` / ``summary_delay`` / ``summary_fail`` / ``compact_errors``: compaction
  behaviour (§5);
- ``stream_lag``: a followed stream writes each batch that many seconds late (a page read is
  not late): eve has written an event the bridge's open stream has not brought yet.

Like real eve with an MCP connection (§11), ``[[mcp=TOOL {json}]]`` makes the "model" call a tool
of the MCP server at ``mcp_url``: a fresh ``tools/list`` with the session header, then
``tools/call`` with ``eve_session_id`` provided; a tool not listed is never called (the model
gets eve's "no tool named" error). Results land in ``mcp_results``. ``reply_for(text)`` may
script the reply to a message (the notebook rebuild's throwaway session). ``clientContext``
counts in the estimated input tokens, as on eve (§12).

It speaks eve 1.0.1 by default (stream version 27, PROTOCOL-27.md); ``FakeEve(stream_version=26)`` speaks
eve 0.80.1 (PROTOCOL.md), the wire Iva keeps for one deprecation window. ``IVA_FAKE_EVE_VERSION=26``
makes 26 the default, to run the whole suite on the old wire by hand.
The agent is the same; the session's v26 event log (``session.events``, v26-shaped in both modes) is
read through :class:`Projection` into v27 lines for ``/stream`` (``fake.lines(session_id)`` gives
them). The routes take v27 bodies (strict fields, ``answers``, ``idempotencyKey``, ``/end``) and
answer with ``deliveryId``s. Knobs: ``heartbeat_seconds``, ``lease_seconds``,
``stream_version_header`` (claim another version), ``strand(session_id)``; ``responses`` and
``refused()`` list every answer's status. Not like eve 1.0.1: no ``response.submitted``/``admitted``/
``settled`` facts around an answer, ``at`` has whole seconds, a steer's ``delivery.admitted`` comes
before the interrupted run's ``model.settled``, a summary's usage is an estimate, and the
``/info`` ``eveVersion`` sits at the top level (where 1.0.1 puts it is not recorded).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError

DEFAULT_VERSION = int(os.environ.get("IVA_FAKE_EVE_VERSION", "27"))

_MARKER = re.compile(r"\[\[(\w+)(?:=([^\]]*))?\]\]")
_MCP = re.compile(r"\[\[mcp=(\w+) (\{[^\]]*\})\]\]")
_CREATE_FIELDS = ("message", "clientContext", "outputSchema", "operationId", "callback", "protocolVersion",
                  "capabilities", "stubs", "forwardedPrincipal")
_SEND_FIELDS = ("inbox", "message", "answers", "clientContext", "outputSchema", "turnPolicy", "callback",
                "forwardedPrincipal", "idempotencyKey")
_HEARTBEAT = b'{"$eve":"heartbeat"}\n'


def _markers(text: str) -> tuple[str, dict[str, str]]:
    found = {m.group(1): (m.group(2) or "") for m in _MARKER.finditer(text)}
    return re.sub(r"\s+", " ", _MARKER.sub("", text)).strip(), found  # as fake_llm.strip_markers


def _flatten(message: Any) -> str:
    """Like eve's message.received data.message: text parts, then one line per file."""
    if isinstance(message, str):
        return message
    lines = [p.get("text", "") for p in message if p.get("type") == "text"]
    lines += [f"[file: {p.get('filename') or 'file'} ({p.get('mediaType')})]"
              for p in message if p.get("type") == "file"]
    return "\n".join(line for line in lines if line)


def _parts(message: Any) -> list[dict[str, Any]]:
    """Like eve's message.received data.parts: file metadata, never the bytes."""
    import base64

    if isinstance(message, str):
        return [{"text": message, "type": "text"}]
    out = []
    for p in message:
        if p.get("type") == "file":
            data = str(p.get("data", ""))
            size = len(base64.b64decode(data.split(",", 1)[1])) if "," in data else 0
            out.append({"mediaType": p.get("mediaType"), "type": "file", "filename": p.get("filename"), "size": size})
        else:
            out.append({"text": p.get("text", ""), "type": "text"})
    return out


# -- stream version 27 --------------------------------------------------------------------------

EVE_VERSION_26 = "0.80.1"
EVE_VERSION_27 = "1.0.1"
_PRINCIPAL = {"id": "fake-client", "type": "service"}
_COMPACTION_FAILED = {"code": "COMPACTION_FAILED",
                      "message": "Failed after 3 attempts. Last error: AI_APICallError: fake failure 500"}
_KINDS = {"tool-approval": "approval", "session-limit": "budget"}  # v26 input kind → v27 interaction kind
_OPTIONS = {"cancel": ("deny", "Deny"), "continue": ("approve", "Approve"), "stop": ("deny", "Stop")}


def _fact(type_: str, data: dict[str, Any], scope: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": type_, **({"scope": scope} if scope else {}), "data": data}


def _parts27(parts: Any) -> list[dict[str, Any]]:
    """v26 ``message.received`` parts as v27 ``delivery.consumed`` parts (no sandbox: files unavailable)."""
    out: list[dict[str, Any]] = []
    for p in parts if isinstance(parts, list) else []:
        if isinstance(p, dict) and p.get("type") == "file":
            out.append({"kind": "file", "mediaType": p.get("mediaType"), "filename": p.get("filename"),
                        "size": p.get("size", 0), "unavailable": True})
        elif isinstance(p, dict):
            out.append({"kind": "text", "text": p.get("text", "")})
    return out


class Projection:
    """A session's v26 event log read as v27 stream lines (PROTOCOL-27.md §3–§8, the table in §13).

    Incremental and deterministic: each v26 event (and each control note, see ``FakeSession.notes``)
    adds zero or more lines that depend only on what came before it, so the projection of a prefix
    of the log is a prefix of the projection and a line's position never changes. ``lines`` holds
    event lines ``{"at","facts"}`` and progress records ``{"progress"}``; both are numbered lines.
    ``ended`` is set once ``session.ended`` is written (the stream then sends ``stream.ended``).
    """

    def __init__(self, controls: dict[str, str]) -> None:
        self.controls = controls  # deliveryId → the control that made it ("cancel", "compact", "clear", "reset")
        self.lines: list[dict[str, Any]] = []
        self.ended = False
        self.seen = 0  # v26 events projected
        self.notes_seen = 0
        self._admitted: set[str] = set()
        self._runs = 0
        self._changes = 0
        self._run: str | None = None
        self._scope: dict[str, Any] = {}  # the open run's scope
        self._part: str | None = None  # the open text part (deltas written, not completed)
        self._part_text = ""
        self._parts_in_run = 0
        self._output = False  # the open run wrote a delta
        self._turn: str | None = None
        self._turn_opened: list[str] | None = None  # turn.started seen, its line waits for message.received
        self._last_turn: str | None = None
        self._consumed: list[str] = []
        self._settled: set[str] = set()
        self._reply: list[str] = []
        self._failed: dict[str, Any] | None = None
        self._cancel: str | None = None  # a cancel that will end the running turn (its deliveryId)
        self._change: dict[str, Any] | None = None  # the open compaction
        self._open: list[str] = []  # open interactions
        self._calls: set[str] = set()  # callIds with a call.requested

    def update(self, events: list[dict[str, Any]], notes: list[tuple[int, dict[str, Any]]]) -> None:
        while True:
            if self.notes_seen < len(notes) and notes[self.notes_seen][0] <= self.seen:
                self._note(notes[self.notes_seen][1])
                self.notes_seen += 1
            elif self.seen < len(events):
                self._event(events[self.seen])
                self.seen += 1
            else:
                return

    # -- writing ---------------------------------------------------------------------------------

    def _line(self, at: str, *facts: dict[str, Any]) -> None:
        if facts:
            self.lines.append({"at": at, "facts": list(facts)})

    def _admit(self, delivery: str) -> dict[str, Any]:
        self._admitted.add(delivery)
        control = self.controls.get(delivery)
        source = {"control": control} if control else {"channel": "channel:eve"}
        return _fact("delivery.admitted", {"deliveryId": delivery, "principal": _PRINCIPAL, "source": source})

    def _delivery_settled(self, delivery: str, outcome: str, **more: Any) -> dict[str, Any]:
        self._settled.add(delivery)
        return _fact("delivery.settled", {"deliveryId": delivery, "outcome": outcome, **more})

    def _open_run(self, at: str, scope: dict[str, Any], owner: dict[str, Any], model: str) -> None:
        self._run = f"run_{self._runs}"
        self._runs += 1
        self._scope = {"runId": self._run, **scope}
        self._part, self._part_text, self._parts_in_run, self._output = None, "", 0, False
        self._line(at, _fact("model.requested", {"owner": owner, "runId": self._run}, self._scope))
        self._line(at, _fact("model.started", {"attempt": 0, "modelId": model, "runId": self._run}, self._scope))

    def _settle_run(self, finish: str | None, usage: dict[str, Any] | None = None,
                    **outcome: Any) -> list[dict[str, Any]]:
        if self._run is None:
            return []
        data = {**({"finishReason": finish} if finish else {}), "outcome": "completed", **outcome, "runId": self._run}
        facts = [_fact("model.settled", data, self._scope)]
        if usage is not None:
            facts.append(_fact("usage.recorded", {"kind": "model", "owner": {"runId": self._run}, "usage": {
                "cacheReadTokens": usage.get("cacheReadTokens", 0),
                "cacheWriteTokens": usage.get("cacheWriteTokens", 0),
                "inputTokens": usage.get("inputTokens", 0), "outputTokens": usage.get("outputTokens", 0)}},
                self._scope))
        self._run = None
        return facts

    def _turn_scope(self) -> dict[str, Any]:
        return {"turnId": self._turn}

    # -- notes: what the routes did that no v26 event shows ----------------------------------------

    def _note(self, note: dict[str, Any]) -> None:
        if note["type"] == "cancel":
            if note["applies"] and self._cancel is None:
                self._cancel = note["deliveryId"]
            else:
                self._line(note["at"], self._admit(note["deliveryId"]),
                           self._delivery_settled(note["deliveryId"], "ignored"))

    # -- events ----------------------------------------------------------------------------------

    def _event(self, event: dict[str, Any]) -> None:
        type_, data = event.get("type"), event.get("data") or {}
        meta = event.get("meta") or {}
        at = str(meta.get("at", ""))
        deliveries = [d for d in meta.get("deliveryIds") or [] if isinstance(d, str)]
        admits = [self._admit(d) for d in deliveries if d not in self._admitted]
        if type_ not in ("session.started", "context.cleared", "session.completed"):
            self._line(at, *admits)  # a delivery's admission is its own line, except where it rides along
            admits = []
        handler = getattr(self, "_on_" + str(type_).replace(".", "_"), None)
        if handler is not None:
            handler(at, data, deliveries, admits)

    def _on_session_started(self, at: str, data: dict[str, Any], deliveries: list[str],
                            admits: list[dict[str, Any]]) -> None:
        runtime = {**(data.get("runtime") or {})}
        runtime.setdefault("eveVersion", EVE_VERSION_27)
        self._line(at, _fact("session.started", {"runtime": runtime}), *admits)

    def _on_turn_started(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        self._turn = str(data.get("turnId"))
        self._turn_opened = deliveries
        self._consumed, self._reply, self._failed = [], [], None

    def _on_message_received(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        delivery = deliveries[-1] if deliveries else ""
        consumed = _fact("delivery.consumed", {"deliveryId": delivery, "parts": _parts27(data.get("parts")),
                                               "turnId": self._turn}, self._turn_scope())
        self._consumed.append(delivery)
        if self._turn_opened is not None:
            cause = self._turn_opened[0] if self._turn_opened else delivery
            started = _fact("turn.started", {"cause": {"deliveryId": cause}, "follows": self._last_turn,
                                             "turnId": self._turn}, self._turn_scope())
            self._turn_opened = None
            self._line(at, started, consumed)
        else:
            self._line(at, consumed)

    def _on_step_started(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        self._open_run(at, self._turn_scope(), {"turnId": self._turn}, str(data.get("modelId", "fake/fake-model")))

    def _on_message_appended(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        delta = data.get("messageDelta", "")
        self._output = True
        if self._part is None:
            self._part = f"{self._run}.{self._parts_in_run}"
            self._parts_in_run += 1
            self._part_text = ""
            progress = _fact("content.delta", {"delta": delta, "kind": "text", "partId": self._part}, self._scope)
        else:
            progress = _fact("content.delta", {"delta": delta, "partId": self._part})
        self._part_text += str(delta)
        self.lines.append({"progress": progress})

    def _on_message_completed(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        if self._part is None:
            self._part = f"{self._run}.{self._parts_in_run}"
            self._parts_in_run += 1
        self._line(at, _fact("content.completed", {"kind": "text", "partId": self._part, "phase": "reply",
                                                   "runId": self._run, "value": data.get("message", "")}, self._scope))
        self._reply.append(self._part)
        self._part = None

    def _on_step_completed(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        usage = data.get("usage")
        self._line(at, *self._settle_run(str(data.get("finishReason", "stop")),
                                         usage if isinstance(usage, dict) else None))

    def _on_step_failed(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        self._failed = {"code": data.get("code", "MODEL_CALL_FAILED"), "id": f"err_{self._run}",
                        "message": "Failed after 3 attempts. Last error: AI_APICallError: fake failure 500"}

    def _on_action_input_appended(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        self.lines.append({"progress": _fact("call.input", {
            "callId": data.get("callId"), "delta": data.get("inputTextDelta", ""), "kind": "tool",
            "name": data.get("toolName")}, self._scope)})

    def _on_actions_requested(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        presentation = data.get("presentation") or {}
        for action in data.get("actions") or []:
            capability = {"kind": "tool", "name": action.get("toolName")}
            self._calls.add(str(action.get("callId")))
            label = (presentation.get(action.get("callId")) or {}).get("label")
            if label:
                capability["label"] = label
            self._line(at, _fact("call.requested", {"callId": action.get("callId"), "capability": capability,
                                                    "input": action.get("input", {}), "owner": {"runId": self._run}},
                                 self._scope))

    def _on_action_result(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        result = data.get("result") or {}
        call = result.get("callId")
        self._line(at, _fact("call.started", {"callId": call}, self._scope))
        settled: dict[str, Any] = {"callId": call, "outcome": "completed", "output": result.get("output")}
        if data.get("status") == "failed":
            settled["outcome"] = "failed"
            settled["error"] = data.get("error") or {"code": "ACTION_RESULT_FAILED",
                                                     "message": str(result.get("output"))}
        self._line(at, _fact("call.settled", settled, self._scope))

    def _on_input_requested(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        self._line(at, *self._settle_run("tool-calls"))  # the model asked by calling a tool
        for req in data.get("requests") or []:
            kind = _KINDS.get(str(req.get("kind")), str(req.get("kind")))
            options = []
            for option in req.get("options") or []:
                mapped = _OPTIONS.get(option.get("id")) if kind != "question" else None  # a question keeps its own
                id_, label = mapped or (option.get("id"), option.get("label"))
                options.append({"id": id_, "label": label})
            action = req.get("action") or {}
            if kind == "question" and action.get("callId") in self._calls:
                # a workflow tool
                self._line(at, _fact("call.started", {"callId": action["callId"]}, self._turn_scope()))
            subject = ({"turnId": self._turn} if kind == "budget" or not action.get("callId")
                       else {"callId": action["callId"]})
            interaction = str(req.get("requestId"))
            self._open.append(interaction)
            self._line(at, _fact("interaction.opened", {"interactionId": interaction, "request": {
                "allowFreeform": bool(req.get("allowFreeform", kind == "question")),
                "display": "select" if kind == "question" else "confirmation", "kind": kind,
                "options": options, "prompt": req.get("prompt", ""),
                **({"signIn": req["signIn"]} if "signIn" in req else {})}, "subject": subject}, self._turn_scope()))

    def _on_turn_waiting(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        waiting = [self._delivery_settled(d, "awaiting-input", turnId=self._turn)
                   for d in self._consumed if d not in self._settled]
        self._line(at, _fact("turn.paused", {"awaiting": [{"interactionId": i} for i in self._open],
                                             "turnId": self._turn}), *waiting)

    def _on_input_resolved(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        for resolution in data.get("resolutions") or []:
            interaction = str(resolution.get("requestId"))
            if interaction in self._open:
                self._open.remove(interaction)
            self._line(at, _fact("interaction.settled", {"interactionId": interaction, "outcome": "accepted",
                                                         "response": resolution.get("response") or {}},
                                 self._turn_scope()))
        fresh = [d for d in deliveries if d not in self._consumed]
        for delivery in fresh:  # an answer, not a message: consumed with no parts
            self._consumed.append(delivery)
            self._line(at, _fact("delivery.consumed", {"deliveryId": delivery, "parts": [], "turnId": self._turn},
                                 self._turn_scope()))

    def _end_turn(self, at: str, outcome: str, facts: list[dict[str, Any]], **more: Any) -> None:
        settled = _fact("turn.settled", {**more, "outcome": outcome, "reply": list(self._reply), "turnId": self._turn},
                        self._turn_scope())
        handled = [self._delivery_settled(d, "handled", turnId=self._turn)
                   for d in self._consumed if d not in self._settled]
        cancel, self._cancel = self._cancel, None
        if outcome == "cancelled" and cancel is not None:
            self._line(at, self._admit(cancel), *facts, settled, *handled, self._delivery_settled(cancel, "applied"))
        else:
            self._line(at, *facts, settled, *handled)
            if cancel is not None:  # the turn ended before the cancel could
                self._line(at, self._admit(cancel), self._delivery_settled(cancel, "ignored"))
        self._last_turn, self._turn = self._turn, None
        self._open, self._part, self._run = [], None, None

    def _on_turn_completed(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        self._end_turn(at, "completed", self._settle_run("stop"))

    def _on_turn_failed(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        details = data.get("details") or {}
        error = self._failed or {"code": data.get("code", "MODEL_CALL_FAILED"), "id": f"err_{self._turn}",
                                 "message": str(details.get("message", ""))}
        self._end_turn(at, "failed", self._settle_run(None, outcome="failed", error=error), error=error)

    def _on_turn_cancelled(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        facts: list[dict[str, Any]] = []
        if self._part is not None:  # a cut-off reply: its partial text is narration
            self._line(at, _fact("content.completed", {
                "interrupted": True, "kind": "text", "partId": self._part, "phase": "narration",
                "runId": self._run, "value": self._part_text}, self._scope))
            self._part = None
        if self._run is not None and self._output:
            facts += self._settle_run(None, outcome="interrupted")
        elif self._run is not None:
            self._line(at, *self._settle_run("other"))
        facts += [_fact("interaction.settled", {"interactionId": i, "outcome": "interrupted", "reason": "Cancelled."},
                        self._turn_scope()) for i in self._open]
        cause = {"cause": {"deliveryId": self._cancel}} if self._cancel is not None else {}
        self._end_turn(at, "cancelled", facts, **cause)

    def _on_compaction_requested(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        change = f"change_{self._changes}"
        self._changes += 1
        delivery = deliveries[0] if deliveries else None
        started: dict[str, Any] = {"changeId": change, "kind": "compaction"}
        scope: dict[str, Any] = {"changeId": change}
        if delivery is not None:
            started["cause"] = {"deliveryId": delivery}
        elif self._turn is not None:  # automatic, inside a turn
            started["trigger"] = {"inputTokens": math.ceil(float(data.get("usageInputTokens") or 0))}
            started["turnId"] = data.get("turnId")
            scope["turnId"] = data.get("turnId")
        self._line(at, _fact("context.started", started, scope))
        turn_run = (self._run, self._scope)
        self._open_run(at, scope, {"changeId": change}, str(data.get("modelId", "fake/fake-model")))
        self._change = {"changeId": change, "delivery": delivery, "scope": scope, "turn_run": turn_run,
                        "tokens": math.ceil(float(data.get("usageInputTokens") or 0))}

    def _close_change(self, at: str, facts: list[dict[str, Any]], outcome: str, **more: Any) -> None:
        change = self._change
        assert change is not None
        self._change = None
        self._line(at, *facts, _fact("context.settled", {"changeId": change["changeId"], "kind": "compaction",
                                                         "outcome": outcome, **more}, change["scope"]))
        self._run, self._scope = change["turn_run"]
        if change["delivery"] is not None:
            reason = {} if outcome == "completed" else {"reason": "compaction-failed"}
            self._line(at, self._delivery_settled(change["delivery"], "applied" if outcome == "completed" else "failed",
                                                  **reason))

    def _on_compaction_completed(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        if self._change is not None:
            usage = {"inputTokens": self._change["tokens"], "outputTokens": 11}
            self._close_change(at, self._settle_run("stop", usage), "completed")

    def _on_session_waiting(self, at: str, data: dict[str, Any], deliveries: list[str], admits: Any) -> None:
        if self._change is not None:  # a compaction that never completed
            self._close_change(at, self._settle_run(None, outcome="failed", error=_COMPACTION_FAILED), "failed",
                               error=_COMPACTION_FAILED)

    def _on_context_cleared(self, at: str, data: dict[str, Any], deliveries: list[str],
                            admits: list[dict[str, Any]]) -> None:
        change = f"change_{self._changes}"
        self._changes += 1
        cause = {"cause": {"deliveryId": deliveries[0]}} if deliveries else {}
        applied = [self._delivery_settled(deliveries[0], "applied")] if deliveries else []
        self._line(at, *admits,
                   _fact("context.started", {"changeId": change, **cause, "kind": "clear"}, {"changeId": change}),
                   _fact("context.settled", {"changeId": change, "kind": "clear", "outcome": "completed",
                                             "selects": None}, {"changeId": change}),
                   *applied)
        self._last_turn = None

    def _on_session_completed(self, at: str, data: dict[str, Any], deliveries: list[str],
                              admits: list[dict[str, Any]]) -> None:
        end = deliveries[0] if deliveries else None
        applied = [self._delivery_settled(end, "applied")] if end else []
        cause = {"cause": {"deliveryId": end}} if end else {}
        self._line(at, *admits, *applied, _fact("session.ended", {**cause, "outcome": "completed"}))
        self.ended = True


@dataclass
class _Input:
    kind: str  # message | compact | clear
    text: str = ""
    delivery: str = ""
    policy: str = "steer"
    context_chars: int = 0


@dataclass
class FakeSession:
    id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    inputs: asyncio.Queue[_Input] = field(default_factory=asyncio.Queue)
    active: bool = True
    sequence: int = 0
    running: bool = False
    output_started: bool = False
    steer: asyncio.Queue[_Input] = field(default_factory=asyncio.Queue)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    usage_in: int = 0
    usage_out: int = 0
    history_chars: int = 0
    started: bool = False
    task: asyncio.Task[None] | None = None
    turns_run: int = 0
    compactions_done: int = 0
    parts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    compacting: bool = False  # between compaction.requested and the compaction's end
    asking: bool = False  # a question is open (input.requested … turn.waiting on input)
    answers: asyncio.Queue[tuple[str, Any, str]] = field(default_factory=asyncio.Queue)
    sends: list[dict[str, Any]] = field(default_factory=list)
    # v27 mode: what the routes did that no v26 event shows, as (number of events before it, note)
    notes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    controls: dict[str, str] = field(default_factory=dict)  # deliveryId → control route (v27 mode)
    keys: OrderedDict[str, str] = field(default_factory=OrderedDict)  # idempotencyKey → deliveryId (v27)
    view: Projection | None = None  # the v27 stream lines, built from events on demand
    stranded: bool = False  # v27 mode: made by an older eve (PROTOCOL-27.md §11)


class FakeEve:
    def __init__(self, *, token: str = "eve-test-token", window: int = 128_000,
                 stream_version: int = DEFAULT_VERSION) -> None:
        self.token = token
        self.window = window
        self.stream_version = stream_version  # 26: eve 0.80.1 (PROTOCOL.md); 27: eve 1.0.1 (PROTOCOL-27.md)
        self.stream_version_header: str | None = None  # the x-eve-stream-version sent, if not stream_version
        self.heartbeat_seconds = 10.0  # v27: a heartbeat while a followed stream is quiet
        self.lease_seconds = 120.0  # v27: a followed stream ends with stream.lease-ended after this
        self.responses: list[tuple[str, str, int]] = []  # (method, path, status) of every answered request
        self.sessions: dict[str, FakeSession] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.dynamic_model = False  # /info as for eve 1.x's defineDynamic model (D1): no id, no window
        self.headers: list[tuple[str, str, dict[str, str]]] = []  # (method, path, its x-iva-* headers), every request
        self.not_ready_sends = 0
        self.cut_streams = 0
        self.cut_after = 3
        self.garbage_every = 0
        self.stuck = False
        self.server_errors = 0
        self.compact_ack_delay = 0.0
        self.compact_errors = 0  # the next N compact requests answer 500
        self.ambiguous_sends = 0  # the next N sends are taken and run, but answered 502
        self.failing_texts: set[str] = set()  # a send whose text holds one of these: 500, never taken (F6)
        self.failed_sends = 0
        self.cancel_errors = 0  # the next N cancels answer 500 (and cancel nothing)
        self.cancel_ignored_while_asking = False  # an eve whose cancel cannot end a turn waiting on input
        self.waiting_after_compaction = 0.0  # seconds between compaction.completed and session.waiting
        self.tamper: dict[str, dict[str, Any]] = {}  # event type → fields laid over its next emission (F6)
        self.unhealthy = False  # /eve/v1/health answers 503 (eve down behind a proxy)
        self.eve_version: str | None = None  # what /info names (None: 1.0.1 on stream 27, 0.80.1 on 26)
        self.summary_delay = 0.0
        self.summary_fail = False
        self.step_delay = 0.0
        self.ask_as_action = False  # review: a question shows as the model's tool call first
        self.send_at: dict[str, float] = {}  # message text → monotonic time its send arrived (benchmarks)
        self.completed_at: dict[str, float] = {}  # reply text → monotonic time message.completed was emitted
        self.first_delta_at: dict[str, float] = {}  # reply text → monotonic time its first message.appended was emitted
        self.hold_sends = False  # sends wait for release_sends; a caller gone by then is dropped
        self.release_sends = asyncio.Event()
        self.held = 0
        self.sends_while_running = 0  # queue-policy sends that reached a running turn
        self.sends_while_compacting = 0  # sends that reached a session while it compacted (seed 004 rejects it)
        self.stream_lag = 0.0
        self.mcp_url: str | None = None
        self.mcp_token: str | None = None  # sent as "authorization: Bearer" (NOTEBOOK_MCP_TOKEN); daemons get it
        self.mcp_connection = "notebook"
        self.mcp_results: list[dict[str, Any]] = []
        self.reply_for: Any = None  # text -> reply text or None
        self.creates: list[tuple[float, str]] = []  # (monotonic time, message) of sessions created with one
        self._in_flight = 0  # requests being answered, streams aside (they stay open by design)
        self._held: list[web.Request] = []  # sends waiting on release_sends
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(middlewares=[self._track])
        r = app.router
        r.add_get("/eve/v1/health", self._health)
        r.add_get("/eve/v1/info", self._info)
        r.add_post("/eve/v1/session", self._create)
        r.add_post("/eve/v1/session/{id}", self._send)
        r.add_get("/eve/v1/session/{id}/stream", self._stream)
        for action in ("cancel", "compact", "clear", "reset", "end"):
            r.add_post(f"/eve/v1/session/{{id}}/{action}", getattr(self, f"_{action}"))
        # What is still being answered when a test ends is a stream or a held send: nothing to wait for, so
        # the stop cancels it at once (aiohttp waits shutdown_timeout for a handler first; 0 is "forever").
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.01)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for session in self.sessions.values():
            if session.task:
                session.task.cancel()
        if self.runner is not None:
            await self.runner.cleanup()

    # -- helpers for tests ------------------------------------------------------------------

    def quiet(self) -> bool:
        """Nothing in flight: no request being answered (streams aside), no session running a turn
        or a compaction, no input queued for one."""
        return self._in_flight == 0 and all(
            not s.running and s.inputs.empty() and s.steer.empty() for s in self.sessions.values()
        )

    def held_callers_gone(self) -> int:
        """How many held sends (``hold_sends``) lost their caller: eve will drop them on release."""
        return sum(1 for r in self._held if r.transport is None or r.transport.is_closing())

    def sends(self) -> list[dict[str, Any]]:
        return [b for m, p, b in self.requests if m == "POST" and p.count("/") == 4 and b is not None]

    def told(self, route: str = "send") -> list[dict[str, str]]:
        """The x-iva-* headers (D2) of every request to ``route``: ``create`` (a new session),
        ``send`` (a message or answers to a session), or an action's name."""
        def of(method: str, path: str) -> str:
            parts = path.strip("/").split("/")  # eve v1 session [id [action]]
            return "create" if len(parts) == 3 else "send" if len(parts) == 4 else parts[-1]
        return [h for m, p, h in self.headers if m == "POST" and p.startswith("/eve/v1/session") and of(m, p) == route]

    def routes(self, name: str) -> list[str]:
        return [p for m, p, _ in self.requests if p.endswith("/" + name)]

    # -- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # D2: what Iva told the agent's channel with this request (its x-iva-* headers)
        self.headers.append((request.method, request.path, {k.lower(): v for k, v in request.headers.items()
                                                             if k.lower().startswith("x-iva-")}))
        response: web.StreamResponse
        if request.path.endswith("/stream"):
            response = await handler(request)
        else:
            self._in_flight += 1
            try:
                response = await handler(request)
            finally:
                self._in_flight -= 1
        self.responses.append((request.method, request.path, response.status))
        return response

    def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return web.json_response(
                {"code": "unauthorized", "error": "Authorization is required for this route.", "ok": False},
                status=401, headers={"www-authenticate": "Bearer"},
            )
        if self.server_errors > 0:
            self.server_errors -= 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        return None

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        body = json.loads(raw) if raw.strip() else None
        self.requests.append((request.method, request.path, body))
        return body

    def _session(self, request: web.Request) -> FakeSession | None:
        return self.sessions.get(request.match_info["id"])

    async def _tool_step(self, s: FakeSession, call: str, tool: str, step: int, tokens: int,
                         turn: dict[str, Any], deliveries: list[str]) -> None:
        """One model call that ends in a tool call: the call requested, its result, the step's usage."""
        await self._emit(s, "actions.requested", {"actions": [{"callId": call, "input": {}, "kind": "tool-call",
                                                               "toolName": tool}], "stepIndex": step, **turn},
                         deliveries)
        await self._emit(s, "action.result", {"result": {"callId": call, "kind": "tool-result", "output": {"ok": True},
                                                         "toolName": tool}, "status": "completed", "stepIndex": step,
                                              **turn}, deliveries)
        await self._emit(s, "step.completed", {"finishReason": "tool-calls", "stepIndex": step, **turn,
                                               "usage": {"inputTokens": tokens, "outputTokens": 5,
                                                         "cacheReadTokens": 0}},
                         deliveries)
        s.usage_in += tokens

    async def _emit(self, session: FakeSession, type_: str, data: dict[str, Any], deliveries: list[str]) -> None:
        if type_ in self.tamper:
            data = {**data, **self.tamper.pop(type_)}
        event = {"type": type_, "data": data,
                 "meta": {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ"), "id": f"evt_{next(self._ids):08d}",
                          "deliveryIds": list(deliveries)}}
        if type_ == "message.completed":
            self.completed_at.setdefault(data.get("message", ""), time.monotonic())
        async with self._changed:
            session.events.append(event)
            self._changed.notify_all()

    # -- routes -----------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        if self.unhealthy:
            return web.json_response({"ok": False, "status": "unavailable"}, status=503)
        return web.json_response({"ok": True, "status": "ready", "workflowId": "workflow//eve//workflowEntry"})

    async def _info(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        connections = [{"connectionName": self.mcp_connection, "protocol": "mcp", "url": self.mcp_url,
                        "hasHeaders": False}] if self.mcp_url else []
        eve_version = self.eve_version or (EVE_VERSION_27 if self.stream_version >= 27 else EVE_VERSION_26)
        model = {"routing": {"kind": "dynamic"}} if self.dynamic_model else \
            {"id": "fake/fake-model", "contextWindowTokens": self.window}
        return web.json_response({"agent": {"model": model},
                                  "connections": connections, "eveVersion": eve_version, "version": 5})

    async def _create(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if self.stream_version >= 27:
            return await self._create27(request)
        body = await self._body(request)
        session = FakeSession(id=f"wrun_{uuid.uuid4().hex[:20].upper()}")
        self.sessions[session.id] = session
        session.task = asyncio.create_task(self._run(session))
        if body and "message" in body:
            self.creates.append((time.monotonic(), _flatten(body["message"])))
            delivery = str(uuid.uuid4())
            session.inputs.put_nowait(_Input("message", body["message"], delivery))
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202,
                                 headers={"x-eve-session-id": session.id})

    async def _send(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if self.stream_version >= 27:
            return await self._send27(request)
        arrived = time.monotonic()
        body = await self._body(request) or {}
        if isinstance(body.get("message"), str):
            self.send_at.setdefault(body["message"], arrived)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"code": "session_not_active", "error": "The session is no longer active.",
                                      "ok": False}, status=409)
        if self.not_ready_sends > 0:
            self.not_ready_sends -= 1
            return web.json_response({"code": "session_not_ready",
                                      "error": "The session is not ready to accept messages yet.", "ok": False},
                                     status=409)
        if any(bad in _flatten(body.get("message", "")) for bad in self.failing_texts):
            self.failed_sends += 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        if "inputResponses" in body and "message" not in body:
            delivery = str(uuid.uuid4())
            session.answers.put_nowait(("response", body["inputResponses"], delivery))
            return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted",
                                      "deliveryId": delivery}, status=202)
        if session.asking and not self.stuck:
            delivery = str(uuid.uuid4())
            session.answers.put_nowait(("message", body.get("message", ""), delivery))
            return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted",
                                      "deliveryId": delivery}, status=202)
        policy = body.get("turnPolicy", "steer")
        if policy not in ("queue", "steer"):
            return web.json_response({"error": "Expected 'turnPolicy' to be either 'queue' or 'steer'.", "ok": False},
                                     status=400)
        delivery = str(uuid.uuid4())
        item = _Input("message", _flatten(body.get("message", "")), delivery, policy)
        context = body.get("clientContext")
        item.context_chars = sum(len(c) + 16 for c in ([context] if isinstance(context, str) else context or []))
        session.parts[delivery] = _parts(body.get("message", ""))
        refused = await self._take(request, session, body, item)
        if refused is not None:
            return refused
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted",
                                  "deliveryId": delivery}, status=202)

    async def _take(self, request: web.Request, session: FakeSession, body: dict[str, Any],
                    item: _Input) -> web.Response | None:
        """Run a sent message (held, steered into the running turn or queued); a response when it is
        not an ordinary 202."""
        policy = item.policy
        if self.hold_sends:
            self.held += 1
            self._held.append(request)
            try:
                await self.release_sends.wait()
            finally:
                self._held.remove(request)
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # the caller died waiting: eve never took it
        session.sends.append(body)
        if session.running and policy == "queue":
            self.sends_while_running += 1
        if session.compacting:
            self.sends_while_compacting += 1
        if self.stuck:
            pass  # accepted, never run (PROTOCOL.md §9)
        elif session.running and policy == "steer" and not session.output_started:
            session.steer.put_nowait(item)
        else:
            session.inputs.put_nowait(item)
        if self.ambiguous_sends:
            # Accepted and running, but the answer is lost to a proxy's 502 (an ambiguous send).
            self.ambiguous_sends -= 1
            return web.Response(status=502, text="Bad Gateway")
        return None

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        session = self._session(request)
        if session is None:
            return web.json_response({"error": "Session not found.", "ok": False}, status=404)
        if not session.active:
            # Observed on eve 0.80.1: a stream opened after the reset answers 410 (a stream that
            # was open during the reset got session.completed and closed).
            return web.json_response({"code": "session_expired", "error": "Session history is no longer available.",
                                      "ok": False}, status=410)
        if self.stream_version >= 27:
            return await self._stream27(request, session)
        start = int(request.query.get("startIndex", "0"))
        follow = request.query.get("follow") != "false"
        if start < 0:
            start = max(0, len(session.events) + start)
        headers = {"content-type": "application/x-ndjson; charset=utf-8", "x-eve-stream-format": "ndjson",
                   "x-eve-stream-version": self.stream_version_header or str(self.stream_version),
                   "x-eve-session-id": session.id}
        if not follow or request.query.get("includeTailIndex") == "1":
            headers["x-eve-stream-tail-index"] = str(len(session.events) - 1)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        try:
            return await self._write_stream(request, response, session, start, follow)
        except (ConnectionResetError, ClientConnectionResetError):
            return response  # the reader went away (a consumer ends its busy period)

    async def _write_stream(self, request: web.Request, response: web.StreamResponse, session: FakeSession,
                            start: int, follow: bool) -> web.StreamResponse:
        cut = None
        if self.cut_streams > 0:
            self.cut_streams -= 1
            cut = self.cut_after
        index, written = start, 0
        tail_at_open = len(session.events)
        while True:
            async with self._changed:
                while index >= len(session.events):
                    if not follow and index >= tail_at_open:
                        break
                    if not session.active and index >= len(session.events):
                        break
                    await self._changed.wait()
                batch = session.events[index:] if follow else session.events[index:tail_at_open]
            if not batch:
                break
            if follow and self.stream_lag:
                await asyncio.sleep(self.stream_lag)
            for event in batch:
                line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
                if cut is not None and written >= cut:
                    await response.write(line[: len(line) // 2])
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if self.garbage_every and (index + 1) % self.garbage_every == 0:
                    await response.write(b"{this is not json\n")
                await response.write(line)
                written += 1
                index += 1
                if event["type"] == "session.completed":
                    await response.write_eof()
                    return response
            if not follow and index >= tail_at_open:
                break
        await response.write_eof()
        return response

    async def _cancel(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if self.stream_version >= 27:
            return await self._cancel27(request)
        await self._body(request)
        session = self._session(request)
        if self.cancel_errors:
            self.cancel_errors -= 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_turn"})
        session.cancel.set()
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202)

    async def _compact(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if self.stream_version >= 27:
            return await self._compact27(request)
        await self._body(request)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_session"})
        if self.compact_errors:
            self.compact_errors -= 1
            return web.json_response({"ok": False, "code": "internal_error", "message": "boom"}, status=500)
        if self.compact_ack_delay:
            await asyncio.sleep(self.compact_ack_delay)
        if not self.stuck:
            session.inputs.put_nowait(_Input("compact"))
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202)

    async def _clear(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        if self.stream_version >= 27:
            return await self._clear27(request)
        await self._body(request)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_session"})
        session.inputs.put_nowait(_Input("clear"))
        return web.json_response({"ok": True, "sessionId": session.id, "status": "accepted"}, status=202)

    async def _reset(self, request: web.Request) -> web.Response:
        if self.stream_version >= 27:
            return await self._end(request)  # 1.0.1 still has /reset, answering as /end does
        if (denied := self._auth(request)) is not None:
            return denied
        await self._body(request)
        session = self._session(request)
        if session is None or not session.active:
            return web.json_response({"ok": True, "status": "no_active_session"})
        if self.stuck:
            await asyncio.sleep(30)
            return web.json_response({"error": "Failed to reset the session.", "ok": False}, status=500)
        await self._finish(session, [])
        return web.json_response({"ok": True, "previousSessionId": session.id, "status": "reset"})

    async def _finish(self, session: FakeSession, deliveries: list[str]) -> None:
        """End a session: its running turn cancelled, then session.completed."""
        if session.running:
            session.cancel.set()
            for _ in range(200):
                if not session.running:
                    break
                await asyncio.sleep(0.01)
        session.active = False
        if session.task:
            session.task.cancel()
        await self._emit(session, "session.completed", {"usage": self._usage(session)}, deliveries)

    # -- stream version 27 (PROTOCOL-27.md) ---------------------------------------------------

    def strand(self, session_id: str) -> None:
        """Make a session look as if an older eve made it (PROTOCOL-27.md §11): sends and /clear
        answer 409 ``session_stranded``, /compact and /cancel 409 ``session_not_active``; /end works."""
        self.sessions[session_id].stranded = True

    def refused(self) -> list[tuple[str, str, int]]:
        """The requests answered 4xx, as ``(method, path, status)``."""
        return [r for r in self.responses if 400 <= r[2] < 500]

    def lines(self, session_id: str) -> list[dict[str, Any]]:
        """The session's v27 stream lines so far (the projection of its v26 event log)."""
        session = self.sessions[session_id]
        return list(self._view(session).lines)

    def _view(self, session: FakeSession) -> Projection:
        if session.view is None:
            session.view = Projection(session.controls)
        session.view.update(session.events, session.notes)
        return session.view

    def _note(self, session: FakeSession, note: dict[str, Any]) -> None:
        """Something a route did that no v26 event shows, placed after the events so far."""
        session.notes.append((len(session.events), {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ"), **note}))

    @staticmethod
    def _refuse(error: str, status: int = 400, **more: Any) -> web.Response:
        return web.json_response({**more, "error": error, "ok": False}, status=status)

    @staticmethod
    def _not_active() -> web.Response:
        return web.json_response({"code": "session_not_active", "error": "The session is no longer active.",
                                  "ok": False}, status=409)

    @staticmethod
    def _stranded() -> web.Response:
        return web.json_response({"code": "session_stranded", "error": "This session is no longer available.",
                                  "ok": False, "eveVersion": EVE_VERSION_26}, status=409)

    async def _body27(self, request: web.Request,
                      accepted: tuple[str, ...]) -> tuple[dict[str, Any], web.Response | None]:
        """The JSON object body (``{}`` when empty), or the 400 eve 1.0.1 gives: bad JSON, unknown fields."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            self.requests.append((request.method, request.path, raw.decode(errors="replace")))
            return {}, self._refuse("Invalid JSON body.")
        self.requests.append((request.method, request.path, body if raw.strip() else None))
        if not isinstance(body, dict):
            return {}, self._refuse("Invalid JSON body.")
        for key in body:
            if key not in accepted:
                fields = ", ".join(accepted) or "(none)"
                return body, self._refuse(f"Unknown field '{key}'. Accepted fields: {fields}.")
        return body, None

    @staticmethod
    def _context_error(body: dict[str, Any]) -> web.Response | None:
        context = body.get("clientContext")
        if context is None or isinstance(context, (str, dict)):
            return None
        if isinstance(context, list):
            if all(isinstance(c, str) and c for c in context):
                return None
            return FakeEve._refuse("Expected 'clientContext' array entries to be non-empty strings.")
        return FakeEve._refuse("Expected 'clientContext' to be a string, string array, or JSON object.")

    def _message_input(self, session: FakeSession, message: Any, delivery: str, policy: str,
                       context: Any) -> _Input:
        item = _Input("message", _flatten(message), delivery, policy)
        item.context_chars = sum(len(c) + 16 for c in ([context] if isinstance(context, str) else
                                                       [json.dumps(context)] if isinstance(context, dict) else
                                                       context or []))
        session.parts[delivery] = _parts(message)
        return item

    async def _create27(self, request: web.Request) -> web.Response:
        body, refused = await self._body27(request, _CREATE_FIELDS)
        if refused is not None:
            return refused
        message = body.get("message")
        if message is None and any(k in body for k in ("clientContext", "callback", "outputSchema")):
            return self._refuse("Creating a session without a message does not accept 'clientContext', "
                                "'callback', or 'outputSchema'.")
        if (refused := self._context_error(body)) is not None:
            return refused
        session = FakeSession(id=f"wrun_{uuid.uuid4().hex[:20].upper()}")
        self.sessions[session.id] = session
        session.task = asyncio.create_task(self._run(session))
        delivery = str(uuid.uuid4())
        if message is not None:
            self.creates.append((time.monotonic(), _flatten(message)))
            session.inputs.put_nowait(self._message_input(session, message, delivery, "steer",
                                                          body.get("clientContext")))
        return web.json_response({"ok": True, "sessionId": session.id, "deliveryId": delivery}, status=202,
                                 headers={"x-eve-session-id": session.id})

    async def _send27(self, request: web.Request) -> web.Response:
        arrived = time.monotonic()
        body, refused = await self._body27(request, _SEND_FIELDS)
        if refused is not None:
            return refused
        if isinstance(body.get("message"), str):
            self.send_at.setdefault(body["message"], arrived)
        session = self._session(request)
        if session is None or not session.active:
            return self._not_active()
        if session.stranded:
            return self._stranded()
        if not body:
            return web.json_response({"ok": True, "status": "unsupported"})  # "prepare" on the local world
        message, answers = body.get("message"), body.get("answers")
        if message is not None and answers is not None:
            return self._refuse("'message' and 'answers' are mutually exclusive.")
        if not message and not answers:
            return self._refuse("Expected a non-empty 'message' or a non-empty 'answers' array.")
        if answers is not None and not (isinstance(answers, list) and all(
                isinstance(a, dict) and isinstance(a.get("interactionId"), str) for a in answers)):
            return self._refuse("Expected 'answers' to be an array of {interactionId, optionId | text}.")
        policy = body.get("turnPolicy", "steer")
        if policy not in ("queue", "steer"):
            return self._refuse("Expected 'turnPolicy' to be either 'queue' or 'steer'.")
        key = body.get("idempotencyKey")
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= 256):
            return self._refuse("Expected 'idempotencyKey' to be a nonempty string of at most 256 characters.")
        if (refused := self._context_error(body)) is not None:
            return refused
        if key is not None and key in session.keys:
            return web.json_response({"ok": True, "sessionId": session.id, "deliveryId": session.keys[key]},
                                     status=202, headers={"x-eve-session-id": session.id})
        if self.not_ready_sends > 0:
            self.not_ready_sends -= 1
            return self._refuse("The session is not ready to accept messages yet.", 409, code="session_not_ready")
        if message is not None and any(bad in _flatten(message) for bad in self.failing_texts):
            self.failed_sends += 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        delivery = str(uuid.uuid4())
        if key is not None:  # derived from the key, as eve's looks (PROTOCOL-27.md §2)
            delivery = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{session.id}/{key}"))

        def remember() -> None:  # only a send eve took: one whose caller died before is not one
            if key is not None:
                session.keys[key] = delivery
                while len(session.keys) > 1024:
                    session.keys.popitem(last=False)

        accepted = web.json_response({"ok": True, "sessionId": session.id, "deliveryId": delivery}, status=202,
                                     headers={"x-eve-session-id": session.id})
        if answers is not None:
            remember()
            if session.asking:
                session.answers.put_nowait(("response", [{"requestId": a["interactionId"],
                                                          **{k: v for k, v in a.items() if k != "interactionId"}}
                                                         for a in answers], delivery))
            else:  # a stale answer: eve hands it to the model as new input
                item = _Input("message", "The user submitted a response to an earlier interactive prompt.",
                              delivery, policy)
                session.inputs.put_nowait(item)
            return accepted
        if session.asking and not self.stuck:
            remember()
            session.answers.put_nowait(("message", message, delivery))
            return accepted
        item = self._message_input(session, message, delivery, policy, body.get("clientContext"))
        refused = await self._take(request, session, body, item)
        if refused is None or refused.status == 502:
            remember()
        return refused if refused is not None else accepted

    async def _stream27(self, request: web.Request, session: FakeSession) -> web.StreamResponse:
        try:
            start = int(request.query.get("startIndex", "0"))
        except ValueError:
            return self._refuse("Expected startIndex to be an integer.")
        follow = request.query.get("follow") != "false" and request.query.get("includeTailIndex") != "1"
        async with self._changed:
            lines = self._view(session).lines
            tail = len(lines) - 1
        if start < 0:
            start = max(0, tail + 1 + start)
        headers = {"content-type": "application/x-ndjson; charset=utf-8", "x-eve-stream-format": "ndjson",
                   "x-eve-stream-version": self.stream_version_header or str(self.stream_version),
                   "x-eve-session-id": session.id, "x-accel-buffering": "no"}
        if not follow:
            headers["x-eve-stream-tail-index"] = str(tail)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        try:
            return await self._write_stream27(request, response, session, start, follow, tail + 1)
        except (ConnectionResetError, ClientConnectionResetError):
            return response

    async def _write_stream27(self, request: web.Request, response: web.StreamResponse, session: FakeSession,
                              start: int, follow: bool, tail_at_open: int) -> web.StreamResponse:
        cut = None
        if self.cut_streams > 0:
            self.cut_streams -= 1
            cut = self.cut_after
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_seconds
        await response.write(_HEARTBEAT)
        last = loop.time()
        index, written = start, 0
        while True:
            action = "lines"
            async with self._changed:
                while True:
                    view = self._view(session)
                    end = len(view.lines) if follow else min(len(view.lines), tail_at_open)
                    if index < end:
                        break
                    now = loop.time()
                    if not follow:
                        action = "end"
                    elif view.ended:
                        action = "ended"
                    elif now >= deadline:
                        action = "lease"
                    elif now >= last + self.heartbeat_seconds:
                        action = "heartbeat"
                    else:
                        try:
                            await asyncio.wait_for(self._changed.wait(),
                                                   min(deadline, last + self.heartbeat_seconds) - now)
                        except TimeoutError:
                            pass
                        continue
                    break
                batch = view.lines[index:end] if action == "lines" else []
            if action == "heartbeat":
                await response.write(_HEARTBEAT)
                last = loop.time()
                continue
            if action != "lines":
                if action == "ended":
                    await response.write(b'{"$eve":"stream.ended"}\n')
                elif action == "lease":
                    await response.write(b'{"$eve":"stream.lease-ended"}\n')
                break
            if follow and self.stream_lag:
                await asyncio.sleep(self.stream_lag)
            for record in batch:
                line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
                if cut is not None and written >= cut:
                    await response.write(line[: len(line) // 2])
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if self.garbage_every and (index + 1) % self.garbage_every == 0:
                    await response.write(b"{this is not json\n")
                await response.write(line)
                written += 1
                index += 1
            last = loop.time()
        await response.write_eof()
        return response

    async def _cancel27(self, request: web.Request) -> web.Response:
        body, refused = await self._body27(request, ("turnId",))
        if refused is not None:
            return refused
        if self.cancel_errors:
            self.cancel_errors -= 1
            return web.json_response({"error": "Internal error", "ok": False}, status=500)
        session = self._session(request)
        if session is None or not session.active or session.stranded:
            return self._not_active()
        delivery = str(uuid.uuid4())
        session.controls[delivery] = "cancel"
        turn = body.get("turnId")
        running_turn = session.running and not session.compacting
        applies = (running_turn and not session.cancel.is_set()
                   and ("turnId" not in body or turn == f"turn_{session.sequence}"))
        async with self._changed:
            self._note(session, {"type": "cancel", "deliveryId": delivery, "applies": applies})
            self._changed.notify_all()
        if applies:
            session.cancel.set()
        return web.json_response({"ok": True, "sessionId": session.id, "deliveryId": delivery}, status=202)

    async def _compact27(self, request: web.Request) -> web.Response:
        _, refused = await self._body27(request, ())
        if refused is not None:
            return refused
        session = self._session(request)
        if session is None or not session.active or session.stranded:
            return self._not_active()
        if self.compact_errors:
            self.compact_errors -= 1
            return web.json_response({"ok": False, "code": "internal_error", "message": "boom"}, status=500)
        if self.compact_ack_delay:
            await asyncio.sleep(self.compact_ack_delay)
        delivery = str(uuid.uuid4())
        session.controls[delivery] = "compact"
        if not self.stuck:
            session.inputs.put_nowait(_Input("compact", delivery=delivery))
        return web.json_response({"ok": True, "sessionId": session.id, "deliveryId": delivery}, status=202)

    async def _clear27(self, request: web.Request) -> web.Response:
        _, refused = await self._body27(request, ())
        if refused is not None:
            return refused
        session = self._session(request)
        if session is None or not session.active:
            return self._not_active()
        if session.stranded:
            return self._stranded()
        delivery = str(uuid.uuid4())
        session.controls[delivery] = "clear"
        session.inputs.put_nowait(_Input("clear", delivery=delivery))
        if session.running and not session.compacting:
            session.cancel.set()  # 1.0.1's clear does not wait for the turn (PROTOCOL-27.md §8)
        return web.json_response({"ok": True, "sessionId": session.id, "deliveryId": delivery}, status=202)

    async def _end(self, request: web.Request) -> web.Response:
        """``POST …/end`` (and ``/reset`` in v27 mode): 202 with a deliveryId, then the session ends."""
        if (denied := self._auth(request)) is not None:
            return denied
        if self.stream_version < 27:
            return web.Response(status=404, text="404: Not Found")  # no such route on 0.80.1
        _, refused = await self._body27(request, ("reason",))
        if refused is not None:
            return refused
        session = self._session(request)
        if session is None or not session.active:
            return self._not_active()
        if self.stuck:
            await asyncio.sleep(30)
            return web.json_response({"error": "Failed to end the session.", "ok": False}, status=500)
        delivery = str(uuid.uuid4())
        session.controls[delivery] = "reset"
        await self._finish(session, [delivery])
        return web.json_response({"ok": True, "sessionId": session.id, "deliveryId": delivery}, status=202)

    # -- the agent --------------------------------------------------------------------------

    def _usage(self, s: FakeSession) -> dict[str, int]:
        return {"cacheReadTokens": 0, "cacheWriteTokens": 0, "inputTokens": s.usage_in, "outputTokens": s.usage_out}

    async def _waiting(self, s: FakeSession, deliveries: list[str]) -> None:
        await self._emit(s, "session.waiting", {"continuationToken": s.id, "usage": self._usage(s),
                                                "wait": "next-user-message"}, deliveries)

    async def _run(self, s: FakeSession) -> None:
        while True:
            item = await s.inputs.get()
            if item.kind == "message":
                await self._turn(s, item)
            elif item.kind == "compact":
                await self._compaction(s, [item.delivery] if item.delivery else [])
            elif item.kind == "clear":
                turn = {"sequence": s.sequence, "sessionId": s.id, "turnId": f"turn_{s.sequence}"}
                s.history_chars = 0
                await self._emit(s, "context.cleared", turn, [item.delivery] if item.delivery else [])
                await self._waiting(s, [])

    async def _sleep_or(self, s: FakeSession, seconds: float) -> str:
        """Sleep, unless a steer or a cancel comes first."""
        steer = asyncio.ensure_future(s.steer.get())
        cancel = asyncio.ensure_future(s.cancel.wait())
        done, pending = await asyncio.wait({steer, cancel}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if cancel in done:
            if steer in done:
                s.steer.put_nowait(steer.result())
            return "cancel"
        if steer in done:
            s.steer.put_nowait(steer.result())
            return "steer"
        return "timeout"

    async def _turn(self, s: FakeSession, item: _Input) -> None:
        s.running, s.output_started = True, False
        s.cancel.clear()
        deliveries = [item.delivery]
        seq = s.sequence
        turn = {"sequence": seq, "turnId": f"turn_{seq}"}
        if not s.started:
            s.started = True
            # the eve that builds the session names itself (a session keeps it across an upgrade,
            # PROTOCOL-27.md §11)
            built_by = self.eve_version or (EVE_VERSION_27 if self.stream_version >= 27 else EVE_VERSION_26)
            await self._emit(s, "session.started", {"runtime": {"agentId": "fake", "agentName": "fake",
                                                                "eveVersion": built_by}}, deliveries)
        await self._emit(s, "turn.started", turn, deliveries)
        texts = [item.text]
        await self._emit(s, "message.received", {"message": item.text,
                                                 "parts": s.parts.get(item.delivery)
                                                 or [{"text": item.text, "type": "text"}],
                                                 **turn}, deliveries)
        step = 0
        try:
            while True:
                await self._emit(s, "step.started", {"modelId": "fake/fake-model", "stepIndex": step, **turn},
                                 deliveries)
                clean, marks = _markers(texts[-1])
                delay = float(marks.get("delay") or 0) + self.step_delay
                outcome = await self._sleep_or(s, delay) if delay else "timeout"
                if outcome == "timeout" and not s.steer.empty():
                    outcome = "steer"
                if outcome == "cancel":
                    await self._emit(s, "turn.cancelled", turn, deliveries)
                    return
                if outcome == "steer":
                    steer = s.steer.get_nowait()
                    deliveries.append(steer.delivery)
                    texts.append(steer.text)
                    await self._emit(s, "step.completed", {"finishReason": "other", "stepIndex": step, **turn},
                                     deliveries)
                    await self._emit(s, "message.received", {"message": steer.text,
                                                             "parts": [{"text": steer.text, "type": "text"}], **turn},
                                     deliveries)
                    step += 1
                    continue
                if "ask" in marks and step == 0:
                    prompt, *options = marks["ask"].split("|")
                    request_id = f"req_{seq}"
                    if self.ask_as_action:
                        await self._emit(s, "actions.requested", {"actions": [{
                            "callId": f"call_{seq}", "input": {}, "kind": "tool-call", "toolName": "ask_question"}],
                            "stepIndex": step, **turn}, deliveries)
                    # [[askkind=K]]: another kind of pause (budget: eve's session-limit prompt with
                    # continue/stop; sign-in with [[signin=URL]]; anything else: a kind Iva does not know)
                    kind = marks.get("askkind") or "question"
                    request: dict[str, Any] = {
                        "requestId": request_id, "kind": kind, "prompt": prompt, "allowFreeform": kind == "question",
                        "options": [{"id": o, "label": o.title()} for o in options],
                        "action": {"callId": f"call_{seq}", "input": {}, "kind": "tool-call",
                                   "toolName": "ask_question"},
                    }
                    if kind == "session-limit":
                        request["options"] = [{"id": "continue", "label": "Approve"}, {"id": "stop", "label": "Stop"}]
                        request.pop("action")
                    if "signin" in marks:
                        request["signIn"] = {"url": marks["signin"], "displayName": "Example"}
                        request["options"] = []
                    await self._emit(s, "input.requested", {"requests": [request], **turn}, deliveries)
                    await self._emit(s, "turn.waiting", {"on": "input", **turn}, deliveries)
                    s.asking = True
                    try:
                        answer = asyncio.ensure_future(s.answers.get())
                        waits = ({answer} if self.cancel_ignored_while_asking
                                 else {answer, asyncio.ensure_future(s.cancel.wait())})
                        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                        for task in pending:
                            task.cancel()
                        if answer not in done:  # cancelled while waiting on the person
                            await self._emit(s, "turn.cancelled", turn, deliveries)
                            return
                        how, value, delivery = answer.result()
                    finally:
                        s.asking = False
                    deliveries.append(delivery)
                    if how == "message":
                        text = _flatten(value)
                        await self._emit(s, "message.received", {"message": text, "parts": _parts(value), **turn},
                                         deliveries)
                        response = {"text": text}
                    else:
                        response = {k: v for k, v in value[0].items() if k != "requestId"}
                    await self._emit(s, "input.resolved", {"resolutions": [{
                        "requestId": request_id, "kind": kind, "outcome": "answered", "response": response}],
                        **turn}, deliveries)
                    if kind == "session-limit" and response.get("optionId") in ("stop", "deny"):
                        # the owner's Stop: eve cancels the turn, no model call (PROTOCOL-27.md §9)
                        await self._emit(s, "turn.cancelled", turn, deliveries)
                        return
                    step += 1
                    await self._emit(s, "step.started", {"modelId": "fake/fake-model", "stepIndex": step, **turn},
                                     deliveries)
                    answer = response.get("optionId") or response.get("text")
                    texts[-1] = f"[[reply=answered: {answer}]]"
                    clean, marks = _markers(texts[-1])
                if "fail" in marks:
                    await self._emit(s, "step.failed", {"code": "MODEL_CALL_FAILED", "stepIndex": step, **turn},
                                     deliveries)
                    await self._emit(s, "turn.failed", {"code": "MODEL_CALL_FAILED",
                                                        "details": {"message":
                                                                    "AI_RetryError: Failed after 3 attempts"},
                                                        **turn}, deliveries)
                    return
                tokens = (int(marks["tokens"]) if marks.get("tokens")
                          else math.ceil((s.history_chars + 400 + item.context_chars) / 4))
                if step == 0 and self.mcp_url and _MCP.search(texts[-1]):
                    for tool, raw_args in _MCP.findall(texts[-1]):
                        await self._mcp_step(s, tool, json.loads(raw_args), step, turn, deliveries, tokens)
                        step += 1
                    texts[-1] = _MCP.sub("", texts[-1])
                    clean, marks = _markers(texts[-1])
                values = [int(v) for v in marks.get("steps", "").split(",") if v.strip()]
                if values:
                    # Like fake_llm's [[steps=A,B,C]]: a tool-using turn whose inputs grow, one
                    # model call per value, a noop tool call in each but the last.
                    tokens = values[min(step, len(values) - 1)]
                if values and step < len(values) - 1:
                    await self._tool_step(s, f"call_fake_{seq}_{step}", "noop", step, tokens, turn, deliveries)
                    step += 1
                    continue
                if "tool" in marks and step == 0:
                    call = f"call_fake_{seq}_{step}"
                    await self._emit(s, "action.input.appended", {"callId": call, "inputTextDelta": "{}",
                                                                  "toolName": marks["tool"], "stepIndex": step,
                                                                  **turn}, deliveries)
                    await self._tool_step(s, call, marks["tool"], step, tokens, turn, deliveries)
                    step += 1
                    continue
                # Like the fake LLM: echo the latest user message, markers stripped.
                scripted = self.reply_for(texts[-1]) if self.reply_for is not None else None
                reply = marks.get("reply") or scripted or "echo: " + clean
                s.output_started = True
                self.first_delta_at.setdefault(reply, time.monotonic())  # benchmarks: eve's first delta
                if marks.get("chunkdelay"):
                    # Like fake_llm's [[chunkdelay=S]]: word by word, S seconds apart; a cancel
                    # cuts the text off (turn.cancelled, no message.completed).
                    pace = float(marks["chunkdelay"])
                    words = reply.split(" ")
                    for n, word in enumerate(words):
                        delta = word if n == 0 else " " + word
                        await self._emit(s, "message.appended", {"messageDelta": delta, "stepIndex": step, **turn},
                                         deliveries)
                        if n + 1 < len(words):
                            try:
                                await asyncio.wait_for(s.cancel.wait(), pace)
                            except TimeoutError:
                                continue
                            await self._emit(s, "turn.cancelled", turn, deliveries)
                            return
                else:
                    await self._emit(s, "message.appended", {"messageDelta": reply, "stepIndex": step, **turn},
                                     deliveries)
                await self._emit(s, "message.completed", {"finishReason": "stop", "message": reply, "stepIndex": step,
                                                          **turn}, deliveries)
                await self._emit(s, "step.completed", {"finishReason": "stop", "stepIndex": step, **turn,
                                                       "usage": {"inputTokens": tokens, "outputTokens": len(reply) // 4,
                                                                 "cacheReadTokens": 0}}, deliveries)
                s.usage_in += tokens
                s.usage_out += len(reply) // 4
                s.history_chars += sum(len(t) for t in texts) + len(reply)
                await self._emit(s, "turn.completed", turn, deliveries)
                return
        finally:
            s.sequence += 1
            s.turns_run += 1
            s.running = False
            # Steers that came after output started run as the next turn (PROTOCOL.md §4).
            while not s.steer.empty():
                s.inputs.put_nowait(s.steer.get_nowait())
            if s.active:
                await self._waiting(s, deliveries)

    async def _mcp_step(self, s: FakeSession, tool: str, args: dict[str, Any], step: int, turn: dict[str, Any],
                        deliveries: list[str], tokens: int) -> None:
        """One model step that calls an MCP tool the way eve does (PROTOCOL.md §11)."""
        import aiohttp

        headers = {"x-eve-session-id": s.id, "accept": "application/json, text/event-stream",
                   **({"authorization": f"Bearer {self.mcp_token}"} if self.mcp_token else {})}
        record: dict[str, Any] = {"session": s.id, "tool": tool, "args": args}
        assert self.mcp_url is not None
        try:
            async with aiohttp.ClientSession(headers=headers) as http:
                async def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
                    async with http.post(self.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                             "params": params}) as response:
                        return await response.json()

                listed = (await rpc("tools/list", {})).get("result", {}).get("tools", [])
                record["listed"] = [t["name"] for t in listed]
                if tool not in record["listed"]:
                    record["error"] = f'Connection "{self.mcp_connection}" has no tool named "{tool}".'
                else:
                    call = f"call_mcp_{turn['sequence']}_{step}"
                    name = f"{self.mcp_connection}__{tool}"
                    await self._emit(s, "actions.requested", {"actions": [{"callId": call, "input": args,
                                                                           "kind": "tool-call", "toolName": name}],
                                                              "stepIndex": step, **turn}, deliveries)
                    answer = await rpc("tools/call", {"name": tool, "arguments": {**args, "eve_session_id": s.id}})
                    result = answer.get("result") or {}
                    text = "".join(c.get("text", "") for c in result.get("content", []))
                    record.update(is_error=bool(result.get("isError")) or "error" in answer, output=text,
                                  rpc_error=answer.get("error"))
                    await self._emit(s, "action.result", {"result": {"callId": call, "kind": "tool-result",
                                                                     "output": text, "toolName": name},
                                                          "status": "failed" if record["is_error"] else "completed",
                                                          "stepIndex": step, **turn}, deliveries)
        except (aiohttp.ClientError, OSError) as exc:
            record["error"] = f'Failed to load tools for "{self.mcp_connection}": {exc}'
        self.mcp_results.append(record)
        await self._emit(s, "step.completed", {"finishReason": "tool-calls", "stepIndex": step, **turn,
                                               "usage": {"inputTokens": tokens, "outputTokens": 5,
                                                         "cacheReadTokens": 0}}, deliveries)
        s.usage_in += tokens

    async def _compaction(self, s: FakeSession, deliveries: list[str]) -> None:
        s.running = s.compacting = True
        s.cancel.clear()
        seq = s.sequence
        turn = {"sequence": seq, "sessionId": s.id, "stepIndex": 0, "turnId": f"turn_{seq}"}
        await self._emit(s, "compaction.requested", {"modelId": "fake/fake-model", **turn,
                                                     "usageInputTokens": s.history_chars / 4 + 31.75}, deliveries)
        outcome = await self._sleep_or(s, self.summary_delay) if self.summary_delay else "timeout"
        s.running = s.compacting = False
        if outcome == "cancel":
            await self._waiting(s, [])
            await self._waiting(s, [])  # eve emits it twice after a cancelled compaction (§5)
            return
        if self.summary_fail:
            await self._waiting(s, [])
            return
        s.history_chars = min(s.history_chars, 400)
        s.compactions_done += 1
        await self._emit(s, "compaction.completed", {"modelId": "fake/fake-model", **turn}, deliveries)
        if self.waiting_after_compaction:
            await asyncio.sleep(self.waiting_after_compaction)
        await self._waiting(s, [])
