"""eve_client: routes, events, errors and retries (httpx.MockTransport and the fake eve)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

import eve_client as eve

FAST = eve.RetryPolicy(attempts=3, deadline=5, initial_wait=0.0, max_wait=0.01, jitter=0.0)


def _client(handler, **kw) -> eve.EveClient:
    return eve.EveClient("http://eve.test", token="t", transport=httpx.MockTransport(handler), retry=FAST, **kw)


def _line(type_: str, n: int, **data) -> str:
    return json.dumps({"type": type_, "data": data, "meta": {"id": f"evt_{n}", "deliveryIds": ["d1"]}})


def _events(*lines: str, first: int = 0) -> list[eve.Event | eve.Malformed]:
    return eve.parse_lines(list(lines), version=26, first=first)


def test_a_v26_line_is_typed_with_its_position_and_key():
    """Events are frozen, typed, and carry their position, eve's meta.id as key and delivery ids."""
    usage, ended = _events(_line("step.completed", 7, usage={"inputTokens": 120000, "outputTokens": 5},
                                 finishReason="stop"), first=41)
    assert isinstance(usage, eve.UsageRecorded) and isinstance(ended, eve.RunEnded)
    assert (usage.position, usage.key, usage.usage) == (eve.Position(41, 0), "evt_7", eve.Usage(120000, 5, None))
    assert (ended.position == eve.Position(41, 1) and ended.after == eve.Position(42, 0)
            and ended.finish_reason == "stop")
    assert usage.position.version == 26
    [began] = _events(_line("turn.started", 8, turnId="turn_0"), first=42)
    assert isinstance(began, eve.TurnBegan) and began.deliveries == ("d1",) and began.turn_id == "turn_0"
    with pytest.raises(AttributeError):
        usage.key = "x"  # type: ignore[misc]


def test_an_unknown_v26_event_type_is_no_event():
    assert _events(_line("something.new", 1, x=1)) == []


def test_malformed_lines_are_reported_not_raised():
    for bad in ("{nope", '{"type": "x", "data": {}}', "[1,2]"):  # not JSON, no meta.id, not an object
        [item] = _events(bad)
        assert isinstance(item, eve.Malformed)


def test_a_compactions_fractional_estimate_is_a_whole_number():
    [event] = _events(_line("compaction.requested", 1, usageInputTokens=131.75))
    assert isinstance(event, eve.ContextStarted) and event.estimate == 131 and event.kind == "compaction"


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (409, {"code": "session_not_active", "error": "gone", "ok": False}, eve.SessionNotActive),
        (409, {"code": "session_stranded", "eveVersion": "0.81.0", "ok": False}, eve.SessionStranded),
        (404, {"error": "Session not found.", "ok": False}, eve.SessionNotFound),
        (401, {"code": "unauthorized", "ok": False}, eve.EveUnauthorized),
        (400, {"error": "Expected 'turnPolicy'", "ok": False}, eve.EveRejected),
    ],
)
async def test_errors_map_to_one_tree(status, body, error):
    async with _client(lambda r: httpx.Response(status, json=body)) as client:
        with pytest.raises(error) as caught:
            await client.send("wrun_1", "hi")
    assert isinstance(caught.value, eve.EveError) and caught.value.status == status


async def test_not_ready_is_retried_then_succeeds():
    """409 session_not_ready is retryable: bounded retries until eve accepts."""
    answers = [httpx.Response(409, json={"code": "session_not_ready", "ok": False})] * 2 + [
        httpx.Response(202, json={"ok": True, "sessionId": "wrun_1", "deliveryId": "d-9"})
    ]
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return answers[len(seen) - 1]

    async with _client(handler) as client:
        delivery = await client.send("wrun_1", "hi", turn_policy="queue", client_context=["[state] x"])
    assert delivery == eve.Delivery("wrun_1", "d-9")
    assert seen[0] == {"message": "hi", "turnPolicy": "queue", "clientContext": ["[state] x"]}
    assert len(seen) == 3


