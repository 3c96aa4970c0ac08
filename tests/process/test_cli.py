"""``iva check``: names the problem and exits non-zero (issue acceptance, SPEC §2)."""

from __future__ import annotations

import pytest

from tests.conftest import OWNER
from tests.daemons import check_env, iva_check
from tests.fakes.telegram import TOKEN

pytestmark = pytest.mark.process  # every test here runs the bridge as a process


async def test_check_passes_when_all_is_well(tg, fake_eve):
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0, out
    assert "telegram: @iva_test_bot" in out and "window 128000" in out


async def test_check_names_a_wrong_telegram_token(tg, fake_eve):
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_TELEGRAM_TOKEN="999:WRONGwrongWRONGwrongWRONG"))
    assert code != 0 and "token was rejected (IVA_TELEGRAM_TOKEN)" in out


async def test_check_names_an_unreachable_eve(tg):
    code, out = await iva_check(check_env(tg, "http://127.0.0.1:9", "x"))
    assert code != 0 and "eve: cannot reach http://127.0.0.1:9" in out


async def test_check_names_a_wrong_eve_token(tg, fake_eve):
    code, out = await iva_check(check_env(tg, fake_eve.url, "wrong"))
    assert code != 0 and "IVA_EVE_TOKEN" in out


async def test_check_names_a_bad_variable(tg, fake_eve):
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_TURN_POLICY="sometimes"))
    assert code == 2 and "IVA_TURN_POLICY='sometimes' must be 'queue' or 'immediate'" in out


async def test_check_warns_when_parking_would_not_come_before_eves_safety_net(tg, fake_eve):
    """C9: a bridge threshold at or above eve's in-turn one (min(75% × window, 137 500)) is warned about."""
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_COMPACT_PERCENT="80"))
    assert code == 0
    assert "warn the parking threshold 102400 is not below eve's in-turn safety net 96000" in out
    fake_eve.mcp_url = "http://127.0.0.1:8787/mcp"  # the notebook connection where Iva serves it
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="mcp-token-1"))
    assert "warn" not in out


async def test_check_warns_when_the_agent_cannot_reach_the_notebook(tg, fake_eve):
    """N3: without eve's MCP connection to Iva's /mcp the model cannot write notes; say so."""
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0 and "warn notebook: eve's agent has no connection named 'notebook'" in out
    fake_eve.mcp_url = "http://127.0.0.1:4999/mcp"
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token))
    assert "points at http://127.0.0.1:4999/mcp, but Iva serves it at http://127.0.0.1:8787/mcp" in out
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_NOTES_ENABLED="0"))
    assert "notebook" not in out


async def test_check_names_the_field_of_a_getme_it_cannot_read(tg, fake_eve):
    """Issue 11: a Bot API server (an emulator, a proxy) whose getMe answer aiogram cannot
    validate: one line naming the bad fields, no traceback."""
    tg.garble["getMe"] = 1
    code, out = await iva_check(check_env(tg, fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="mcp-token-for-check"))
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
async def test_check_shows_no_traceback_whatever_a_server_answers(kind: str):
    """Issue 15: whatever the Bot API or eve answer — a web page, a 500 with a page of text, broken
    JSON, the wrong JSON, nothing at all — ``iva check`` prints one line per problem (ok / warn /
    note / FAIL), never a traceback, never a line of the server's own text, and exits 3."""
    runner = None
    if kind == "closed":
        url = "http://127.0.0.1:9"
    else:
        runner, url = await _odd_server(kind)
    try:
        code, out = await iva_check({"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": url, "IVA_EVE_URL": url,
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
