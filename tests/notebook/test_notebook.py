"""The notebook end to end through the bridge in process with its listener (tests/harness.py),
the fake eve and the fake Telegram (SPEC §7: N1-N10). The fake eve calls the bridge's MCP server
the way eve does (PROTOCOL.md §11); the same scenarios run against the real eve in
tests/process/test_notebook_real.py."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.conftest import FRIEND, OWNER
from tests.daemons import API_TOKEN, api, idle, notes_in_db

GROUP = -1001


async def mcp(d, session: str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(d.api_url + "/mcp", json={"jsonrpc": "2.0", "id": 7, "method": method,
                                                       "params": params or {}},
                             headers={"x-eve-session-id": session}) as response:
            return await response.json()


def contexts(fake_eve) -> list[Any]:
    """clientContext of every send, in order (None when there was none)."""
    return [b.get("clientContext") for b in fake_eve.sends()]


async def test_a_saved_note_is_in_the_database_and_in_the_next_owner_turn(tg, fake_eve, nb_in_process):
    """N3, N6: the model saves with a tool call mid-turn; the next turn's [state] block quotes it."""
    await tg.message('remember [[mcp=chat_note_save {"name": "shop", "description": "shopping list", '
                     '"body": "milk, eggs"}]]', user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    result = fake_eve.mcp_results[0]
    # The notebook's tools (no read tool in inline mode), then the reminder tools on the same connection (W9).
    assert result["listed"] == ["chat_note_save", "chat_note_delete", "chat_note_pin", "chat_note_unpin",
                                "chat_reminder_set", "chat_reminder_list", "chat_reminder_cancel"]
    assert not result["is_error"] and json.loads(result["output"])["saved"] == "shop"
    assert notes_in_db(nb_in_process, str(OWNER))["shop"]["body"] == "milk, eggs"
    await idle(tg, nb_in_process)
    await tg.message("what do I buy?", user_id=OWNER)
    await tg.wait_texts(3, timeout=30)
    first, second = contexts(fake_eve)
    assert first.startswith("[state]\n[notebook] empty.") and "never overrides your standing rules" in first
    assert "## shop | shopping list\nmilk, eggs" in second and "chat_note_read" not in second
    # The tool call itself is not a Telegram message (N3: quiet); the write is told once (seed 000).
    assert tg.texts() == ["echo: remember", "📝 Notebook: shop (new)", "echo: what do I buy?"]


async def test_in_inline_mode_the_read_tool_is_unknown_to_list_and_call(tg, fake_eve, nb_in_process):
    """N2/N3: no read tool exists in inline mode, neither in tools/list nor as a direct call."""
    await tg.message('x [[mcp=chat_note_read {"name": "shop"}]] [[delay=2]]', user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    assert fake_eve.mcp_results[0]["error"].endswith('has no tool named "chat_note_read".')
    session = nb_in_process.chat(str(OWNER))["eve_session"]
    await idle(tg, nb_in_process)
    fake_eve.stuck = True  # an owner turn that stays running while we call (no race with its end)
    await tg.message("slow", user_id=OWNER)
    await tg.wait_for(lambda: nb_in_process.chat(str(OWNER))["status"] == "busy", 20, "busy")
    answer = await mcp(nb_in_process, session, "tools/call", {"name": "chat_note_read", "arguments": {
        "name": "shop", "eve_session_id": session}})
    assert answer["error"]["code"] == -32602 and "Unknown tool" in answer["error"]["message"]


async def test_tools_are_refused_outside_an_owner_turn_and_for_unknown_sessions(tg, fake_eve, nb_in_process):
    """N1: master_only (the turn, not the author) and lead_only (a session we do not know)."""
    await tg.message("hi", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process)
    session = nb_in_process.chat(str(OWNER))["eve_session"]
    save = {"name": "chat_note_save", "arguments": {"name": "a", "description": "d", "body": "b"}}
    for who in (session, "wrun_SUBAGENT_OR_UNKNOWN"):  # idle chat; a session no chat owns
        assert (await mcp(nb_in_process, who, "tools/list"))["result"]["tools"] == []
        refused = (await mcp(nb_in_process, who, "tools/call", save))["result"]
        assert refused["isError"] and "only in the owner's own turns" in refused["content"][0]["text"]
    # A header and a provided argument that disagree are refused too.
    mismatch = {"name": "chat_note_save", "arguments": {**save["arguments"], "eve_session_id": "wrun_OTHER"}}
    assert (await mcp(nb_in_process, session, "tools/call", mismatch))["result"]["isError"]
    assert notes_in_db(nb_in_process, str(OWNER)) == {}


async def test_a_friends_turn_carries_no_block_and_its_tool_calls_are_refused(tg, fake_eve, nb_in_process):
    """N1/N6 in a group: the owner's turn has the block; an allowed user's turn has none, and the
    model cannot write the notebook in it; turns never mix the two."""
    save = '[[mcp=chat_note_save {"name": "x", "description": "d", "body": "from a friend turn"}]]'
    await tg.message("owner first [[delay=1.5]]", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                     reply_to_bot=True)
    await tg.wait_for(lambda: (c := nb_in_process.chat(str(GROUP))) and c["status"] == "busy", 20, "busy")
    await tg.message(f"friend {save}", user_id=FRIEND, chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    await tg.message("owner again", user_id=OWNER, chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    await tg.wait_texts(3, timeout=40)
    ctx = contexts(fake_eve)
    assert len(ctx) == 3  # owner | friend | owner: three turns, never batched across
    assert ctx[0].startswith("[state]") and ctx[1] is None and ctx[2].startswith("[state]")
    assert fake_eve.mcp_results[0]["listed"] == []
    assert notes_in_db(nb_in_process, str(GROUP)) == {}


async def test_index_mode_shows_names_offers_read_and_guards_blind_overwrites(tg, fake_eve, nb_in_process):
    """N2, N5: 13 notes → index mode at the next turn entry; an unread note cannot be overwritten."""
    await tg.message("hello", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process)
    for i in range(13):
        status, _ = await api(nb_in_process, "PUT", f"/v1/chats/{OWNER}/notes/n{i}",
                              {"body": f"body {i}", "description": f"note {i}"})
        assert status == 201
    await tg.message('go [[mcp=chat_note_save {"name": "n1", "body": "blind"}]] '
                     '[[mcp=chat_note_read {"name": "n1"}]] [[mcp=chat_note_save {"name": "n1", "body": "seen"}]]',
                     user_id=OWNER)
    await tg.wait_texts(2, timeout=30)
    blind, read, seen = fake_eve.mcp_results[-3:]
    assert "chat_note_read" in blind["listed"]
    assert blind["is_error"] and "notebook__chat_note_read first" in blind["output"]
    assert json.loads(read["output"])["body"] == "body 1"
    assert not seen["is_error"]
    assert notes_in_db(nb_in_process, str(OWNER))["n1"]["body"] == "seen"
    assert nb_in_process.chat(str(OWNER))["notes_mode"] == "index"
    block = contexts(fake_eve)[-1]
    assert "- n5 — note 5" in block and "body 5" not in block



async def _turn_context(tg, fake_eve, bridge, text: str) -> str:
    """One message answered and the chat idle again: the context block eve got with it."""
    before = len(fake_eve.sends())
    await tg.message(text, user_id=OWNER)
    await tg.wait_for(lambda: len(fake_eve.sends()) > before, 30, "send")
    await idle(tg, bridge)
    return fake_eve.sends()[-1]["clientContext"]

async def test_the_window_line_wrap_up_and_nudge_each_come_when_they_should(tg, fake_eve, nb_in_process):
    """N6 on the bridge's own measurement and threshold (window 200 000 → threshold 110 000)."""
    async def turn(text: str) -> str:
        return await _turn_context(tg, fake_eve, nb_in_process, text)

    assert "[window]" not in await turn("one [[tokens=50000]]")
    assert "[window]" not in await turn("two [[tokens=70000]]")  # the block went with 50 000
    assert "70 000 of 110 000" in await turn("three [[tokens=104000]]")
    assert "Only 6 000 tokens are left" in await turn("four [[tokens=104500]]")  # once per window
    assert "104 500 of 110 000" in await turn("five [[tokens=120000]]")
    # 120 000 ≥ threshold: parking compacted after "five"; the next block nudges, once.
    await tg.wait_for(lambda: nb_in_process.chat(str(OWNER))["compactions"] == 1, 30, "compaction")
    assert "just compacted" in await turn("six [[tokens=20000]]")
    assert "[window]" not in await turn("seven")
    chat = nb_in_process.chat(str(OWNER))
    assert chat["notes_nudged_upto"] == 1 and chat["wrap_nudged_upto"] == 0


async def test_notes_survive_new_and_new_says_how_many(tg, fake_eve, nb_in_process):
    """N8: /new keeps the notebook and says how many notes it kept."""
    await tg.message('a [[mcp=chat_note_save {"name": "keep", "description": "k", "body": "kept"}]]', user_id=OWNER)
    await tg.wait_texts(2, timeout=30)  # the answer and its 📝 line
    await idle(tg, nb_in_process)
    await tg.message("/new", user_id=OWNER)
    await tg.wait_texts(3, timeout=30)
    assert tg.texts()[-1] == "New conversation started. The notebook kept its 1 note(s)."
    await tg.message("after", user_id=OWNER)
    await tg.wait_texts(4, timeout=30)
    assert "## keep | k\nkept" in contexts(fake_eve)[-1]
    assert len(fake_eve.sessions) == 2


async def test_owner_api_lists_writes_deletes_marks_seen_and_reports_spend(tg, fake_eve, nb_in_process):
    """N9: the owner's API, with JSON errors."""
    await tg.message("hello", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process)
    base = f"/v1/chats/{OWNER}"
    assert (await api(nb_in_process, "GET", base + "/notes", token=None))[0] == 401
    assert (await api(nb_in_process, "GET", base + "/notes", token="wrong"))[0] == 401
    status, body = await api(nb_in_process, "GET", "/v1/chats/424242/notes")
    assert status == 404 and body["code"] == "no_chat"
    status, body = await api(nb_in_process, "PUT", base + "/notes/BAD NAME", {"body": "x", "description": "d"})
    assert status == 422 and "slug" in body["error"]
    status, body = await api(nb_in_process, "PUT", base + "/notes/long", {"body": "x" * 2001, "description": "d"})
    assert status == 422 and "Split it into two notes" in body["error"]
    assert (await api(nb_in_process, "PUT", base + "/notes/bad", raw=b"{not json"))[0] == 400
    assert (await api(nb_in_process, "PUT", base + "/notes/goal", {"body": "v1", "description": "goal"}))[0] == 201
    status, note = await api(nb_in_process, "PUT", base + "/notes/goal", {"body": "v2", "pinned": True})
    assert status == 200 and note["prev_body"] == "v1" and note["pinned"]
    status, listing = await api(nb_in_process, "GET", base + "/notes")
    assert status == 200 and listing["notes"][0]["body"] == "v2" and listing["notes"][0]["prev_body"] == "v1"
    assert listing["notes"][0]["new"] and listing["seen_at"] is None
    status, seen = await api(nb_in_process, "POST", base + "/notes/seen")
    assert status == 200 and seen["seen_at"]
    assert not (await api(nb_in_process, "GET", base + "/notes"))[1]["notes"][0]["new"]
    status, body = await api(nb_in_process, "POST", base + "/notes/restore")
    assert status == 404 and body["code"] == "no_archive"
    assert (await api(nb_in_process, "DELETE", base + "/notes/goal"))[0] == 200
    assert (await api(nb_in_process, "DELETE", base + "/notes/goal"))[0] == 404
    status, spend = await api(nb_in_process, "GET", base + "/spend")
    assert status == 200 and spend["spend"]["turns"]["calls"] == 1 and spend["spend"]["turns"]["input_tokens"] > 0


async def test_the_api_is_off_without_a_token(tg, in_process_factory, fake_eve):
    d = in_process_factory(listen=True, IVA_NOTES_ENABLED="1")  # no IVA_API_TOKEN; the daemon's default: notes on
    await d.start()
    status, body = await api(d, "GET", f"/v1/chats/{OWNER}/notes", token="anything")
    assert status == 403 and "IVA_API_TOKEN" in body["error"]


async def test_notes_command_lists_changes_since_the_last_look_and_shows_a_diff(tg, fake_eve, nb_in_process):
    """N9 in Telegram: /notes (owner only) with new/changed marks; /notes <name> with the diff."""
    await tg.message("hello", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process)
    base = f"/v1/chats/{OWNER}/notes"
    await api(nb_in_process, "PUT", base + "/shop", {"body": "milk\neggs", "description": "shopping list"})
    await tg.message("/notes", user_id=OWNER)
    await tg.wait_texts(2, timeout=20)
    assert "1 new, 0 changed" in tg.texts()[-1] and "🆕 shop — shopping list" in tg.texts()[-1]
    await api(nb_in_process, "PUT", base + "/shop", {"body": "milk\nbread"})
    await tg.message("/notes", user_id=OWNER)
    await tg.wait_texts(3, timeout=20)
    assert "0 new, 1 changed" in tg.texts()[-1] and "✏️ shop" in tg.texts()[-1]
    await tg.message("/notes shop", user_id=OWNER)
    await tg.wait_texts(4, timeout=20)
    shown = tg.texts()[-1]
    assert "milk\nbread" in shown and "- eggs" in shown and "+ bread" in shown
    await tg.message("/notes", user_id=FRIEND)
    await tg.wait_texts(1, chat_id=FRIEND, timeout=20)
    assert tg.texts(FRIEND) == ["Only the bot's owner can look into the notebook."]


async def test_notes_asked_in_a_group_go_to_the_owner_in_private(tg, fake_eve, nb_in_process):
    """N9, S7: a group's notebook is not posted in the group; the owner sees it there alone (an
    ephemeral message) or, where Telegram will not show one, gets it in private, or is told to open
    a private chat first."""
    def public() -> list[str]:
        return [p["text"] for p in tg.sent(GROUP) if not p.get("ephemeral_message_parameters")]

    await tg.message("hello", user_id=OWNER, chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    await tg.wait_texts(1, chat_id=GROUP, timeout=30)
    await idle(tg, nb_in_process, str(GROUP))
    await api(nb_in_process, "PUT", f"/v1/chats/{GROUP}/notes/secret", {"body": "the plan", "description": "private"})
    await tg.message("/notes secret", user_id=OWNER, chat_id=GROUP, chat_type="supergroup")
    await tg.wait_texts(2, chat_id=GROUP, timeout=20)
    shown = tg.sent(GROUP)[-1]
    assert shown["ephemeral_message_parameters"]["receiver_user_id"] == OWNER and "the plan" in shown["text"]
    tg.refuse_ephemeral = "Bad Request: ephemeral messages are not allowed in this chat"
    await tg.message("/notes secret", user_id=OWNER, chat_id=GROUP, chat_type="supergroup")
    await tg.wait_texts(1, chat_id=OWNER, timeout=20)
    assert "the plan" in tg.texts(OWNER)[0]
    await tg.wait_for(lambda: len(public()) == 2, 20, "the note in the group")
    assert public()[-1] == "I've sent you this chat's notebook in private."
    assert not any("the plan" in text for text in public())
    # the try in the group, then private
    tg.fail("sendMessage", 403, "Forbidden: bot can't initiate conversation with a user", times=2)
    await tg.message("/notes", user_id=OWNER, chat_id=GROUP, chat_type="supergroup")
    await tg.wait_for(lambda: len(public()) == 3, 20, "the note in the group")
    assert public()[-1].startswith("The notebook is only shown in private")


async def test_leaving_a_chat_deletes_its_notes(tg, fake_eve, nb_in_process):
    """N8: the bot removed from a group: the group's notes go with it."""
    await tg.message("hello", user_id=OWNER, chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process, str(GROUP))
    await api(nb_in_process, "PUT", f"/v1/chats/{GROUP}/notes/g", {"body": "group fact", "description": "d"})
    assert notes_in_db(nb_in_process, str(GROUP))
    await tg.add_update({"my_chat_member": {
        "chat": {"id": GROUP, "type": "supergroup", "title": "Group"},
        "from": {"id": OWNER, "is_bot": False, "first_name": "Ann"}, "date": 1,
        "old_chat_member": {"status": "member", "user": {"id": 42, "is_bot": True, "first_name": "Iva"}},
        "new_chat_member": {"status": "left", "user": {"id": 42, "is_bot": True, "first_name": "Iva"}},
    }})
    await tg.wait_for(lambda: not notes_in_db(nb_in_process, str(GROUP)), 20, "notes deleted")


def _rebuilt(text: str) -> str | None:
    if not text.startswith("NOTEBOOK REBUILD"):
        return None
    return "## goal | the goal\nship it\n\n## all-facts | merged facts\nfacts 0-40, merged"


async def test_a_big_notebook_is_rebuilt_after_the_reply_with_the_archive_first(tg, fake_eve, nb_in_process):
    """N7: over 40 notes → after the turn (the reply is out first) a one-shot rebuild through a
    throwaway eve session; the old notebook goes whole to the archive; restore brings it back."""
    await tg.message("hello", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process)
    base = f"/v1/chats/{OWNER}/notes"
    await api(nb_in_process, "PUT", base + "/goal", {"body": "ship it", "description": "the goal", "pinned": True})
    for i in range(41):
        await api(nb_in_process, "PUT", f"{base}/fact-{i}", {"body": f"fact {i} " * 20, "description": f"fact {i}"})
    fake_eve.reply_for = _rebuilt
    await tg.message("turn that triggers it", user_id=OWNER)
    await tg.wait_for(lambda: len(notes_in_db(nb_in_process, str(OWNER))) == 2, 30, "the rebuilt notebook")
    replied_at = next(c.at for c in tg.calls if c.method == "sendMessage" and "triggers" in c.params.get("text", ""))
    rebuild_at, prompt = fake_eve.creates[-1]
    assert prompt.startswith("NOTEBOOK REBUILD") and "## fact-40 | fact 40" in prompt and "pinned" in prompt
    assert replied_at <= rebuild_at  # never in front of the reply
    notes = notes_in_db(nb_in_process, str(OWNER))
    assert notes["goal"]["pinned"] == 1 and notes["goal"]["body"] == "ship it"
    assert notes["all-facts"]["prev_body"] is None
    rebuild_session = next(s for s in fake_eve.sessions.values()
                           if s.id != nb_in_process.chat(str(OWNER))["eve_session"])
    await tg.wait_for(lambda: not rebuild_session.active, 20, "the throwaway session reset")
    status, spend = await api(nb_in_process, "GET", f"/v1/chats/{OWNER}/spend")
    assert spend["spend"]["notes"]["calls"] == 1
    status, listing = await api(nb_in_process, "GET", base)
    assert listing["archive"]["notes"] == 42
    status, restored = await api(nb_in_process, "POST", base + "/restore")
    assert status == 200 and restored["restored"] == 42
    assert len(notes_in_db(nb_in_process, str(OWNER))) == 42
    # A restore holds the rebuild off until the notebook changes again (it is the owner's choice):
    rebuilds = len(fake_eve.creates)
    await tg.message("a turn after the restore", user_id=OWNER)
    await tg.wait_for(lambda: any("after the restore" in text for text in tg.texts()), 30, "the answer")
    await nb_in_process.settled()
    assert len(notes_in_db(nb_in_process, str(OWNER))) == 42 and len(fake_eve.creates) == rebuilds
    await api(nb_in_process, "PUT", base + "/fact-0", {"body": "fact zero, changed"})
    await tg.message("a turn after a change", user_id=OWNER)
    await tg.wait_for(lambda: len(notes_in_db(nb_in_process, str(OWNER))) == 2, 30, "rebuilt again after the change")


async def test_a_bad_rebuild_keeps_the_old_notebook_retries_once_and_does_not_loop(tg, fake_eve, nb_in_process):
    """N7: an answer that fails the checks keeps the old notebook; one stricter retry; then no more
    attempts until the notebook changes."""
    with nb_in_process.catching_logs():  # the daemon's log, caught in process
        await tg.message("hello", user_id=OWNER)
        await tg.wait_texts(1, timeout=30)
        await idle(tg, nb_in_process)
        base = f"/v1/chats/{OWNER}/notes"
        for i in range(41):
            await api(nb_in_process, "PUT", f"{base}/fact-{i}", {"body": f"fact {i}", "description": f"fact {i}"})
        fake_eve.reply_for = lambda text: "I'd rather not." if text.startswith("NOTEBOOK REBUILD") else None
        await tg.message("trigger", user_id=OWNER)
        await tg.wait_for(lambda: nb_in_process.chat(str(OWNER))["notes_rebuild_failed"] is not None, 30, "gave up")
        prompts = [p for _, p in fake_eve.creates]
        assert len(prompts) == 2 and "Be strict" in prompts[1] and "4000 characters" in prompts[1]
        assert len(notes_in_db(nb_in_process, str(OWNER))) == 41
        await idle(tg, nb_in_process)
        await tg.message("again", user_id=OWNER)
        await tg.wait_texts(3, timeout=30)
        # Settled includes a round of the daemon's loop after the turn ended, so the rebuild check
        # spawned at its end has run: a second rebuild would be logged as started by now.
        await nb_in_process.settled()
        assert len(fake_eve.creates) == 2  # unchanged notebook: not tried again
    assert nb_in_process.logs().count('"notes_rebuild_started"') == 1
    assert nb_in_process.logs().count('"notes_rebuild_gave_up_old_notebook_kept"') == 1


async def test_disabled_notebook_registers_no_tools_sends_no_block_touches_no_table(tg, in_process_factory, fake_eve):
    """N8: IVA_NOTES_ENABLED=0."""
    d = in_process_factory(listen=True, IVA_API_TOKEN=API_TOKEN, IVA_NOTES_ENABLED="0")
    fake_eve.mcp_url = d.api_url + "/mcp"
    await d.start()
    await tg.message('hi [[mcp=chat_note_save {"name": "a", "description": "d", "body": "b"}]]', user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    assert contexts(fake_eve) == [None]
    assert "error" in fake_eve.mcp_results[0]  # no MCP server at all
    status, body = await api(d, "PUT", f"/v1/chats/{OWNER}/notes/a", {"body": "x", "description": "d"})
    assert status == 404 and body["code"] == "notes_off"
    await tg.message("/notes", user_id=OWNER)
    await tg.wait_texts(2, timeout=20)
    assert tg.texts()[-1] == "The notebook is turned off on this bot."
    with d.db() as conn:
        assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM notes_seen").fetchone()[0] == 0
        assert tuple(conn.execute("SELECT notes_version, notes_mode FROM chats").fetchone()) == (0, "inline")


async def test_every_write_of_a_turn_is_told_with_its_answer_and_marked_by_notes(tg, fake_eve, nb_in_process):
    """seed 000: every write visible — the answer comes with 📝 and the names; /notes marks what the
    last turn changed; a turn that changes nothing leaves nothing marked."""
    await tg.message('remember [[mcp=chat_note_save {"name": "shop", "description": "shopping list", '
                     '"body": "milk"}]] [[mcp=chat_note_save {"name": "plan", "description": "the plan", '
                     '"body": "a"}]]', user_id=OWNER)
    await tg.wait_texts(2, timeout=30)
    assert tg.texts() == ["echo: remember", "📝 Notebook: shop (new), plan (new)"]
    await idle(tg, nb_in_process)
    await tg.message('again [[mcp=chat_note_save {"name": "plan", "body": "b"}]] '
                     '[[mcp=chat_note_pin {"name": "plan"}]] [[mcp=chat_note_delete {"name": "shop"}]]',
                     user_id=OWNER)
    await tg.wait_texts(4, timeout=30)
    assert tg.texts()[2:] == ["echo: again", "📝 Notebook: plan (pinned), shop (deleted)"]
    await idle(tg, nb_in_process)
    await tg.message("/notes", user_id=OWNER)
    await tg.wait_texts(5, timeout=20)
    listing = tg.texts()[-1]
    assert "plan 📌 — the plan 📝" in listing and "📝 The last answer changed: plan (pinned), shop (deleted)" in listing
    status, body = await api(nb_in_process, "GET", f"/v1/chats/{OWNER}/notes")
    assert status == 200 and body["last_turn"] == [{"name": "plan", "change": "pinned"},
                                                   {"name": "shop", "change": "deleted"}]
    await tg.message("nothing written", user_id=OWNER)
    await tg.wait_texts(6, timeout=30)
    await idle(tg, nb_in_process)
    await tg.message("/notes", user_id=OWNER)
    await tg.wait_texts(7, timeout=20)
    assert "📝" not in tg.texts()[-1].replace("📓", "")


async def test_a_groups_owner_turn_tells_its_writes_in_the_owners_private_chat(tg, fake_eve, nb_in_process):
    """seed 000: the 📝 line goes where the owner reads it — never into the group."""
    await tg.message('hi [[mcp=chat_note_save {"name": "secret", "description": "x", "body": "the plan"}]]',
                     user_id=OWNER, chat_id=GROUP, chat_type="supergroup", reply_to_bot=True)
    await tg.wait_texts(1, chat_id=OWNER, timeout=30)
    assert tg.texts(OWNER) == [f"📝 Notebook of chat {GROUP}: secret (new)"]
    await idle(tg, nb_in_process, str(GROUP))
    assert len(tg.texts(GROUP)) == 1 and not any("📝" in text for text in tg.texts(GROUP))


async def test_the_notes_listing_has_an_etag_and_if_none_match_gives_304(tg, fake_eve, nb_in_process):
    """seed 000: API clients re-read only after a change (ETag, If-None-Match → 304)."""
    await tg.message("hello", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await idle(tg, nb_in_process)
    url = f"{nb_in_process.api_url}/v1/chats/{OWNER}/notes"
    auth = {"authorization": f"Bearer {API_TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.get(url) as r:
            etag = r.headers["ETag"]
            assert r.status == 200 and etag.startswith('"')
        async with http.get(url, headers={"If-None-Match": etag}) as r:
            assert r.status == 304 and r.headers["ETag"] == etag and await r.read() == b""
        await api(nb_in_process, "PUT", f"/v1/chats/{OWNER}/notes/shop", {"body": "milk", "description": "list"})
        async with http.get(url, headers={"If-None-Match": etag}) as r:
            assert r.status == 200 and r.headers["ETag"] != etag and (await r.json())["notes"][0]["name"] == "shop"


async def test_new_rearms_the_wrap_up_and_voids_the_nudge_of_a_summary_it_threw_away(tg, fake_eve, nb_in_process):
    """N6, seed 000: the wrap-up invitation is once per window — a /new opens a new one; the "just
    compacted" nudge never speaks of a summary that /new threw away."""
    async def turn(text: str) -> str:
        return await _turn_context(tg, fake_eve, nb_in_process, text)

    async def new() -> None:
        before = len(tg.texts())
        await tg.message("/new", user_id=OWNER)
        await tg.wait_texts(before + 1, timeout=30)
        await idle(tg, nb_in_process)

    await turn("a [[tokens=104000]]")
    assert "Only 6 000 tokens are left" in await turn("b [[tokens=104500]]")
    await new()
    await turn("c [[tokens=104000]]")
    assert "Only 6 000 tokens are left" in await turn("d")  # a new window: invited again
    await turn("e [[tokens=120000]]")
    await tg.wait_for(lambda: nb_in_process.chat(str(OWNER))["compactions"] == 1, 30, "compaction")
    await idle(tg, nb_in_process)
    await new()
    assert "just compacted" not in (await turn("f") or "")
