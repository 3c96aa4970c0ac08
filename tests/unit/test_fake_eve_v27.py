"""The fake eve in stream version 27 (PROTOCOL-27.md), driven over real HTTP with httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from tests.fakes.eve import FakeEve

Record = dict[str, Any]


@pytest.fixture
async def fake() -> AsyncIterator[FakeEve]:
    eve = FakeEve(stream_version=27)
    await eve.start()
    try:
        yield eve
    finally:
        await eve.stop()


@pytest.fixture
async def http(fake: FakeEve) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fake.url, headers={"authorization": f"Bearer {fake.token}"},
                                 timeout=10) as client:
        yield client


async def until(condition: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Wait for a condition on the fake's state (never a sleep that proves absence)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := condition()):
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
    return value


def facts(lines: list[Record], type_: str | None = None) -> list[Record]:
    found = [f for line in lines for f in line.get("facts", [])]
    return [f for f in found if type_ is None or f["type"] == type_]


def shape(lines: list[Record]) -> list[Any]:
    """Each line as its fact types (a progress record as its progress type)."""
    return [[f["type"] for f in line["facts"]] if "facts" in line else line["progress"]["type"] for line in lines]


def settled_turns(fake: FakeEve, sid: str) -> int:
    return len(facts(fake.lines(sid), "turn.settled"))


async def read(http: httpx.AsyncClient, sid: str, **params: Any) -> tuple[httpx.Response, list[Record]]:
    response = await http.get(f"/eve/v1/session/{sid}/stream", params={"follow": "false", **params})
    return response, [json.loads(line) for line in response.text.splitlines()]


def numbered(records: list[Record]) -> list[Record]:
    return [r for r in records if "$eve" not in r]


async def create(http: httpx.AsyncClient, message: str | None = None) -> Record:
    response = await http.post("/eve/v1/session", json={"message": message} if message is not None else None)
    assert response.status_code == 202, response.text
    body: Record = response.json()
    return body


async def turn(fake: FakeEve, http: httpx.AsyncClient, message: str) -> tuple[str, str]:
    """A session whose first turn (created with ``message``) has settled: (sessionId, deliveryId)."""
    body = await create(http, message)
    await until(lambda: settled_turns(fake, body["sessionId"]) == 1)
    return body["sessionId"], body["deliveryId"]


async def test_plain_turn_lines_and_positions(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """A turn created with its message reads as PROTOCOL-27.md §3's eight lines, after a heartbeat."""
    sid, delivery = await turn(fake, http, "hello world")
    response, records = await read(http, sid)
    assert response.headers["x-eve-stream-version"] == "27"
    assert response.headers["x-eve-stream-tail-index"] == "7"
    assert records[0] == {"$eve": "heartbeat"}
    lines = numbered(records)
    assert shape(lines) == [["session.started", "delivery.admitted"], ["turn.started", "delivery.consumed"],
                            ["model.requested"], ["model.started"], "content.delta", ["content.completed"],
                            ["model.settled", "usage.recorded"], ["turn.settled", "delivery.settled"]]
    assert lines[0]["facts"][0]["data"]["runtime"]["eveVersion"] == "1.0.1"
    assert lines[0]["facts"][1]["data"]["deliveryId"] == delivery
    started, consumed = lines[1]["facts"]
    assert started["data"] == {"cause": {"deliveryId": delivery}, "follows": None, "turnId": "turn_0"}
    assert consumed["data"] == {"deliveryId": delivery, "parts": [{"kind": "text", "text": "hello world"}],
                                "turnId": "turn_0"}
    assert lines[2]["facts"][0]["data"] == {"owner": {"turnId": "turn_0"}, "runId": "run_0"}
    assert lines[4]["progress"]["data"] == {"delta": "echo: hello world", "kind": "text", "partId": "run_0.0"}
    assert lines[5]["facts"][0]["data"]["phase"] == "reply"
    usage = lines[6]["facts"][1]
    assert usage["scope"] == {"runId": "run_0", "turnId": "turn_0"}
    assert set(usage["data"]["usage"]) == {"inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens"}
    settled, handled = lines[7]["facts"]
    assert settled["data"] == {"outcome": "completed", "reply": ["run_0.0"], "turnId": "turn_0"}
    assert handled["data"] == {"deliveryId": delivery, "outcome": "handled", "turnId": "turn_0"}

    sent = (await http.post(f"/eve/v1/session/{sid}", json={"message": "again"})).json()
    assert set(sent) == {"ok", "sessionId", "deliveryId"}
    await until(lambda: settled_turns(fake, sid) == 2)
    more = numbered((await read(http, sid, startIndex=8))[1])
    assert shape(more)[:2] == [["delivery.admitted"], ["turn.started", "delivery.consumed"]]
    assert more[1]["facts"][0]["data"]["follows"] == "turn_0"
    assert facts(more, "model.requested")[0]["data"]["runId"] == "run_1"
    assert fake.refused() == []


