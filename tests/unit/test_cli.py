"""``iva check``, ``iva status`` and ``iva restore-notes`` in process: ``bridge.cli.main`` called
directly (``check`` in a thread, since it runs its own event loop, so the fakes on the test's loop
keep answering), the environment through monkeypatch, the output through capsys (issue
acceptance, SPEC §2). What needs the bridge as a process (``iva run``'s exits) stays in
tests/process/test_cli.py."""

from __future__ import annotations

import pytest

from bridge.cli import main
from bridge.storage.store import read_status
from tests.conftest import OWNER
from tests.daemons import check_env, iva_check_in_process
from tests.fakes.telegram import TOKEN
from tests.harness import Harness


async def test_check_passes_when_all_is_well(tg, fake_eve, monkeypatch, capsys):
    code, out = await iva_check_in_process(monkeypatch, capsys, check_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0, out
    assert "telegram: @iva_test_bot" in out and "window 128000" in out


async def test_check_names_a_wrong_telegram_token(tg, fake_eve, monkeypatch, capsys):
    code, out = await iva_check_in_process(monkeypatch, capsys,
                                           check_env(tg, fake_eve.url, fake_eve.token,
                                                     IVA_TELEGRAM_TOKEN="999:WRONGwrongWRONGwrongWRONG"))
    assert code != 0 and "token was rejected (IVA_TELEGRAM_TOKEN)" in out


async def test_check_names_an_unreachable_eve(tg, monkeypatch, capsys):
    code, out = await iva_check_in_process(monkeypatch, capsys, check_env(tg, "http://127.0.0.1:9", "x"))
    assert code != 0 and "eve: cannot reach http://127.0.0.1:9" in out


async def test_check_names_a_wrong_eve_token(tg, fake_eve, monkeypatch, capsys):
    code, out = await iva_check_in_process(monkeypatch, capsys, check_env(tg, fake_eve.url, "wrong"))
    assert code != 0 and "IVA_EVE_TOKEN" in out


async def test_check_names_a_bad_variable(tg, fake_eve, monkeypatch, capsys):
    code, out = await iva_check_in_process(monkeypatch, capsys,
                                           check_env(tg, fake_eve.url, fake_eve.token, IVA_TURN_POLICY="sometimes"))
    assert code == 2 and "IVA_TURN_POLICY='sometimes' must be 'queue' or 'immediate'" in out


async def test_check_warns_when_parking_would_not_come_before_eves_safety_net(tg, fake_eve, monkeypatch, capsys):
    """C9: a bridge threshold at or above eve's in-turn one (min(75% × window, 137 500)) is warned about."""
    code, out = await iva_check_in_process(monkeypatch, capsys,
                                           check_env(tg, fake_eve.url, fake_eve.token, IVA_COMPACT_PERCENT="80"))
    assert code == 0
    assert "warn the parking threshold 102400 is not below eve's in-turn safety net 96000" in out
    fake_eve.mcp_url = "http://127.0.0.1:8787/mcp"  # the notebook connection where Iva serves it
    code, out = await iva_check_in_process(monkeypatch, capsys,
                                           check_env(tg, fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="mcp-token-1"))
    assert "warn" not in out


async def test_check_shows_each_allowed_model_and_whether_the_agent_chooses_per_turn(tg, fake_eve, monkeypatch, capsys):
    """D1, D3: each model of IVA_MODELS with its window and parking threshold; an agent with one
    fixed model is warned about (the choices would not reach it); the template's dynamic agent,
    whose /info names no model and lists its dynamic connection only after a turn, is not."""
    env = check_env(tg, fake_eve.url, fake_eve.token, IVA_MODELS="fast=a/fast:128000,big=b/big:1000000",
                    IVA_NOTES_MODEL="fast")
    code, out = await iva_check_in_process(monkeypatch, capsys, env)
    assert code == 0, out
    assert "ok   model fast: a/fast, window 128000, parking threshold 76800 (the default) (the notebook's" in out
    assert "ok   model big: b/big, window 1000000, parking threshold 110000" in out
    assert "warn IVA_MODELS is set, but eve's agent answers on one fixed model (fake/fake-model)" in out
    fake_eve.dynamic_model = True
    code, out = await iva_check_in_process(monkeypatch, capsys, env)
    assert code == 0 and "fixed model" not in out and "no connection named" not in out, out
    assert "note notebook: eve's agent chooses its definitions per turn" in out
    code, out = await iva_check_in_process(monkeypatch, capsys, check_env(tg, fake_eve.url, fake_eve.token))
    assert "warn eve's agent chooses its model per turn and names no window: set IVA_MODELS" in out


async def test_check_warns_when_the_agent_cannot_reach_the_notebook(tg, fake_eve, monkeypatch, capsys):
    """N3: without eve's MCP connection to Iva's /mcp the model cannot write notes; say so."""
    code, out = await iva_check_in_process(monkeypatch, capsys, check_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0 and "warn notebook: eve's agent has no connection named 'notebook'" in out
    fake_eve.mcp_url = "http://127.0.0.1:4999/mcp"
    code, out = await iva_check_in_process(monkeypatch, capsys, check_env(tg, fake_eve.url, fake_eve.token))
    assert "points at http://127.0.0.1:4999/mcp, but Iva serves it at http://127.0.0.1:8787/mcp" in out
    code, out = await iva_check_in_process(monkeypatch, capsys,
                                           check_env(tg, fake_eve.url, fake_eve.token, IVA_NOTES_ENABLED="0"))
    assert "notebook" not in out


async def test_check_names_the_field_of_a_getme_it_cannot_read(tg, fake_eve, monkeypatch, capsys):
    """Issue 11: a Bot API server (an emulator, a proxy) whose getMe answer aiogram cannot
    validate: one line naming the bad fields, no traceback."""
    tg.garble["getMe"] = 1
    code, out = await iva_check_in_process(monkeypatch, capsys,
                                           check_env(tg, fake_eve.url, fake_eve.token,
                                                     IVA_MCP_TOKEN="mcp-token-for-check"))
    assert code != 0, out
    assert "Traceback" not in out
    line = next(x for x in out.splitlines() if x.startswith("FAIL telegram"))
    assert "not a Bot API user" in line and "result" in line, line


_ME = {"ok": True, "result": {"id": 1, "is_bot": True, "first_name": "x", "username": "odd_bot"}}
_LONG = "line one\nline two " + "x" * 5000


def _odd_answer(kind: str):
    """What an odd server answers: to every path, or (``info:…``) only to eve's /info."""
    from aiohttp import web

    def answer(what: str) -> web.Response:
        if what == "html":
            return web.Response(text="<html>\n<body>Welcome to nginx!</body>\n</html>", content_type="text/html")
        if what == "500":
            return web.Response(status=500, text=_LONG)
        if what == "badjson":
            return web.Response(text="{not json", content_type="application/json")
        if what == "list":
            return web.json_response([1, 2])
        if what == "infinity":  # Python's JSON reader takes it; int() of it raises
            return web.Response(text='{"agent": {"model": {"id": "m", "contextWindowTokens": Infinity}}}',
                                content_type="application/json")
        if what == "tg500":
            return web.json_response({"ok": False, "error_code": 500, "description": _LONG}, status=500)
        raise AssertionError(what)

    async def handle(request: web.Request) -> web.Response:
        path = request.path
        if kind.startswith("info:"):
            if path.endswith("/getMe"):
                return web.json_response(_ME)
            if path.endswith("/health"):
                return web.json_response({"ok": True, "status": "ok"})
            return answer(kind.partition(":")[2])
        return answer(kind)

    return handle


async def _odd_server(kind: str):
    from aiohttp import web

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _odd_answer(kind))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("kind", ["html", "500", "badjson", "list", "tg500", "info:html", "info:badjson",
                                  "info:list", "info:500", "info:infinity", "closed"])
async def test_check_shows_no_traceback_whatever_a_server_answers(kind: str, monkeypatch, capsys):
    """Issue 15: whatever the Bot API or eve answer — a web page, a 500 with a page of text, broken
    JSON, the wrong JSON, nothing at all — ``iva check`` prints one line per problem (ok / warn /
    note / FAIL), never a traceback, never a line of the server's own text, and exits 3."""
    runner = None
    if kind == "closed":
        url = "http://127.0.0.1:9"
    else:
        runner, url = await _odd_server(kind)
    try:
        code, out = await iva_check_in_process(monkeypatch, capsys, {
            "IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": url, "IVA_EVE_URL": url,
            "IVA_EVE_TOKEN": "x", "IVA_OWNER_IDS": str(OWNER), "IVA_NOTES_ENABLED": "0"})
    finally:
        if runner is not None:
            await runner.cleanup()
    assert "Traceback" not in out, out
    if kind == "info:infinity":  # an unreadable window is "not reported", not a crash
        assert code == 0 and "window (not reported)" in out, out
        return
    assert code == 3, out
    lines = out.splitlines()
    assert lines and all(x.split(" ", 1)[0] in ("ok", "warn", "note", "FAIL") for x in lines), out
    assert all(len(x) <= 420 for x in lines), out
    assert any(x.startswith("FAIL eve" if kind.startswith("info:") else "FAIL telegram") for x in lines), out
    assert TOKEN.partition(":")[2] not in out


async def test_a_poison_message_dies_by_age_and_is_listed_and_cleared_by_status(tmp_path, tg, fake_eve, capsys):
    """F6: attempts or age, either one: eve failing on a message for IVA_EVE_SEND_MAX_AGE gives it up
    long before IVA_EVE_SEND_ATTEMPTS; `iva status --dead` lists it, `--clear-dead` forgets it and
    its warning."""
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_EVE_SEND_ATTEMPTS="100", IVA_EVE_SEND_MAX_AGE="1")
    await h.start()
    try:
        fake_eve.failing_texts = {"poison"}
        await tg.message("poison", user_id=OWNER)
        await h.until(lambda: tg.texts(), timeout=60, what="the person told")
        assert tg.texts() == ["Sorry, I couldn't answer that (the assistant's server kept failing on it). "
                              "Please try again."]
        assert 1 <= fake_eve.failed_sends < 100
        await tg.message("after", user_id=OWNER)
        await h.settled(30)
        assert tg.texts()[-1] == "echo: after"
    finally:
        await h.stop()
    state = str(tmp_path / "state")
    [chat] = read_status(tmp_path / "state" / "iva.sqlite3")["chats"]
    assert "1 message(s) given up on" in chat["last_error"]
    capsys.readouterr()
    assert main(["status", "--state", state, "--dead"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("dead ") and f"chat {OWNER}" in line and "poison" in line and "eve failed on it" in line
    assert main(["status", "--state", state, "--clear-dead"]) == 0
    assert "cleared 1 message(s)" in capsys.readouterr().out
    assert read_status(tmp_path / "state" / "iva.sqlite3")["chats"] == []  # the warning went with them
    assert main(["status", "--state", state, "--dead"]) == 0
    assert capsys.readouterr().out.strip() == "no message was given up on"


async def test_restore_notes_brings_the_notebooks_back_from_a_quarantined_file(tmp_path, capsys):
    """seed 000/R5: a quarantined state database took the notebooks with it; `iva restore-notes FILE`
    copies back every note that reads cleanly, never over one written since."""
    import sqlite3

    from bridge.cli import main
    from tests.harness import open_store

    old, state = tmp_path / "old.sqlite3", tmp_path / "state"
    state.mkdir()
    for path, rows in ((old, [("shop", "milk"), ("plan", "ship it")]), (state / "iva.sqlite3", [("shop", "bread")])):
        db, _queue, _store = await open_store(path)
        for name, body in rows:
            await db.execute("INSERT INTO notes (address, name, description, body, created_at, updated_at) "
                             "VALUES ('1', ?, 'd', ?, 1, 1)", (name, body))
        if path == old:
            await db.execute("INSERT INTO notes_archive VALUES ('1', '[]', 'rebuild', 1)")
        await db.close()
    quarantined = tmp_path / "iva.sqlite3.quarantined-20261202T000000"
    old.rename(quarantined)
    assert main(["restore-notes", str(quarantined), "--state", str(state)]) == 0
    assert "1 note(s) and 1 archived notebook(s) restored" in capsys.readouterr().out
    with sqlite3.connect(state / "iva.sqlite3") as conn:
        assert dict(conn.execute("SELECT name, body FROM notes WHERE address = '1'")) == {"shop": "bread",
                                                                                         "plan": "ship it"}
    assert main(["restore-notes", str(tmp_path / "missing"), "--state", str(state)]) == 1
