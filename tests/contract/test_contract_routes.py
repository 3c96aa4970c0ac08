"""eve_client against both eves: compact, cancel, clear and reset routes behave as PROTOCOL.md says."""

from __future__ import annotations

import asyncio

import eve_client as eve

FAST = eve.RetryPolicy(attempts=8, deadline=20, initial_wait=0.05, max_wait=0.5, jitter=0.05)


async def _until_waiting(client: eve.EveClient, sid: str, start: int) -> list[eve.Event]:
    seen: list[eve.Event] = []
    try:
        async with asyncio.timeout(60):
            async for event in client.stream(sid, start):
                seen.append(event)
                if isinstance(event, eve.SessionWaiting):
                    return seen
    except TimeoutError:
        raise AssertionError(f"no session.waiting from index {start}; saw {[e.type for e in seen]}") from None
    return seen


async def test_turn_compact_and_reset_routes(backend):
    """§2-§7: a turn, a manual compaction (202 before it runs), then reset retires the session."""
    async with eve.EveClient(backend.url, token=backend.token, retry=FAST) as client:
        assert (await client.health()).ok
        assert (await client.info()).context_window_tokens
        sid = await client.create_session()
        assert (await client.read(sid)).tail_index == -1  # a message-free session has no events
        delivery = await client.send(sid, "contract one [[tokens=5000]]", turn_policy="queue")
        assert delivery.delivery_id
        turn = await _until_waiting(client, sid, 0)
        assert [e.index for e in turn] == list(range(len(turn)))
        done = next(e for e in turn if isinstance(e, eve.TurnCompleted))
        assert delivery.delivery_id in done.delivery_ids
        reply = next(e for e in turn if isinstance(e, eve.MessageCompleted))
        assert reply.message == "echo: contract one"
        step = next(e for e in turn if isinstance(e, eve.StepCompleted))
        assert step.usage and step.usage.input_tokens == 5000

        accepted = await client.compact(sid)
        assert accepted.accepted
        compaction = await _until_waiting(client, sid, turn[-1].index + 1)
        types = [e.type for e in compaction]
        assert types == ["compaction.requested", "compaction.completed", "session.waiting"]
        assert isinstance(compaction[0], eve.CompactionRequested)
        assert compaction[0].usage_input_tokens is not None

        assert (await client.cancel(sid)).status == "accepted"  # idle session: still accepted
        page = await client.read(sid, -1)
        assert page.events[-1].type == "session.waiting" and page.events[-1].index == page.tail_index

        result = await client.reset(sid, reason="contract")
        assert result.status == "reset" and result.previous_session_id == sid
        # Right after the reset the history is still readable (it may not even show
        # session.completed yet); a little later eve answers 410 session_expired (seen on the
        # real eve 0.80.1, not in PROTOCOL.md §7). The client maps that to SessionExpired.
        try:
            history = await client.read(sid, 0)
        except eve.SessionExpired:
            pass
        else:
            assert history.events[0].index == 0
        try:
            await client.send(sid, "too late")
        except eve.SessionNotActive:
            pass
        else:
            raise AssertionError("a reset session accepted a message")
        assert (await client.compact(sid)).status == "no_active_session"
        assert (await client.clear(sid)).status == "no_active_session"


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
        await client.send(sid, [{"type": "text", "text": "read this"}, eve.file_part(b"hello file", "text/plain", "a.txt")],
                          turn_policy="queue")
        events = await _until_waiting(client, sid, 0)
        received = next(e for e in events if isinstance(e, eve.MessageReceived))
        assert received.message.startswith("read this\n[file: a.txt (text/plain)]")
        parts = received.data["parts"]
        assert {"mediaType": "text/plain", "type": "file", "filename": "a.txt", "size": 10} in parts
        assert "data" not in str(parts)
