"""eve's own upgrade and budget, on the real eves (SPEC V5, V6; PROTOCOL-27.md §9, §11).

- **A true upgrade**: chats idle, busy mid-turn, compacting and with messages queued on eve
  0.80.1; eve stopped and 1.0.1 started on the same store (Iva running throughout): every message
  answered exactly once or told in one line, the notebook intact and in the new conversation, no
  chat busy at the end.
- **The budget prompt** (``limits.sessionUsage``, a small one in this build) on eve 1.0.1: shown
  to the owner and continued, stopped by the owner from their private chat for a friend's chat,
  and left unanswered (given up after the busy timeout; the next message meets it again).

Each test starts its own eve (they change what its build or its store holds): their own xdist
group, beside the shared real eves' one.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.telegram.texts import t
from tests.conftest import EVE_PEER, FRIEND, OWNER, REAL_OWN, free_port
from tests.harness import Harness

pytestmark = REAL_OWN

GROUP = -100777
MCP_TOKEN = "iva-upgrade-mcp-token"
SAVE = '[[call=notebook__chat_note_save {"name": "trip", "description": "the trip", "body": "Lisbon in May"}]]'


class Peer:
    """One eve-peer instance of this module: its run directory and ports outlive a version change."""

    def __init__(self, run_dir: Path, **extra: str) -> None:
        if os.environ.get("IVA_SKIP_REAL_EVE") == "1":
            pytest.skip("IVA_SKIP_REAL_EVE=1: real-eve contract tests skipped on request")
        self.mcp_listen = f"127.0.0.1:{free_port()}"
        self.env = {**os.environ, "EVE_PORT": str(free_port()), "FAKE_LLM_PORT": str(free_port()),
                    "EVE_PEER_RUN_DIR": str(run_dir), "NOTEBOOK_MCP_URL": f"http://{self.mcp_listen}/mcp",
                    "NOTEBOOK_MCP_TOKEN": MCP_TOKEN, **extra}
        self.values: dict[str, str] = {}

    def start(self, version: str, *args: str) -> None:
        env = {**self.env, "EVE_VERSION": version}
        done = subprocess.run(["bash", str(EVE_PEER / "start.sh"), *args], env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            pytest.fail(f"eve-peer {version} did not start:\n{done.stdout}\n{done.stderr}")
        self.values.update(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        self.version = version

    def stop(self, *args: str) -> None:
        subprocess.run(["bash", str(EVE_PEER / "stop.sh"), *args], env={**self.env, "EVE_VERSION": self.version},
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

    def control(self, **values: Any) -> None:
        import urllib.request

        request = urllib.request.Request(f"{self.values['FAKE_LLM_BASE_URL']}/control",
                                         data=json.dumps(values).encode(),
                                         headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def llm_requests(self) -> list[dict[str, Any]]:
        import urllib.request

        with urllib.request.urlopen(f"{self.values['FAKE_LLM_BASE_URL']}/requests", timeout=10) as response:
            data = json.loads(response.read())
        return data["requests"] if isinstance(data, dict) else data

    def harness(self, state: Path, tg: Any, **env: str) -> Harness:
        return Harness(state, tg, None, eve_url=self.values["EVE_BASE_URL"], eve_token=self.values["EVE_PEER_TOKEN"],
                       listen=True, IVA_API_LISTEN=self.mcp_listen, IVA_MCP_TOKEN=MCP_TOKEN, **env)


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Peer]:
    made = Peer(tmp_path / "eve-peer")
    yield made
    made.stop()


async def _until_text(tg: Any, chat: int, text: str) -> list[str]:
    """The chat's texts once one of them contains ``text``."""
    await tg.wait_for(lambda: any(text in sent for sent in tg.texts(chat)), 240, f"{text!r} in {chat}")
    return tg.texts(chat)