async def test_send_is_not_retried_after_a_read_failure():
    """A send eve may have acted on (the answer was lost) is not repeated: no duplicate message."""
    calls = []

    def handler(request):
        calls.append(1)
        raise httpx.ReadTimeout("lost answer", request=request)

    async with _client(handler) as client:
        with pytest.raises(eve.EveTransportError):
            await client.send("wrun_1", "hi")
    assert len(calls) == 1


async def test_idempotent_route_retries_5xx_and_gives_up_bounded():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(503, json={"ok": False})

    async with _client(handler) as client:
        with pytest.raises(eve.EveServerError):
            await client.health()
    assert len(calls) == FAST.attempts


async def test_rejected_is_not_retried():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(400, json={"error": "bad", "ok": False})

    async with _client(handler) as client:
        with pytest.raises(eve.EveRejected):
            await client.cancel("wrun_1")
    assert len(calls) == 1


async def test_info_reads_the_context_window():
    body = {"agent": {"model": {"id": "fake/fake-model", "contextWindowTokens": 128000}}}
    async with _client(lambda r: httpx.Response(200, json=body)) as client:
        info = await client.info()
    assert (info.model_id, info.context_window_tokens) == ("fake/fake-model", 128000)


async def test_stream_resumes_from_the_cursor_after_a_cut(fake_eve):
    """A dropped stream resumes at the next absolute index; a cut line is not taken as an event."""
    async with eve.EveClient(fake_eve.url, token=fake_eve.token, retry=FAST) as client:
        sid = await client.create_session()
        await client.send(sid, "hello")
        fake_eve.cut_streams = 2
        fake_eve.cut_after = 2
        fake_eve.garbage_every = 4
        malformed = []
        client._on_malformed = lambda s, line: malformed.append(line)
        seen = []
        async for event in client.stream(sid):
            seen.append(event)
            if isinstance(event, eve.Idle):
                break
    assert [e.position for e in seen] == sorted({e.position for e in seen})  # each once, in order
    assert len({e.key for e in seen}) == len(seen)
    assert [type(e) for e in seen][-2:] == [eve.TurnEnded, eve.Idle]
    assert any(isinstance(e, eve.UsageRecorded) for e in seen)
    assert malformed


async def test_read_returns_the_tail_index_and_reset_closes_the_stream(fake_eve):
    async with eve.EveClient(fake_eve.url, token=fake_eve.token, retry=FAST) as client:
        sid = await client.create_session()
        empty = await client.read(sid)
        assert empty.events == () and empty.tail_index == -1
        await client.send(sid, "hello")
        async for event in client.stream(sid):
            if isinstance(event, eve.Idle):
                break
        page = await client.read(sid, eve.Position(2))
        assert page.events[0].position.line == 2 and page.tail_index == page.events[-1].position.line
        last = await client.read(sid, eve.Position(-1))
        assert isinstance(last.events[-1], eve.Idle)
        assert {e.position.line for e in last.events} == {page.tail_index}
        assert (await client.compact(sid)).accepted
        assert (await client.end(sid)).status in ("reset", "accepted")
        with pytest.raises(eve.SessionExpired):
            await client.read(sid)
        with pytest.raises(eve.SessionNotActive):
            await client.send(sid, "too late")
        with pytest.raises(eve.SessionNotActive):  # eve 1.x: 409 (0.80 answered 200 no_active_session)
            await client.compact(sid)


async def test_client_refuses_to_reopen():
    client = _client(lambda r: httpx.Response(200, json={"ok": True}))
    async with client:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await client.__aenter__()


async def test_more_followed_streams_than_httpx_default_pool(fake_eve):
    """Each busy chat holds a stream for its whole turn: 120 at once must not exhaust the pool
    (httpx's default of 100 connections made the 101st fail with PoolTimeout)."""
    import asyncio

    async with eve.EveClient(fake_eve.url, token=fake_eve.token, retry=FAST) as client:
        sids = [await client.create_session() for _ in range(120)]

        async def follow(sid: str) -> str:
            async for event in client.stream(sid):
                if isinstance(event, eve.Idle):
                    return sid
            return ""

        readers = [asyncio.create_task(follow(sid)) for sid in sids]
        await asyncio.sleep(0.3)  # every stream is open and waiting
        for sid in sids:
            await client.send(sid, "hi [[delay=0.2]]")
        done = await asyncio.wait_for(asyncio.gather(*readers), 30)
    assert sorted(done) == sorted(sids)


