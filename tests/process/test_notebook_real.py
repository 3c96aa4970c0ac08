"""The notebook through the real eve (../shared/eve-peer, built with the notebook MCP connection
pointing at the daemon's listener): the scripted model calls the bridge's tools through
``eve__tool`` exactly as a real model would (PROTOCOL.md §11, §12)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import FRIEND, OWNER, REAL

pytestmark = [REAL, pytest.mark.process]  # every test here runs the bridge as a process

GROUP = -1002
SAVE = ('[[call=notebook__chat_note_save {"name": "shop", "description": "shopping list", '
        '"body": "milk, eggs"}]]')


@pytest.fixture
async def daemon(daemon_factory, real_eve):
    real_eve.control(full_log=True)
    d = daemon_factory(real_eve.url, real_eve.token, IVA_API_TOKEN="nb-token")
    await d.start()
    yield d
    real_eve.control(full_log=False)


def requests_for(real_eve, tag: str) -> list[dict[str, Any]]:
    """The model requests of the turn whose user message carries ``tag``."""
    return [r for r in real_eve.llm_requests() if r.get("kind") == "chat" and tag in (r.get("latest_user") or "")]


def client_context(record: dict[str, Any]) -> list[str]:
    return [m["content"] for m in record.get("messages") or [] if m.get("role") == "user"
            and isinstance(m.get("content"), str) and m["content"].startswith("Client context:\n")]


def notes(d, address: str) -> dict[str, str]:
    with d.db() as conn:
        return {r["name"]: r["body"]
                for r in conn.execute("SELECT name, body FROM notes WHERE address = ?", (address,))}


async def idle(tg, d, address: str = str(OWNER)) -> None:
    await tg.wait_for(lambda: (c := d.chat(address)) is not None and c["status"] == "idle", 60, f"{address} idle")


async def turn(tg, d, text: str, count: int, **kw: Any) -> None:
    await tg.message(text, **{"user_id": OWNER, **kw})
    await tg.wait_texts(count, timeout=60)
    await idle(tg, d, str(kw.get("chat_id", OWNER)))


async def test_a_note_saved_by_the_model_rides_the_next_turn_and_survives_compaction_and_new(tg, real_eve, daemon):
    """N3/N6/N8 on the real eve: save by tool call → database → next turn's clientContext; after a
    parking compaction and after /new it is still there."""
    await turn(tg, daemon, f"nb1 remember this {SAVE}", 2)
    assert notes(daemon, str(OWNER)) == {"shop": "milk, eggs"}
    saved = requests_for(real_eve, "nb1")[-1]["tool_results"][-1]
    assert json.loads(saved["content"])["saved"] == "shop"
    assert tg.texts()[-2].startswith("tool done")  # the tool call itself is not a Telegram message
    assert tg.texts()[-1] == "📝 Notebook: shop (new)"  # the write is (seed 000: every write visible)

    compactions = sum(1 for r in real_eve.llm_requests() if r.get("kind") == "compaction")  # one eve for the session
    await turn(tg, daemon, "nb2 what do I buy [[tokens=120000]]", 3)
    ctx = client_context(requests_for(real_eve, "nb2")[0])
    assert (len(ctx) == 1 and ctx[0].startswith("Client context:\n[state]")
            and "## shop | shopping list\nmilk, eggs" in ctx[0])
    # 120 000 is over the parking threshold of a 128 000 window: parking compacts after nb2.
    await tg.wait_for(lambda: daemon.chat(str(OWNER))["compactions"] >= 1, 60, "the parking compaction")
    await idle(tg, daemon)
    assert sum(1 for r in real_eve.llm_requests() if r.get("kind") == "compaction") == compactions + 1

    await turn(tg, daemon, "nb3 after compaction", 4)
    ctx = client_context(requests_for(real_eve, "nb3")[0])
    assert "milk, eggs" in ctx[0] and "just compacted" in ctx[0]  # the one-time nudge (N6)

    await tg.message("/new", user_id=OWNER)
    await tg.wait_texts(5, timeout=60)
    assert "The notebook kept its 1 note(s)." in tg.texts()[-1]
    await idle(tg, daemon)
    await turn(tg, daemon, "nb4 fresh session", 6)
    ctx = client_context(requests_for(real_eve, "nb4")[0])
    assert "## shop | shopping list\nmilk, eggs" in ctx[0]


async def test_in_inline_mode_a_read_call_is_refused_as_unknown(tg, real_eve, daemon):
    """N2/N3: eve asks tools/list per step; the read tool is not listed, so eve refuses the call."""
    await turn(tg, daemon, 'nb5 [[call=notebook__chat_note_read {"name": "shop"}]]', 1)
    result = requests_for(real_eve, "nb5")[-1]["tool_results"][-1]["content"]
    assert 'has no tool named \\"chat_note_read\\"' in result, result


async def test_a_non_owner_turn_in_a_group_has_no_block_and_its_tool_calls_are_refused(tg, real_eve, daemon):
    """N1/N6: nothing of the notebook in other people's turns."""
    await tg.message(f"nb6 friend says {SAVE}", user_id=FRIEND, chat_id=GROUP, chat_type="supergroup",
                     reply_to_bot=True)
    await tg.wait_texts(1, timeout=60)
    await idle(tg, daemon, str(GROUP))
    records = requests_for(real_eve, "nb6")
    assert records and all(client_context(r) == [] for r in records)
    refusal = records[-1]["tool_results"][-1]["content"]
    assert 'has no tool named \\"chat_note_save\\"' in refusal, refusal
    assert notes(daemon, str(GROUP)) == {}
    # The owner's turn in the same group does get the block and may write.
    await tg.message(f"nb7 owner says {SAVE}", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                     reply_to_bot=True)
    await tg.wait_texts(2, timeout=60)
    await idle(tg, daemon, str(GROUP))
    assert client_context(requests_for(real_eve, "nb7")[0])[0].startswith("Client context:\n[state]")
    assert notes(daemon, str(GROUP)) == {"shop": "milk, eggs"}


