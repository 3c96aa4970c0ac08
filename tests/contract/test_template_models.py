"""Issue 36 on the real eve 1.0.1 with the template (``examples/eve-agent/``): Iva in process
(tests/harness.py) in front of the template, built and served as tests/process/test_example_agent.py
builds it, its one seam (``lib/provider.ts``: which provider serves a model id) pointed at the
scripted model (``fake_llm.py``), which records the model id each call asked for and the tools it
was offered.

Proved here: two chats on two models at once; a switch mid-conversation taking effect on the next
turn; the parking threshold following the chat's model's window (the small window's chat is
compacted after a turn the big window's chat is not); the notebook rebuild's turn offered no tools
at all, on the model it was told; the recent exchange of a stranded session, carried in the first
message's clientContext, given to the model as real turns (V5); headers from a caller without Iva's
token never read, and values of the wrong shape from Iva's dropped (the default model answers, never
a failed turn).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import eve_client as eve
from bridge.config import read_models
from bridge.models import Caller, TurnKind
from tests.conftest import EVE_PEER, REAL, free_port
from tests.fakes.telegram import FakeTelegram
from tests.harness import FRIEND, OWNER, Harness
from tests.process.test_example_agent import _app, _home, _stop

pytestmark = [REAL, pytest.mark.timeout(300)]

TOKEN = "iva-eve-token-for-the-template"
MODELS = "big=fake/big:1000000,small=fake/small:32000"  # the first is the default
PROVIDER = """\
// The test's lib/provider.ts: every allowed id is served by the scripted model (fake_llm.py).
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import type { LanguageModel } from "ai";

const fake = createOpenAICompatible({
  name: "fake", baseURL: process.env.FAKE_LLM_URL ?? "http://127.0.0.1:4010/v1", includeUsage: true,
});