async def test_an_eve_upgrade_answers_every_message_once_or_says_so(tmp_path: Path, tg: Any, peer: Peer) -> None:
    peer.start("0.80.1")
    h = peer.harness(tmp_path / "state", tg, IVA_NOTES_ENABLED="1", IVA_BUSY_TIMEOUT="600")
    await h.start()
    group = {"chat_id": GROUP, "chat_type": "supergroup", "reply_to_bot": True}
    try:
        # idle: two turns, one of which saves a note in the owner's notebook
        await tg.message("a1 hello", user_id=OWNER)
        await _until_text(tg, OWNER, "echo: a1 hello")
        await tg.message(f"a2 remember {SAVE}", user_id=OWNER)
        await _until_text(tg, OWNER, "tool done: a2 remember")
        # compacting: a turn over the threshold, its summary slow; a message waits behind it
        peer.control(next_summary_delay=60)
        await tg.message("c1 big [[tokens=120000]]", user_id=FRIEND, **group)
        await h.until(lambda: (c := h.maybe_chat(str(GROUP))) is not None and c.kind is not None
                      and c.kind.value == "compact", 60, "the group compacting")
        await tg.message("c2 while compacting", user_id=FRIEND, **group)
        await _until_text(tg, GROUP, t("compacting_notice", "en"))
        # busy mid-turn, with a message queued behind it
        await tg.message("b1 slow [[delay=60]]", user_id=FRIEND)
        await h.until(lambda: (c := h.maybe_chat(str(FRIEND))) is not None and c.deliveries, 60, "b1 at eve")
        await tg.message("b2 queued", user_id=FRIEND)
        # the upgrade: eve stopped, Iva running; a message while eve is down; eve 1.0.1 on the store
        peer.stop("--eve-only")
        await tg.message("a3 during the upgrade", user_id=OWNER)
        peer.start("1.0.1", "--eve-only", "--keep-state")

        upgraded, cut = t("eve_upgraded", "en"), t("eve_upgraded_cut", "en")
        owner = await _until_text(tg, OWNER, "echo: a3 during the upgrade")
        assert owner[-2:] == [upgraded, "echo: a3 during the upgrade"], owner
        # the recent exchange came along (bridge/chat/carry.py): this agent has no channel code to
        # make it history, so the model reads it as client context; the template makes it turns
        # (tests/contract/test_template_models.py)
        first = [r for r in peer.llm_requests() if "a3 during the upgrade" in str(r.get("latest_user"))]
        assert first and "a1 hello" in json.dumps(first[0]), first
        friend = await _until_text(tg, FRIEND, "echo: b2 queued")
        assert friend == [cut, "echo: b2 queued"], friend  # b1 cut: told in one line; b2 answered
        grouped = await _until_text(tg, GROUP, "c2 while compacting")
        assert grouped[-2] == upgraded and grouped.count(upgraded) == 1, grouped
        await h.settled(60)
        for address in (str(OWNER), str(FRIEND), str(GROUP)):
            chat = h.maybe_chat(address)
            assert chat is not None and not chat.busy and chat.session_eve == "1.0.1", (address, chat)
        assert [r[0] for r in h.observe("SELECT value FROM iva_meta WHERE key = 'eve_version'")] == ["1.0.1"]
        # the notebook: intact in Iva, and in the new conversation's first owner turn
        await tg.message("a4 the note?", user_id=OWNER)
        owner = await _until_text(tg, OWNER, "echo: a4 the note?")
        assert owner.count(upgraded) == 1 and len(set(owner)) == len(owner), owner  # told once, nothing twice
        notes = {r["name"]: r["body"] for r in h.observe("SELECT name, body FROM notes WHERE address = ?",
                                                        (str(OWNER),))}
        assert notes == {"trip": "Lisbon in May"}
        asked = [r for r in peer.llm_requests() if "a4 the note" in str(r.get("latest_user"))]
        assert asked and "trip" in json.dumps(asked[-1])  # the notebook rides the new conversation
    finally:
        await h.stop()


@pytest.fixture
def budget_peer(tmp_path: Path) -> Iterator[Peer]:
    """eve 1.0.1 whose agent pauses a session once its window's input passes 150 000 tokens
    (PROTOCOL-27.md §9): three turns of 60 000, and the fourth opens the budget prompt."""
    made = Peer(tmp_path / "eve-peer-budget", EVE_SESSION_USAGE="150000")
    made.start("1.0.1")
    yield made
    made.stop()


async def _over_budget(tg: Any, h: Harness, user: int, where: dict[str, Any], tag: str) -> None:
    """Three turns of 60 000 input tokens each in the chat: the next one meets the budget prompt."""
    chat = where.get("chat_id", user)
    for n in range(3):
        await tg.message(f"{tag}{n} [[tokens=60000]]", user_id=user, **where)
        await _until_text(tg, chat, f"{tag}{n}")
    await h.until(lambda: (c := h.maybe_chat(str(chat))) is not None and not c.busy, 60, f"{chat} idle")


def _prompt(tg: Any, chat: int) -> dict[str, Any]:
    return next(m for m in reversed(tg.sent(chat)) if m.get("reply_markup"))


async def test_the_budget_prompt_on_eve_1x_continued_stopped_and_left(tmp_path: Path, tg: Any,
                                                                      budget_peer: Peer) -> None:
    h = budget_peer.harness(tmp_path / "state", tg, IVA_BUSY_TIMEOUT="10")
    await h.start()
    group = {"chat_id": GROUP, "chat_type": "supergroup", "reply_to_bot": True}
    try:
        # the owner's own chat: asked there; Continue → the turn goes on to its answer
        await _over_budget(tg, h, OWNER, {}, "o")
        await tg.message("o3 over budget", user_id=OWNER)
        await _until_text(tg, OWNER, t("budget_prompt", "en"))
        prompt = _prompt(tg, OWNER)
        assert [b["text"] for row in prompt["reply_markup"]["inline_keyboard"] for b in row] == ["Continue", "Stop"]
        await tg.press(prompt, "Continue", user_id=OWNER)
        await _until_text(tg, OWNER, "echo: o3 over budget")
        # a friend's chat: the owner is asked in their private chat and stops it
        await _over_budget(tg, h, FRIEND, {}, "f")
        await tg.message("f3 over budget", user_id=FRIEND)
        await _until_text(tg, FRIEND, t("budget_waiting_owner", "en"))
        await tg.wait_for(lambda: sum(bool(m.get("reply_markup")) for m in tg.sent(OWNER)) == 2, 60,
                          "the owner asked for the friend's chat")
        await tg.press(_prompt(tg, OWNER), "Stop", user_id=OWNER)
        friend = await _until_text(tg, FRIEND, t("budget_stopped", "en"))
        assert "echo: f3 over budget" not in friend
        # a group nobody answers for: given up after the busy timeout, and met again later
        await _over_budget(tg, h, FRIEND, group, "g")
        await tg.message("g3 over budget", user_id=FRIEND, **group)
        await _until_text(tg, GROUP, t("budget_given_up", "en"))
        await tg.message("g4 still there?", user_id=FRIEND, **group)
        await tg.wait_for(lambda: tg.texts(GROUP).count(t("budget_given_up", "en")) == 2, 120, "met again")
        assert tg.texts(GROUP).count(t("budget_waiting_owner", "en")) == 2
        await h.settled(60)
        for address in (str(OWNER), str(FRIEND), str(GROUP)):
            chat = h.maybe_chat(address)
            assert chat is not None and not chat.busy, (address, chat)
    finally:
        await h.stop()