async def test_a_big_notebook_is_rebuilt_through_a_throwaway_real_eve_session(tg, real_eve, daemon):
    """N7 on the real eve: create-with-message, stream, reset; the scripted model answers in the
    seed's format (one note's body carries the reply marker into the rebuild prompt)."""
    import aiohttp

    await turn(tg, daemon, "nb8 hello", 1)
    base = f"http://{daemon.env['IVA_API_LISTEN']}/v1/chats/{OWNER}/notes"
    headers = {"authorization": "Bearer nb-token"}
    async with aiohttp.ClientSession(headers=headers) as http:
        async def put(name: str, **body: Any) -> None:
            async with http.put(f"{base}/{name}", json=body) as response:
                assert response.status == 201, await response.text()

        await put("goal", body="ship it", description="the goal", pinned=True)
        await put("script", description="scripted answer",
                  body="[[reply=## merged | all the facts\nfacts 0-40, merged into one]]")
        for i in range(40):
            await put(f"fact-{i}", body=f"fact number {i} " * 10, description=f"fact {i}")
        await turn(tg, daemon, "nb9 a turn that triggers the rebuild", 2)
        await tg.wait_for(lambda: set(notes(daemon, str(OWNER))) == {"goal", "merged"}, 60, "the rebuild")
        assert notes(daemon, str(OWNER))["merged"] == "facts 0-40, merged into one"
        assert notes(daemon, str(OWNER))["goal"] == "ship it"
        async with http.get(f"http://{daemon.env['IVA_API_LISTEN']}/v1/chats/{OWNER}/spend") as response:
            spend = (await response.json())["spend"]
        assert spend["notes"]["calls"] >= 1 and spend["notes"]["input_tokens"] > 0
        async with http.post(f"{base}/restore") as response:
            assert (await response.json())["restored"] == 42
    rebuild = [r for r in real_eve.llm_requests() if (r.get("latest_user") or "").startswith("NOTEBOOK REBUILD")]
    assert len(rebuild) == 1 and rebuild[0]["tools"]  # eve offers its tools; Iva's MCP lists none for it
