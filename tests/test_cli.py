"""``iva check``: names the problem and exits non-zero (issue acceptance, SPEC §2)."""

from __future__ import annotations

import asyncio
import os
import sys

from tests.conftest import OWNER, ROOT
from tests.fakes.telegram import TOKEN


async def _check(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bridge", "check", cwd=ROOT, env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


def _env(tg, eve_url: str, eve_token: str, **extra: str) -> dict[str, str]:
    return {"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_TELEGRAM_API_URL": tg.url, "IVA_EVE_URL": eve_url,
            "IVA_EVE_TOKEN": eve_token, "IVA_OWNER_IDS": str(OWNER), **extra}


async def test_check_passes_when_all_is_well(tg, fake_eve):
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0, out
    assert "telegram: @iva_test_bot" in out and "window 128000" in out


async def test_check_names_a_wrong_telegram_token(tg, fake_eve):
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token, IVA_TELEGRAM_TOKEN="999:WRONGwrongWRONGwrongWRONG"))
    assert code != 0 and "token was rejected (IVA_TELEGRAM_TOKEN)" in out


async def test_check_names_an_unreachable_eve(tg):
    code, out = await _check(_env(tg, "http://127.0.0.1:9", "x"))
    assert code != 0 and "eve: cannot reach http://127.0.0.1:9" in out


async def test_check_names_a_wrong_eve_token(tg, fake_eve):
    code, out = await _check(_env(tg, fake_eve.url, "wrong"))
    assert code != 0 and "IVA_EVE_TOKEN" in out


async def test_check_names_a_bad_variable(tg, fake_eve):
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token, IVA_TURN_POLICY="sometimes"))
    assert code == 2 and "IVA_TURN_POLICY='sometimes' must be 'queue' or 'immediate'" in out


async def test_check_warns_when_parking_would_not_come_before_eves_safety_net(tg, fake_eve):
    """C9: a bridge threshold at or above eve's in-turn one (min(75% × window, 137 500)) is warned about."""
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token, IVA_COMPACT_PERCENT="80"))
    assert code == 0
    assert "warn the parking threshold 102400 is not below eve's in-turn safety net 96000" in out
    fake_eve.mcp_url = "http://127.0.0.1:8787/mcp"  # the notebook connection where Iva serves it
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="mcp-token-1"))
    assert "warn" not in out


async def test_check_warns_when_the_agent_cannot_reach_the_notebook(tg, fake_eve):
    """N3: without eve's MCP connection to Iva's /mcp the model cannot write notes; say so."""
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token))
    assert code == 0 and "warn notebook: eve's agent has no connection named 'notebook'" in out
    fake_eve.mcp_url = "http://127.0.0.1:4999/mcp"
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token))
    assert "points at http://127.0.0.1:4999/mcp, but Iva serves it at http://127.0.0.1:8787/mcp" in out
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token, IVA_NOTES_ENABLED="0"))
    assert "notebook" not in out


async def test_check_names_the_field_of_a_getme_it_cannot_read(tg, fake_eve):
    """Issue 11: a Bot API server (an emulator, a proxy) whose getMe answer aiogram cannot
    validate: one line naming the bad fields, no traceback."""
    tg.garble["getMe"] = 1
    code, out = await _check(_env(tg, fake_eve.url, fake_eve.token, IVA_MCP_TOKEN="mcp-token-for-check"))
    assert code != 0, out
    assert "Traceback" not in out
    line = next(x for x in out.splitlines() if x.startswith("FAIL telegram"))
    assert "not a Bot API user" in line and "result" in line, line