def test_a_question_whose_options_are_not_a_list_parses_without_options() -> None:
    """F6: a question with a non-list `options` used to raise in the consumer (iterating an
    int), and a handler that raises wedged the chat on every replay of that event."""
    for odd in (5, 3.5, True, {"id": "x"}, "abc", None):
        [event] = _events(json.dumps({"type": "input.requested", "meta": {"id": "e1"}, "data": {
            "requests": [{"requestId": "r1", "prompt": "Go?", "options": odd}]}}))
        assert isinstance(event, eve.QuestionOpened)
        (question,) = event.questions
        assert question.id == "r1" and question.options == ()


async def test_a_compressed_stream_is_read_as_events():
    """Issue 11: a proxy that gzips the stream whatever was asked: the events still parse (the
    stream was read raw, so every line was garbage); and the client asks for no compression."""
    import gzip

    asked: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("accept-encoding"))
        body = "\n".join([_line("turn.started", 1), _line("session.waiting", 2)]) + "\n"
        return httpx.Response(200, content=gzip.compress(body.encode()),
                              headers={"content-encoding": "gzip", "content-type": "application/x-ndjson"})

    async with _client(handler) as client:
        page = await client.read("s1")
    assert [type(e) for e in page.events] == [eve.TurnBegan, eve.Idle]
    assert asked == ["identity"]


def test_session_gone_is_one_class_of_the_ends_of_a_session() -> None:
    gone = {eve.SessionNotFound, eve.SessionNotActive, eve.SessionExpired, eve.SessionStranded}
    assert all(issubclass(c, eve.SessionGone) for c in gone)
    assert not issubclass(eve.SessionNotReady, eve.SessionGone)  # still starting: retried, not replaced
    assert not issubclass(eve.EveUnauthorized, eve.SessionGone)


def test_every_error_the_bridge_defines_has_one_root() -> None:
    import inspect
    import pkgutil

    import bridge
    from bridge import errors
    from bridge.errors import BridgeError

    public: list[str] = []
    for info in pkgutil.walk_packages(bridge.__path__, "bridge."):
        if info.name.endswith("__main__"):
            continue
        module = __import__(info.name, fromlist=["_"])
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == info.name \
                    and not name.startswith("_"):
                public.append(name)
                assert issubclass(obj, BridgeError), name
                assert re.search(rf"\b{name}\b", errors.__doc__ or ""), name  # drawn in the tree
    assert len(public) > 10


async def test_a_callers_headers_ride_with_create_send_and_answers_never_in_the_body():
    """D2: the caller's own headers go with that request only, beside the bearer; the bodies stay
    what eve 1.x accepts (it answers 400 to an unknown field)."""
    seen: list[tuple[str, dict[str, str], dict[str, object]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, {k: v for k, v in request.headers.items() if k.startswith("x-iva-")},
                     json.loads(request.content or b"{}")))
        assert request.headers["authorization"] == "Bearer t"
        return httpx.Response(202, json={"ok": True, "sessionId": "s1", "deliveryId": "d1"})

    mine = {"x-iva-model": "a/b", "x-iva-turn": "rebuild"}
    async with _client(handler) as client:
        await client.create_session("hi", headers=mine)
        await client.send("s1", "again", headers={"x-iva-turn": "person"})
        await client.respond("s1", [eve.Answer("q1", option_id="yes")], headers={"x-iva-role": "owner"})
        await client.send("s1", "plain")
    assert [h for _, h, _ in seen] == [mine, {"x-iva-turn": "person"}, {"x-iva-role": "owner"}, {}]
    assert all(not any(k.startswith("x-iva") or k == "headers" for k in body) for _, _, body in seen)