async def test_streamed_answer_is_progress_records(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """One progress record per chunk; only the first delta of a part carries kind and scope."""
    sid, _ = await turn(fake, http, "count [[chunkdelay=0.01]] [[reply=one two three]]")
    lines = numbered((await read(http, sid))[1])
    deltas = [line["progress"] for line in lines if "progress" in line]
    assert [d["data"]["delta"] for d in deltas] == ["one", " two", " three"]
    assert deltas[0]["scope"] == {"runId": "run_0", "turnId": "turn_0"} and deltas[0]["data"]["kind"] == "text"
    assert deltas[1] == {"type": "content.delta", "data": {"delta": " two", "partId": "run_0.0"}}
    assert facts(lines, "content.completed")[0]["data"]["value"] == "one two three"


async def test_tool_turn(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """A tool call: call.input progress, call.requested/started/settled, then a new run for the reply."""
    sid, _ = await turn(fake, http, "use tool [[tool=noop]] [[tokens=1000]]")
    lines = numbered((await read(http, sid))[1])
    calls = [line for line in lines if "progress" in line and line["progress"]["type"] == "call.input"]
    assert calls[0]["progress"]["data"] == {"callId": "call_fake_0_0", "delta": "{}", "kind": "tool", "name": "noop"}
    (requested,) = facts(lines, "call.requested")
    assert requested["data"] == {"callId": "call_fake_0_0", "capability": {"kind": "tool", "name": "noop"},
                                 "input": {}, "owner": {"runId": "run_0"}}
    assert shape(lines).index(["call.started"]) + 1 == shape(lines).index(["call.settled"])
    assert facts(lines, "call.settled")[0]["data"]["outcome"] == "completed"
    assert [f["data"]["finishReason"] for f in facts(lines, "model.settled")] == ["tool-calls", "stop"]
    assert [f["data"]["usage"]["inputTokens"] for f in facts(lines, "usage.recorded")] == [1000, 1000]
    assert facts(lines, "turn.settled")[0]["data"]["reply"] == ["run_1.0"]


async def test_failed_model_call_settles_run_and_turn_in_one_line(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid, _ = await turn(fake, http, "boom [[fail=500]]")
    lines = numbered((await read(http, sid))[1])
    assert shape(lines)[-1] == ["model.settled", "turn.settled", "delivery.settled"]
    model, settled, _ = lines[-1]["facts"]
    assert model["data"]["outcome"] == "failed" and settled["data"]["outcome"] == "failed"
    assert settled["data"]["error"]["code"] == "MODEL_CALL_FAILED"


async def test_cancel(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """A cancel ends the running turn with its cause; an idle cancel is ignored; only turnId is accepted."""
    body = await create(http, "slow [[delay=30]]")
    sid = body["sessionId"]
    await until(lambda: facts(fake.lines(sid), "model.started"))
    refused = await http.post(f"/eve/v1/session/{sid}/cancel", json={"reason": "x"})
    assert refused.status_code == 400
    assert refused.json()["error"] == "Unknown field 'reason'. Accepted fields: turnId."
    answer = await http.post(f"/eve/v1/session/{sid}/cancel", json={"turnId": "turn_0"})
    assert answer.status_code == 202 and set(answer.json()) == {"ok", "sessionId", "deliveryId"}
    cancel = answer.json()["deliveryId"]
    await until(lambda: settled_turns(fake, sid) == 1)
    lines = numbered((await read(http, sid))[1])
    assert shape(lines)[-2:] == [["model.settled"], ["delivery.admitted", "turn.settled", "delivery.settled",
                                                     "delivery.settled"]]
    admitted, settled, handled, applied = lines[-1]["facts"]
    assert admitted["data"]["source"] == {"control": "cancel"}
    assert settled["data"] == {"cause": {"deliveryId": cancel}, "outcome": "cancelled", "reply": [],
                               "turnId": "turn_0"}
    assert (handled["data"]["deliveryId"], handled["data"]["outcome"]) == (body["deliveryId"], "handled")
    assert applied["data"] == {"deliveryId": cancel, "outcome": "applied"}

    idle = (await http.post(f"/eve/v1/session/{sid}/cancel")).json()["deliveryId"]
    await until(lambda: any(f["data"] == {"deliveryId": idle, "outcome": "ignored"}
                            for f in facts(fake.lines(sid), "delivery.settled")))


async def test_cancel_mid_output_keeps_the_partial_text_as_narration(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid = (await create(http, "talk [[chunkdelay=30]] [[reply=one two]]"))["sessionId"]
    await until(lambda: any("progress" in line for line in fake.lines(sid)))
    await http.post(f"/eve/v1/session/{sid}/cancel")
    await until(lambda: settled_turns(fake, sid) == 1)
    lines = numbered((await read(http, sid))[1])
    (narration,) = facts(lines, "content.completed")
    assert narration["data"]["phase"] == "narration" and narration["data"]["interrupted"] is True
    assert narration["data"]["value"] == "one"
    assert shape(lines)[-1][:3] == ["delivery.admitted", "model.settled", "turn.settled"]
    assert facts(lines, "turn.settled")[0]["data"]["reply"] == []


async def test_compact(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """/compact: empty body only, 202 with a deliveryId, then context.started … context.settled, applied."""
    sid, _ = await turn(fake, http, "hello")
    refused = await http.post(f"/eve/v1/session/{sid}/compact", json={"x": 1})
    assert refused.status_code == 400
    assert refused.json()["error"] == "Unknown field 'x'. Accepted fields: (none)."
    answer = await http.post(f"/eve/v1/session/{sid}/compact")
    assert answer.status_code == 202
    delivery = answer.json()["deliveryId"]
    await until(lambda: facts(fake.lines(sid), "context.settled") and fake.quiet())
    lines = numbered((await read(http, sid, startIndex=8))[1])
    assert shape(lines) == [["delivery.admitted"], ["context.started"], ["model.requested"], ["model.started"],
                            ["model.settled", "usage.recorded", "context.settled"], ["delivery.settled"]]
    assert lines[0]["facts"][0]["data"]["source"] == {"control": "compact"}
    assert lines[1]["facts"][0]["data"] == {"changeId": "change_0", "kind": "compaction",
                                            "cause": {"deliveryId": delivery}}
    assert lines[2]["facts"][0]["data"] == {"owner": {"changeId": "change_0"}, "runId": "run_1"}
    assert lines[4]["facts"][1]["scope"] == {"runId": "run_1", "changeId": "change_0"}
    assert lines[4]["facts"][2]["data"] == {"changeId": "change_0", "kind": "compaction", "outcome": "completed"}
    assert lines[5]["facts"][0]["data"] == {"deliveryId": delivery, "outcome": "applied"}


async def test_failed_compaction(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid, _ = await turn(fake, http, "hello")
    fake.summary_fail = True
    delivery = (await http.post(f"/eve/v1/session/{sid}/compact")).json()["deliveryId"]
    await until(lambda: facts(fake.lines(sid), "context.settled"))
    (settled,) = facts(fake.lines(sid), "context.settled")
    assert settled["data"]["outcome"] == "failed" and settled["data"]["error"]["code"] == "COMPACTION_FAILED"
    assert facts(fake.lines(sid), "delivery.settled")[-1]["data"] == {
        "deliveryId": delivery, "outcome": "failed", "reason": "compaction-failed"}


async def test_clear(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid, _ = await turn(fake, http, "hello")
    delivery = (await http.post(f"/eve/v1/session/{sid}/clear")).json()["deliveryId"]
    await until(lambda: facts(fake.lines(sid), "context.settled"))
    assert shape(fake.lines(sid))[-1] == ["delivery.admitted", "context.started", "context.settled",
                                          "delivery.settled"]
    assert facts(fake.lines(sid), "context.settled")[0]["data"]["selects"] is None
    assert facts(fake.lines(sid), "context.started")[0]["data"]["cause"] == {"deliveryId": delivery}
    await http.post(f"/eve/v1/session/{sid}", json={"message": "after"})
    await until(lambda: settled_turns(fake, sid) == 2)
    assert facts(fake.lines(sid), "turn.started")[-1]["data"]["follows"] is None


async def test_question_answered(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """input.requested → interaction.opened + turn.paused; ``answers`` settle it and the turn goes on."""
    sid = (await create(http, "pick [[ask=Which color?|red|blue]]"))["sessionId"]
    await until(lambda: facts(fake.lines(sid), "turn.paused"))
    (opened,) = facts(fake.lines(sid), "interaction.opened")
    request = opened["data"]["request"]
    assert (request["kind"], request["prompt"]) == ("question", "Which color?")
    assert [o["id"] for o in request["options"]] == ["red", "blue"]
    interaction = opened["data"]["interactionId"]
    paused = fake.lines(sid)[-1]["facts"]
    assert paused[0]["data"] == {"awaiting": [{"interactionId": interaction}], "turnId": "turn_0"}
    assert paused[1]["data"]["outcome"] == "awaiting-input"
    both = await http.post(f"/eve/v1/session/{sid}", json={"message": "x", "answers": []})
    assert both.json()["error"] == "'message' and 'answers' are mutually exclusive."
    answer = await http.post(f"/eve/v1/session/{sid}",
                             json={"answers": [{"interactionId": interaction, "optionId": "red"}]})
    assert answer.status_code == 202
    await until(lambda: settled_turns(fake, sid) == 1)
    lines = fake.lines(sid)
    assert facts(lines, "interaction.settled")[0]["data"] == {
        "interactionId": interaction, "outcome": "accepted", "response": {"optionId": "red"}}
    assert facts(lines, "delivery.consumed")[-1]["data"]["parts"] == []
    assert facts(lines, "content.completed")[-1]["data"]["value"] == "answered: red"


async def test_end_then_gone(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """/end: 202 with a deliveryId; an open stream gets session.ended and stream.ended; then 409 and 410."""
    sid, _ = await turn(fake, http, "hello")
    records: list[Record] = []

    async def follow() -> None:
        async with http.stream("GET", f"/eve/v1/session/{sid}/stream") as response:
            async for line in response.aiter_lines():
                records.append(json.loads(line))

    reader = asyncio.create_task(follow())
    await until(lambda: len(numbered(records)) == 8)
    answer = await http.post(f"/eve/v1/session/{sid}/end", json={"reason": "bye"})
    assert answer.status_code == 202
    end = answer.json()["deliveryId"]
    await asyncio.wait_for(reader, 5)
    assert records[-1] == {"$eve": "stream.ended"}
    last = records[-2]["facts"]
    assert [f["type"] for f in last] == ["delivery.admitted", "delivery.settled", "session.ended"]
    assert last[0]["data"]["source"] == {"control": "reset"}
    assert last[2]["data"] == {"cause": {"deliveryId": end}, "outcome": "completed"}
    sent = await http.post(f"/eve/v1/session/{sid}", json={"message": "late"})
    assert (sent.status_code, sent.json()["code"]) == (409, "session_not_active")
    for route in ("compact", "clear", "cancel", "end", "reset"):
        assert (await http.post(f"/eve/v1/session/{sid}/{route}")).status_code == 409
    gone = await http.get(f"/eve/v1/session/{sid}/stream")
    assert (gone.status_code, gone.json()["code"]) == (410, "session_expired")


async def test_idempotency_key(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """The same key again returns the same deliveryId and starts no second turn."""
    sid, _ = await turn(fake, http, "hello")
    first = await http.post(f"/eve/v1/session/{sid}", json={"message": "once", "idempotencyKey": "k1"})
    again = await http.post(f"/eve/v1/session/{sid}", json={"message": "other", "idempotencyKey": "k1"})
    assert first.json()["deliveryId"] == again.json()["deliveryId"]
    await until(lambda: settled_turns(fake, sid) == 2 and fake.quiet())
    consumed = [f["data"]["deliveryId"] for f in facts(fake.lines(sid), "delivery.consumed")]
    assert consumed.count(first.json()["deliveryId"]) == 1 and len(consumed) == 2
    bad = await http.post(f"/eve/v1/session/{sid}", json={"message": "x", "idempotencyKey": ""})
    assert bad.status_code == 400


@pytest.mark.parametrize(("route", "body", "error"), [
    ("", {"message": "hi", "turnPolicy": "queue"},
     "Unknown field 'turnPolicy'. Accepted fields: message, clientContext, outputSchema, operationId, callback, "
     "protocolVersion, capabilities, stubs, forwardedPrincipal."),
    ("", {"message": "hi", "idempotencyKey": "k"}, "Unknown field 'idempotencyKey'."),
    ("/{sid}", {"inputResponses": [{"requestId": "r", "optionId": "a"}]}, "Unknown field 'inputResponses'."),
    ("/{sid}", {"message": ""}, "Expected a non-empty 'message' or a non-empty 'answers' array."),
    ("/{sid}", {"message": "x", "turnPolicy": "later"}, "Expected 'turnPolicy' to be either 'queue' or 'steer'."),
])
async def test_unknown_fields_are_400(fake: FakeEve, http: httpx.AsyncClient, route: str, body: Record,
                                      error: str) -> None:
    sid = (await create(http))["sessionId"]
    response = await http.post("/eve/v1/session" + route.format(sid=sid), json=body)
    assert response.status_code == 400
    assert response.json()["error"].startswith(error)
    assert fake.refused() == [("POST", "/eve/v1/session" + route.format(sid=sid), 400)]
    assert fake.requests[-1][2] == body


async def test_heartbeats_and_lease_end(fake: FakeEve, http: httpx.AsyncClient) -> None:
    """A quiet followed stream gets a heartbeat every heartbeat_seconds, then stream.lease-ended and the end."""
    fake.heartbeat_seconds, fake.lease_seconds = 0.02, 0.2
    sid, _ = await turn(fake, http, "hello")
    async with http.stream("GET", f"/eve/v1/session/{sid}/stream", params={"startIndex": 8}) as response:
        records = [json.loads(line) async for line in response.aiter_lines()]
    assert records[-1] == {"$eve": "stream.lease-ended"}
    assert set(map(json.dumps, records[:-1])) == {json.dumps({"$eve": "heartbeat"})}
    assert len(records) >= 4


async def test_start_index_resume_returns_identical_lines(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid, _ = await turn(fake, http, "use tool [[tool=noop]]")
    await http.post(f"/eve/v1/session/{sid}", json={"message": "more [[chunkdelay=0.01]]"})
    await until(lambda: settled_turns(fake, sid) == 2)
    everything = numbered((await read(http, sid))[1])
    tail = len(everything) - 1
    for start in (0, 1, 5, tail):
        response, records = await read(http, sid, startIndex=start)
        assert numbered(records) == everything[start:]
        assert response.headers["x-eve-stream-tail-index"] == str(tail)
    assert numbered((await read(http, sid, startIndex=-2))[1]) == everything[-2:]
    assert numbered((await read(http, sid, startIndex=-999))[1]) == everything
    assert (await read(http, sid, startIndex=tail + 1))[1] == [{"$eve": "heartbeat"}]
    only_tail = await http.get(f"/eve/v1/session/{sid}/stream", params={"includeTailIndex": "1", "startIndex": tail})
    assert [json.loads(line) for line in only_tail.text.splitlines()][1:] == everything[tail:]
    bad = await http.get(f"/eve/v1/session/{sid}/stream", params={"startIndex": "abc"})
    assert (bad.status_code, bad.json()["error"]) == (400, "Expected startIndex to be an integer.")

    fake.lease_seconds = 0.05  # a followed read from a cursor: the same lines, then the lease ends it
    async with http.stream("GET", f"/eve/v1/session/{sid}/stream", params={"startIndex": 3}) as response:
        followed = [json.loads(line) async for line in response.aiter_lines()]
    assert numbered(followed) == everything[3:] and followed[-1] == {"$eve": "stream.lease-ended"}


async def test_cut_stream_ends_mid_line(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid, _ = await turn(fake, http, "hello")
    fake.cut_streams, fake.cut_after = 1, 2
    with pytest.raises(httpx.HTTPError):
        await http.get(f"/eve/v1/session/{sid}/stream", params={"follow": "false"})
    assert len(numbered((await read(http, sid))[1])) == 8


async def test_stranded_session(fake: FakeEve, http: httpx.AsyncClient) -> None:
    sid, _ = await turn(fake, http, "hello")
    fake.strand(sid)
    sent = await http.post(f"/eve/v1/session/{sid}", json={"message": "again"})
    assert sent.status_code == 409
    assert sent.json() == {"code": "session_stranded", "error": "This session is no longer available.",
                           "ok": False, "eveVersion": "0.80.1"}
    assert (await http.post(f"/eve/v1/session/{sid}/clear")).json()["code"] == "session_stranded"
    for route in ("compact", "cancel"):
        assert (await http.post(f"/eve/v1/session/{sid}/{route}")).json()["code"] == "session_not_active"
    assert len(numbered((await read(http, sid))[1])) == 8  # its history still reads
    assert (await http.post(f"/eve/v1/session/{sid}/end")).status_code == 202


async def test_info_and_version_header(fake: FakeEve, http: httpx.AsyncClient) -> None:
    info = (await http.get("/eve/v1/info")).json()
    assert info["eveVersion"] == "1.0.1" and info["agent"]["model"]["contextWindowTokens"] == fake.window
    sid, _ = await turn(fake, http, "hello")
    fake.stream_version_header = "28"
    response, _ = await read(http, sid)
    assert response.headers["x-eve-stream-version"] == "28"


async def test_v26_mode_on_request() -> None:
    """FakeEve(stream_version=26) speaks 0.80's wire: create answers a status, no heartbeat, one event
    per line, no /end."""
    fake = FakeEve(stream_version=26)
    await fake.start()
    try:
        async with httpx.AsyncClient(base_url=fake.url, headers={"authorization": f"Bearer {fake.token}"}) as http:
            created = (await http.post("/eve/v1/session", json={"message": "hello"})).json()
            assert created["status"] == "accepted" and "deliveryId" not in created
            sid = created["sessionId"]
            await until(lambda: any(e["type"] == "session.waiting" for e in fake.sessions[sid].events))
            response, records = await read(http, sid)
            assert response.headers["x-eve-stream-version"] == "26"
            assert [r["type"] for r in records][:2] == ["session.started", "turn.started"]
            assert (await http.post(f"/eve/v1/session/{sid}/end")).status_code == 404
            assert (await http.get("/eve/v1/info")).json()["eveVersion"] == "0.80.1"
    finally:
        await fake.stop()
