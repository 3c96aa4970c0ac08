"""eve_client's version 27 reader (PROTOCOL-27.md §3): positions, a restart between the facts of
one line, heartbeats and lease ends, unknown facts and outcomes, an unknown stream version (V1,
V2). In process, over httpx.MockTransport: the stream's lines are scripted byte for byte."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

import eve_client as eve

FAST = eve.RetryPolicy(attempts=3, deadline=5, initial_wait=0.0, max_wait=0.01, jitter=0.0)
SID = "wrun_TEST"


def fact(type_: str, scope: dict[str, Any] | None = None, **data: Any) -> dict[str, Any]:
    return {"type": type_, **({"scope": scope} if scope else {}), "data": data}


T0 = {"turnId": "turn_0"}
R0 = {"runId": "run_0", "turnId": "turn_0"}
# A plain turn as eve 1.0.1 wrote it (PROTOCOL-27.md §3), one record a line, positions 0-7.
TURN: list[dict[str, Any]] = [
    {"at": "a", "facts": [fact("session.started", runtime={"eveVersion": "1.0.1"}),
                          fact("delivery.admitted", deliveryId="d1")]},
    {"at": "a", "facts": [fact("turn.started", T0, cause={"deliveryId": "d1"}, follows=None, turnId="turn_0"),
                          fact("delivery.consumed", T0, deliveryId="d1", parts=[{"kind": "text", "text": "hi"}],
                               turnId="turn_0")]},
    {"at": "a", "facts": [fact("model.requested", R0, owner={"turnId": "turn_0"}, runId="run_0")]},
    {"at": "a", "facts": [fact("model.started", R0, attempt=0, modelId="fake/fake-model", runId="run_0")]},
    {"progress": fact("content.delta", R0, delta="echo: ", kind="text", partId="run_0.0")},
    {"progress": {"type": "content.delta", "data": {"delta": "hi", "partId": "run_0.0"}}},
    {"at": "a", "facts": [fact("content.completed", R0, kind="text", partId="run_0.0", phase="reply", runId="run_0",
                               value="echo: hi")]},
    {"at": "a", "facts": [fact("model.settled", R0, finishReason="stop", outcome="completed", runId="run_0"),
                          fact("usage.recorded", R0, kind="model", owner={"runId": "run_0"},
                               usage={"inputTokens": 86, "outputTokens": 5, "cacheReadTokens": 0})]},
    {"at": "a", "facts": [fact("turn.settled", T0, outcome="completed", reply=["run_0.0"], turnId="turn_0"),
                          fact("delivery.settled", deliveryId="d1", outcome="handled", turnId="turn_0")]},
]
HEARTBEAT = {"$eve": "heartbeat"}
LEASE_END = {"$eve": "stream.lease-ended"}


def ndjson(records: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


class Script:
    """A scripted eve: each stream request gets the next response; records its startIndex."""

    def __init__(self, *responses: Callable[[int], bytes], version: str = "27") -> None:
        self.responses = list(responses)
        self.starts: list[int] = []
        self.version = version

    def __call__(self, request: httpx.Request) -> httpx.Response:
        start = int(request.url.params.get("startIndex", "0"))
        self.starts.append(start)
        body = self.responses.pop(0)(start) if self.responses else ndjson([HEARTBEAT, LEASE_END])
        return httpx.Response(200, content=body, headers={"x-eve-stream-version": self.version,
                                                          "content-type": "application/x-ndjson"})


def lines_from(records: Sequence[dict[str, Any]], *, lease: bool = False) -> Callable[[int], bytes]:
    """What eve serves from ``startIndex``: a heartbeat, the lines from there, maybe a lease end."""
    return lambda start: ndjson([HEARTBEAT, *records[start:], *([LEASE_END] if lease else [])])


async def follow(script: Script, cursor: eve.Position = eve.START, *, until: type[eve.Event] = eve.Idle,
                 limit: int = 100) -> list[eve.Event]:
    seen: list[eve.Event] = []
    async with eve.EveClient("http://eve.test", token="t", transport=httpx.MockTransport(script),
                             retry=FAST) as client:
        async for event in client.stream(SID, cursor):
            seen.append(event)
            if isinstance(event, until) or len(seen) >= limit:
                break
    return seen


async def test_a_plain_turn_reads_as_ivas_events_at_their_positions() -> None:
    seen = await follow(Script(lines_from(TURN)))
    assert [e.what for e in seen] == ["SessionBegan", "TurnBegan", "InputTaken", "RunBegan", "TextDelta", "TextDelta",
                                      "TextDone", "RunEnded", "UsageRecorded", "TurnEnded", "Idle"]
    assert [str(e.position) for e in seen] == ["0.0", "1.0", "1.1", "2.0", "4.0", "5.0", "6.0", "7.0", "7.1", "8.0",
                                               "8.2"]
    assert all(e.position.version == 27 for e in seen)
    assert len({e.key for e in seen}) == len(seen) and all(e.key.startswith(f"{SID}/") for e in seen)
    began, taken, ended = seen[1], seen[2], seen[9]
    assert isinstance(began, eve.TurnBegan) and began.deliveries == ("d1",) and began.turn_id == "turn_0"
    assert isinstance(taken, eve.InputTaken) and taken.text == "hi"
    assert isinstance(ended, eve.TurnEnded) and ended.deliveries == ("d1",) and ended.reply == ("run_0.0",)
    done = seen[6]
    assert isinstance(done, eve.TextDone) and done.phase is eve.Phase.REPLY and done.text == "echo: hi" and done.final
    # the second delta has no kind: the part is known from the first (PROTOCOL-27.md §3)
    assert [e.delta for e in seen if isinstance(e, eve.TextDelta)] == ["echo: ", "hi"]
    usage = seen[8]
    assert isinstance(usage, eve.UsageRecorded) and usage.usage.input_tokens == 86 and not usage.context
    assert seen[-1].after == eve.Position(9, 0)
    assert isinstance(seen[0], eve.SessionBegan) and seen[0].eve_version == "1.0.1"


@pytest.mark.parametrize("cut", [(line, index) for line, record in enumerate(TURN)
                                 for index in range(len(record.get("facts", [None])) + 1)])
async def test_a_restart_at_every_fact_boundary_neither_skips_nor_repeats(cut: tuple[int, int]) -> None:
    """V2: the whole turn read once; then read again from every cursor a restart can leave (after
    any fact of any line, the middle of a line included): exactly the events from there."""
    whole = await follow(Script(lines_from(TURN)))
    cursor = eve.Position(*cut, version=27)
    script = Script(lines_from(TURN))
    rest = await follow(script, cursor)
    assert rest == [e for e in whole if e.position >= cursor]
    assert script.starts == [cut[0]]  # the line the cursor is in, read again from its start


async def test_a_lease_end_mid_turn_is_a_quiet_reconnect_from_the_cursor(caplog: pytest.LogCaptureFixture) -> None:
    """V2: eve ends a followed read after ~120 s ({"$eve":"stream.lease-ended"}): the client opens
    it again from the cursor (the next line), reads on, and says nothing above debug."""
    first = lambda start: ndjson([HEARTBEAT, *TURN[start:5], LEASE_END])  # noqa: E731  (cut after line 4)
    script = Script(first, lines_from(TURN))
    with caplog.at_level(logging.DEBUG, logger="eve_client"):
        seen = await follow(script)
    assert script.starts == [0, 5]
    assert [str(e.position) for e in seen][-3:] == ["7.1", "8.0", "8.2"]
    assert len({e.position for e in seen}) == len(seen)
    # above debug only the version learned, once for the client's life
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG] == ["eve_stream_version"]


async def test_minutes_of_heartbeats_only_are_no_failure() -> None:
    """An idle session's stream: only heartbeats and lease ends, response after response (each
    lease is ~120 s on the real eve: 40 here are over an hour). Never counted as a failure, never
    an event; the turn that finally comes is read."""
    quiet = [lambda start: ndjson([HEARTBEAT] * 12 + [LEASE_END])] * 40
    script = Script(*quiet, lines_from(TURN))
    seen = await follow(script)
    assert len(script.starts) == 41 and set(script.starts) == {0}
    assert isinstance(seen[-1], eve.Idle) and len(seen) == 11


async def test_unknown_fact_types_fields_and_outcomes_are_ignored_as_eve_says() -> None:
    """eve's stability rules: an unknown fact, progress type or field is skipped; a new outcome
    still ends what it settles (the turn is over, eve idle)."""
    records = [
        {"at": "a", "facts": [fact("turn.started", T0, cause={"deliveryId": "d1"}, turnId="turn_0", shiny=True),
                              fact("something.new", T0, x=1)]},
        {"progress": fact("content.hologram", R0, delta="?")},
        {"at": "a", "facts": [fact("brand.new")]},
        {"at": "a", "facts": [fact("turn.settled", T0, outcome="transcended", reply=[], turnId="turn_0"),
                              fact("delivery.settled", deliveryId="d1", outcome="handled", turnId="turn_0")],
         "extra": {"a": 1}},
    ]
    seen = await follow(Script(lines_from(records)))
    assert [e.what for e in seen] == ["TurnBegan", "TurnEnded", "Idle"]
    ended = seen[1]
    assert isinstance(ended, eve.TurnEnded) and ended.outcome == "transcended" and ended.deliveries == ("d1",)
    assert [str(e.position) for e in seen] == ["0.0", "3.0", "3.2"]


async def test_a_stream_version_28_is_refused_with_one_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    """V1: a version the client does not read is refused — the error names it — never read as a
    loop of malformed lines; the log says it once however often it is met."""
    script = Script(lines_from(TURN), lines_from(TURN), version="28")
    with caplog.at_level(logging.INFO, logger="eve_client"):
        async with eve.EveClient("http://eve.test", token="t", transport=httpx.MockTransport(script),
                                 retry=FAST) as client:
            for _ in range(2):
                with pytest.raises(eve.UnsupportedStream, match="stream version 28") as raised:
                    async for _event in client.stream(SID):
                        pass
            assert raised.value.version == 28 and client.unsupported is not None
    said = [r for r in caplog.records if r.getMessage() == "eve_stream_version_unsupported"]
    assert len(said) == 1 and not [r for r in caplog.records if "malformed" in r.getMessage()]


async def test_a_cursor_read_on_version_26_is_never_applied_to_a_27_stream() -> None:
    """V2: after an eve upgrade the old session's stream is served converted (26 events became 17
    lines): a 26 cursor means nothing there; the session is gone for the bridge."""
    with pytest.raises(eve.StreamVersionChanged):
        await follow(Script(lines_from(TURN)), eve.Position(12, 0, version=26))


async def test_stream_ended_ends_reading_for_good() -> None:
    records = [*TURN, {"at": "a", "facts": [fact("session.ended", cause={"deliveryId": "e"}, outcome="completed")]}]
    script = Script(lambda start: ndjson([HEARTBEAT, *records[start:], {"$eve": "stream.ended"}]))
    seen = await follow(script, until=eve.SessionEnded, limit=100)
    assert isinstance(seen[-1], eve.SessionEnded) and script.starts == [0]


def test_narration_an_interrupted_part_and_an_in_turn_compaction() -> None:
    """Narration is not the reply (PROTOCOL-27.md §5); a cancelled run's partial text is narration
    marked interrupted; a compaction inside a turn is in_turn and is no idle moment; its summary's
    usage belongs to the context change, not the turn (seed 004's measure)."""
    C0 = {"changeId": "change_0", "turnId": "turn_0"}
    lines = [json.dumps(r) for r in [
        {"at": "a", "facts": [fact("content.completed", R0, kind="text", partId="run_0.0", phase="narration",
                                   value="Let me check first.")]},
        {"at": "a", "facts": [fact("context.started", C0, changeId="change_0", kind="compaction",
                                   trigger={"inputTokens": 120042}, turnId="turn_0")]},
        {"at": "a", "facts": [fact("usage.recorded", {"runId": "run_1", **C0}, kind="model",
                                   usage={"inputTokens": 436, "outputTokens": 11}),
                              fact("context.settled", C0, changeId="change_0", kind="compaction",
                                   outcome="completed")]},
        {"at": "a", "facts": [fact("content.completed", R0, kind="text", partId="run_2.0", phase="narration",
                                   value="echo: slow b one", interrupted=True)]},
    ]]
    narration, started, usage, settled, cut = eve.parse_lines(lines, version=27)
    assert isinstance(narration, eve.TextDone) and narration.phase is eve.Phase.NARRATION and not narration.final
    assert isinstance(started, eve.ContextStarted) and started.in_turn and started.estimate == 120042
    assert isinstance(usage, eve.UsageRecorded) and usage.context
    assert isinstance(settled, eve.ContextSettled) and settled.in_turn and settled.ok
    assert isinstance(cut, eve.TextDone) and cut.interrupted and cut.phase is eve.Phase.NARRATION


@pytest.mark.parametrize(("started_on", "recorded"), [("1.0.1", "1.0.1"), ("0.80.1", None)])
async def test_the_client_learns_eves_version_from_a_session_it_serves(started_on: str, recorded: str | None) -> None:
    """V8: eve's version for /status, from the first event of a session eve serves on this stream
    version; a session 0.80 started, followed on 1.x after an upgrade, does not name the serving
    eve — and cannot go on (V5: stranded, whatever the cursor)."""
    records = [{"at": "a", "facts": [fact("session.started", runtime={"eveVersion": started_on})]},
               {"at": "a", "facts": [fact("turn.settled", T0, outcome="completed", reply=[], turnId="turn_0")]}]
    async with eve.EveClient("http://eve.test", token="t", transport=httpx.MockTransport(Script(lines_from(records))),
                             retry=FAST) as client:
        if recorded is None:
            with pytest.raises(eve.StreamVersionChanged):
                async for _ in client.stream(SID):
                    pass
        else:
            async for event in client.stream(SID):
                if isinstance(event, eve.Idle):
                    break
        assert client.eve_version == recorded and client.stream_version == 27
