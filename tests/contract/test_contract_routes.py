"""eve_client against every eve: compact, cancel, clear and end routes behave as PROTOCOL.md (0.80) and
PROTOCOL-27.md (1.x) say, read through Iva's own events."""

from __future__ import annotations

import asyncio

import eve_client as eve

FAST = eve.RetryPolicy(attempts=8, deadline=20, initial_wait=0.05, max_wait=0.5, jitter=0.05)


async def _until_idle(client: eve.EveClient, sid: str, cursor: eve.Position = eve.START) -> list[eve.Event]:
    seen: list[eve.Event] = []
    try:
        async with asyncio.timeout(60):
            async for event in client.stream(sid, cursor):
                seen.append(event)
                if isinstance(event, eve.Idle):
                    return seen
    except TimeoutError:
        raise AssertionError(f"eve not idle from {cursor}; saw {[e.what for e in seen]}") from None
    return seen


async def test_turn_compact_and_end_routes(backend):
    """A turn, a manual compaction (202 before it runs), then end retires the session — one
    scenario in Iva's own events on either wire (PROTOCOL.md §2-§7, PROTOCOL-27.md §2-§8)."""
    async with eve.EveClient(backend.url, token=backend.token, retry=FAST) as client:
        assert (await client.health()).ok
        assert (await client.info()).context_window_tokens
        sid = await client.create_session()
        assert (await client.read(sid)).tail_index == -1  # a message-free session has no events
        delivery = await client.send(sid, "contract one [[tokens=5000]]", turn_policy="queue")
        assert delivery.delivery_id
        assert client.stream_version in eve.STREAM_VERSIONS
        turn = await _until_idle(client, sid)
        assert [e.position for e in turn] == sorted({e.position for e in turn})
        assert all(e.position.version == client.stream_version for e in turn)
        done = next(e for e in turn if isinstance(e, eve.TurnEnded))
        assert done.outcome == "completed" and delivery.delivery_id in done.deliveries
        began = next(e for e in turn if isinstance(e, eve.TurnBegan))
        assert began.turn_id and delivery.delivery_id in began.deliveries
        reply = next(e for e in turn if isinstance(e, eve.TextDone))
        assert reply.text == "echo: contract one" and reply.phase is eve.Phase.REPLY
        usage = next(e for e in turn if isinstance(e, eve.UsageRecorded))
        assert usage.usage.input_tokens == 5000 and not usage.context

        accepted = await client.compact(sid)
        assert accepted.accepted
        compaction = await _until_idle(client, sid, turn[-1].after)
        started = next(e for e in compaction if isinstance(e, eve.ContextStarted))
        settled = next(e for e in compaction if isinstance(e, eve.ContextSettled))
        assert (started.kind, settled.kind, settled.outcome) == ("compaction", "compaction", "completed")
        assert not started.in_turn and not settled.in_turn
        assert isinstance(compaction[-1], eve.Idle) and compaction.index(started) < compaction.index(settled)

        assert (await client.cancel(sid)).status == "accepted"  # idle session: still accepted
        page = await client.read(sid, eve.Position(-1))
        assert page.tail_index is not None and all(e.position.line == page.tail_index for e in page.events)

        assert (await client.end(sid, reason="contract")).status in ("reset", "accepted")
        # Right after the end the history may still be readable; a little later eve answers 410
        # session_expired (eve 1.x deletes it). The client maps that to SessionExpired.
        try:
            history = await client.read(sid)
        except eve.SessionExpired:
            pass
        else:
            assert not history.events or history.events[0].position.line == 0
        try:
            await client.send(sid, "too late")
        except eve.SessionNotActive:
            pass
        else:
            raise AssertionError("an ended session accepted a message")
        for control in (client.compact, client.clear):
            try:
                assert (await control(sid)).status == "no_active_session"  # 0.80
            except eve.SessionNotActive:
                pass  # 1.x: 409


async def test_unknown_session_is_not_found(backend):
    async with eve.EveClient(backend.url, token=backend.token, retry=FAST) as client:
        try:
            await client.read("wrun_NOSUCHSESSION000000")
        except eve.SessionNotFound:
            return
        raise AssertionError("expected SessionNotFound")


async def test_file_parts_are_accepted(backend):
    """T8 contract: a message of text + file parts is accepted; message.received lists the file, not its bytes."""
    async with eve.EveClient(backend.url, token=backend.token, retry=FAST) as client:
        sid = await client.create_session()
        await client.send(sid, [{"type": "text", "text": "read this"},
                                eve.file_part(b"hello file", "text/plain", "a.txt")],
                          turn_policy="queue")
        events = await _until_idle(client, sid)
        taken = next(e for e in events if isinstance(e, eve.InputTaken))
        assert taken.text.startswith("read this")
        assert next(e for e in events if isinstance(e, eve.TurnEnded)).outcome == "completed"