export function languageModel(id: string): string | LanguageModel {
  return fake(id);
}
"""


class Served:
    def __init__(self, url: str, llm: str) -> None:
        self.url, self.llm = url, llm

    def requests(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.llm}/requests", timeout=10) as response:
            data = json.loads(response.read())
        return list(data["requests"] if isinstance(data, dict) else data)

    def asked(self, text: str) -> dict[str, Any]:
        """The scripted model's first call of the turn whose message holds ``text``."""
        return next(r for r in self.requests() if r["kind"] == "chat" and text in str(r.get("latest_user")))

    def compactions(self) -> int:
        return sum(1 for r in self.requests() if r["kind"] == "compaction")


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/eve/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)  # polling for the server to come up, not a fixed wait
    raise AssertionError(f"not healthy (exit {process.poll()}):\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def template(tmp_path: Path) -> Iterator[Served]:
    """The template built with the test's provider and IVA_MODELS, served with Iva's token, in
    front of a scripted model of its own."""
    if os.environ.get("IVA_SKIP_REAL_EVE") == "1":
        pytest.skip("IVA_SKIP_REAL_EVE=1: the template against the real eve is skipped on request")
    node_bin, _ = _home()
    app = _app(tmp_path)
    (app / "agent" / "lib" / "provider.ts").write_text(PROVIDER)
    llm_port, port = free_port(), free_port()
    with (tmp_path / "llm.out").open("wb") as out:
        llm = subprocess.Popen([sys.executable, str(EVE_PEER / "fake_llm.py"), "--port", str(llm_port)],
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    server = None
    try:
        env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}",
               "EVE_TELEMETRY_DISABLED": "1", "EVE_TRACES": "off", "IVA_MODELS": MODELS, "NOTEBOOK_MCP_TOKEN": ""}
        env.pop("IVA_EVE_TOKEN", None)
        with (tmp_path / "build.out").open("wb") as out:
            built = subprocess.run([str(app / "node_modules" / ".bin" / "eve"), "build", "--skip-sandbox-prewarm"],
                                   cwd=app, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   timeout=240)
        assert built.returncode == 0, (tmp_path / "build.out").read_text(errors="replace")[-4000:]
        manifest = json.loads((app / ".output" / ".eve" / "compile" / "compiled-agent-manifest.json").read_text())
        compaction = manifest["config"]["compaction"]  # C9 for the smallest window: min(0.75, 137 500 / 32 000)
        assert compaction.get("threshold", compaction.get("thresholdPercent")) == pytest.approx(0.75)
        url = f"http://127.0.0.1:{port}"
        served_env = {**env, "PORT": str(port), "HOST": "127.0.0.1", "NITRO_PORT": str(port),
                      "NITRO_HOST": "127.0.0.1", "IVA_EVE_TOKEN": TOKEN, "FAKE_LLM_URL": f"http://127.0.0.1:{llm_port}/v1"}
        with (tmp_path / "eve.out").open("wb") as out:
            server = subprocess.Popen([str(node_bin / "node"), ".output/server/index.mjs"], cwd=app, env=served_env,
                                      stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        _wait_healthy(url, server, tmp_path / "eve.out")
        yield Served(url, f"http://127.0.0.1:{llm_port}")
    finally:
        if server is not None:
            _stop(server)
        _stop(llm)


async def test_the_template_answers_each_chat_on_its_model_and_the_rebuild_with_no_tools(
        template: Served, tmp_path: Path, tg: FakeTelegram) -> None:
    """D1-D4 end to end on eve 1.0.1: Iva's headers choose each chat's model in the template."""
    h = Harness(tmp_path / "state", tg, None, eve_url=template.url, eve_token=TOKEN, IVA_MODELS=MODELS,
                IVA_NOTES_ENABLED="0")
    await h.start()
    try:
        # Two chats, both on the default (big) at first.
        await tg.message("hello from the owner", user_id=OWNER)
        await tg.message("hello from a friend", user_id=FRIEND)
        await h.settled(60)
        assert template.asked("hello from the owner")["model"] == "fake/big"
        assert template.asked("hello from a friend")["model"] == "fake/big"
        assert "web_fetch" in template.asked("hello from the owner")["tools"]  # a person's turn has its tools

        # The owner switches mid-conversation: the next turn runs on small; the friend's stays big.
        session = (await h.chat(str(OWNER))).eve_session
        await tg.message("/model small", user_id=OWNER)
        await h.settled(60)
        await tg.message("owner after the switch", user_id=OWNER)
        await tg.message("friend meanwhile", user_id=FRIEND)
        await h.settled(60)
        assert template.asked("owner after the switch")["model"] == "fake/small"
        assert template.asked("friend meanwhile")["model"] == "fake/big"
        assert (await h.chat(str(OWNER))).eve_session == session  # the same conversation, on another model

        # D3: 30 000 tokens fit under big's threshold (110 000), not under small's (19 200).
        before = template.compactions()
        await tg.message("a big one from the friend [[tokens=30000]]", user_id=FRIEND)
        await h.settled(60)
        assert template.compactions() == before and (await h.chat(str(FRIEND))).measurement == 30_000
        await tg.message("a big one from the owner [[tokens=30000]]", user_id=OWNER)
        await h.settled(90)
        assert template.compactions() == before + 1  # Iva compacted the small window's chat after its turn
        # eve runs no dynamic model for a summary call: it summarises on the turn's selection (observed)
        assert [r for r in template.requests() if r["kind"] == "compaction"][-1]["model"] == "fake/small"
        await tg.message("/status", user_id=OWNER)
        await tg.message("/status", user_id=FRIEND)
        await h.settled(60)
        assert "of 19 200 tokens" in tg.texts(OWNER)[-1] and "Model: small" in tg.texts(OWNER)[-1]
        assert "of 110 000 tokens" in tg.texts(FRIEND)[-1] and "Model: big" in tg.texts(FRIEND)[-1]
    finally:
        await h.stop()

    small = read_models(MODELS).get("small")
    async with eve.EveClient(template.url, token=TOKEN) as client:
        # D4: the rebuild's turn, as Iva's Rebuilder creates it: no tools at all, on the model it names.
        rebuild = Caller(str(OWNER), TurnKind.REBUILD, small).headers()
        session = await client.create_session("NOTEBOOK REBUILD: tidy these notes", headers=rebuild)
        async for event in client.stream(session):
            if isinstance(event, eve.TurnEnded):
                break
        asked = template.asked("NOTEBOOK REBUILD")
        assert asked["tools"] == [] and asked["model"] == "fake/small"
        await client.end(session)

        # Iva's token with values of the wrong shape: dropped, so not a rebuild and not a model.
        forged = {"x-iva-turn": "REBUILD", "x-iva-model": "openai/gpt-9000", "x-iva-chat": "1"}
        session = await client.create_session("odd headers", headers=forged)
        async for event in client.stream(session):
            if isinstance(event, eve.TurnEnded):
                break
        asked = template.asked("odd headers")
        assert asked["model"] == "fake/big" and "web_fetch" in asked["tools"]  # the default, tools as usual
        await client.end(session)

        # V5: the recent exchange an upgrade would have stranded, carried in the first message's
        # clientContext (bridge/chat/carry.py): the template's channel makes it real history.
        prior = [{"role": "user", "text": "our trip is to Lisbon"}, {"role": "assistant", "text": "noted: Lisbon"}]
        async with httpx.AsyncClient(timeout=10) as http:  # the requests' messages recorded in full
            (await http.post(f"{template.llm}/control", json={"full_log": True})).raise_for_status()
        session = await client.create_session()
        await client.send(session, "carried here", turn_policy="queue",
                          client_context={"ivaHistory": prior, "context": "[state] the usual block"})
        async for event in client.stream(session):
            if isinstance(event, eve.TurnEnded):
                break
        messages = template.asked("carried here")["messages"]
        turns = [(m.get("role"), m.get("content")) for m in messages if isinstance(m.get("content"), str)]
        assert ("user", "our trip is to Lisbon") in turns and ("assistant", "noted: Lisbon") in turns, turns
        assert not any("ivaHistory" in str(c) for _, c in turns)  # the entries as turns, not as client context
        assert any("[state] the usual block" in str(c) for _, c in turns)  # the context still reaches the model
        await client.end(session)

    # Without Iva's token the headers are never read: the request is refused before any model call.
    calls = len(template.requests())
    async with httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(f"{template.url}/eve/v1/session", json={"message": "let me in"},
                                  headers={**rebuild, "x-iva-model": "fake/small",
                                           "authorization": "Bearer not-the-token"})
    assert refused.status_code == 401
    assert len(template.requests()) == calls
