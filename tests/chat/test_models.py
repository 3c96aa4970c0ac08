"""Per chat (SPEC §19, issue 36): ``/model`` chooses which model answers a conversation (D1),
every request to eve's session routes tells the agent's channel the chat's model, the chat, the
speaker, their role and the turn's kind (D2), the parking threshold follows the chat's model's
window (D3), and the notebook's rebuild runs on the chat's model or IVA_NOTES_MODEL as a
``rebuild`` turn (D4). In process (tests/harness.py) on the fakes; the fake eve records the
``x-iva-*`` headers it was sent (``FakeEve.told``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bridge.config import read_models
from tests.daemons import API_TOKEN, api, idle
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness

MODELS = "fast=openai/gpt-fast:128000,strong=anthropic/claude-strong:200000,tiny=local/tiny:8000"
GROUP = -1009
OTHER = 3  # an allowed person too


@pytest.fixture
async def modelled(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_MODELS=MODELS, IVA_ALLOWED_USER_IDS=f"{FRIEND},{OTHER}")
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


async def in_group(tg: FakeTelegram, text: str, user: int, **more: Any) -> None:
    """A message in the group that addresses the bot (a command, or a mention first)."""
    if text.startswith("/"):
        await tg.message(text, user_id=user, chat_id=GROUP, chat_type="supergroup", **more)
        return
    await tg.message(f"@{BOT_USERNAME} {text}", user_id=user, chat_id=GROUP, chat_type="supergroup",
                     entities=[{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}], **more)


def shown_to(tg: FakeTelegram, chat: int, user: int | None) -> list[dict[str, Any]]:
    """The messages of ``chat`` shown to ``user`` alone (None: to everyone)."""
    return [p for p in tg.sent(chat) if (p.get("ephemeral_message_parameters") or {}).get("receiver_user_id") == user]


async def test_the_owner_lists_and_switches_the_model_and_eve_is_told_from_the_next_turn(
        modelled: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """D1, D2 in a private chat: the list marks the default, ``/model strong`` switches from the
    next turn (that turn's requests name the strong model; the one before named the default), a
    button switches too, and /status says which model answers."""
    await tg.message("hello", user_id=OWNER)
    await modelled.settled()
    first = fake_eve.told("create")[-1]
    assert first == {"x-iva-model": "openai/gpt-fast", "x-iva-chat": str(OWNER), "x-iva-speaker": str(OWNER),
                     "x-iva-role": "owner", "x-iva-turn": "person"}
    assert fake_eve.told("send")[-1] == first

    await tg.message("/model", user_id=OWNER)
    await modelled.settled()
    listing = tg.sent(OWNER)[-1]
    assert listing["text"].splitlines()[1] == "✓ fast — openai/gpt-fast, window 128 000 tokens"
    labels = [b["text"] for row in listing["reply_markup"]["inline_keyboard"] for b in row]
    assert labels == ["✓ fast", "strong", "tiny"]

    await tg.message("/model strong", user_id=OWNER)
    await modelled.settled()
    assert tg.texts(OWNER)[-1] == ("From the next answer on, this conversation answers on strong — "
                                   "anthropic/claude-strong, window 200 000 tokens.")
    await tg.message("and now?", user_id=OWNER)
    await modelled.settled()
    assert fake_eve.told("send")[-1]["x-iva-model"] == "anthropic/claude-strong"
    await tg.message("/status", user_id=OWNER)
    await modelled.settled()
    status = tg.texts(OWNER)[-1]
    assert "Model: strong — anthropic/claude-strong, window 200 000 tokens" in status
    assert "of 110 000 tokens" in status  # min(60% × 200 000, 110 000)

    await tg.press(listing, "strong", user_id=FRIEND)  # not an owner: refused, nothing changes
    await tg.wait_for(lambda: len(tg.calls_of("answerCallbackQuery")) == 1, 10, "the refusal")
    assert tg.calls_of("answerCallbackQuery")[-1]["text"] == "Only an owner can choose the model."
    await tg.press(listing, "✓ fast", user_id=OWNER)
    await modelled.settled()
    assert tg.calls_of("answerCallbackQuery")[-1]["text"].startswith("From the next answer on, this conversation "
                                                                       "answers on fast")
    await tg.message("once more", user_id=OWNER)
    await modelled.settled()
    assert fake_eve.told("send")[-1]["x-iva-model"] == "openai/gpt-fast"


async def test_model_in_every_chat_kind_and_role(modelled: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """D1, D2: an allowed person may not choose (in private, or in a group: told alone); an owner
    may, in a group for the group (the list shown to them alone) and in a topic for that topic;
    each speaker's role rides with their turn: the owner's, an allowed person's in their private
    chat, a member's in the group."""
    await tg.message("/model strong", user_id=FRIEND)
    await in_group(tg, "/model", FRIEND)
    await modelled.settled()
    assert tg.texts(FRIEND)[-1] == "Only an owner can choose the model."
    assert [p["text"] for p in shown_to(tg, GROUP, FRIEND)] == ["Only an owner can choose the model."]
    assert modelled.observe("SELECT * FROM chat_models") == []

    await in_group(tg, "/model tiny", 4242)  # a stranger: not answered at all
    await in_group(tg, "/model", OWNER)
    await in_group(tg, "/model tiny", OWNER)
    await modelled.settled()
    assert [p for p in tg.sent(GROUP) if (p.get("ephemeral_message_parameters") or {}).get("receiver_user_id")
            not in (FRIEND, OWNER)] == []
    listing, switched = shown_to(tg, GROUP, OWNER)
    assert listing["text"].startswith("Models for this conversation:") and "✓ fast" in listing["text"]
    assert switched["text"].startswith("From the next answer on, this conversation answers on tiny")
    assert shown_to(tg, GROUP, None) == []  # the group saw nothing

    await in_group(tg, "hello from a member", FRIEND)
    await modelled.settled()
    await in_group(tg, "hello from the owner", OWNER)
    await tg.message("hello in private", user_id=FRIEND)
    await modelled.settled()
    sends = fake_eve.told("send")
    member = next(h for h in sends if h["x-iva-speaker"] == str(FRIEND) and h["x-iva-chat"] == str(GROUP))
    assert member == {"x-iva-model": "local/tiny", "x-iva-chat": str(GROUP), "x-iva-speaker": str(FRIEND),
                      "x-iva-role": "member", "x-iva-turn": "person"}
    owner = next(h for h in sends if h["x-iva-speaker"] == str(OWNER))
    assert owner["x-iva-role"] == "owner" and owner["x-iva-model"] == "local/tiny"
    private = next(h for h in sends if h["x-iva-chat"] == str(FRIEND))
    assert private["x-iva-role"] == "allowed" and private["x-iva-model"] == "openai/gpt-fast"  # the default

    # A topic of the owner's private chat is a conversation of its own, with a model of its own.
    tg.private_topics_enabled = True
    topic = tg.open_topic(OWNER, "Work")
    await tg.message("/model strong", user_id=OWNER, thread_id=topic, is_topic=True)
    await modelled.settled()
    await tg.message("in the topic", user_id=OWNER, thread_id=topic, is_topic=True)
    await tg.message("at the root", user_id=OWNER)
    await modelled.settled()
    by_chat = {h["x-iva-chat"]: h["x-iva-model"] for h in fake_eve.told("send")}
    assert by_chat[f"{OWNER}/{topic}"] == "anthropic/claude-strong" and by_chat[str(OWNER)] == "openai/gpt-fast"

    # A forum topic of the group is a conversation of its own too; the group's own stays tiny.
    await in_group(tg, "/model strong", OWNER, thread_id=7, is_topic=True)
    await modelled.settled()
    await in_group(tg, "in the forum topic", OWNER, thread_id=7, is_topic=True)
    await in_group(tg, "in the group", OWNER)
    await modelled.settled()
    by_chat = {h["x-iva-chat"]: h["x-iva-model"] for h in fake_eve.told("send")}
    assert by_chat[f"{GROUP}/7"] == "anthropic/claude-strong" and by_chat[str(GROUP)] == "local/tiny"


async def test_an_unknown_model_is_one_line_and_no_turn(modelled: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """D1: a name the operator does not allow is one line naming the ones it does; eve hears nothing."""
    await tg.message("/model gpt-9", user_id=OWNER)
    await modelled.settled()
    assert tg.texts(OWNER) == ["There is no model “gpt-9” here. Choose one of: fast, strong, tiny."]
    assert fake_eve.sends() == [] and modelled.observe("SELECT * FROM chat_models") == []


async def test_without_iva_models_there_is_nothing_to_choose_and_no_model_header(
        harness: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """Without IVA_MODELS: /model says so; requests still tell the chat, speaker, role and turn."""
    await tg.message("/model", user_id=OWNER)
    await tg.message("hi", user_id=OWNER)
    await harness.settled()
    assert tg.texts(OWNER)[0] == "There are no models to choose from here: the operator lists them in IVA_MODELS."
    assert fake_eve.told("send") == [{"x-iva-chat": str(OWNER), "x-iva-speaker": str(OWNER), "x-iva-role": "owner",
                                      "x-iva-turn": "person"}]


async def test_a_restart_keeps_the_choice_and_a_removed_model_falls_back_to_the_default(
        tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """D1: the choice outlives a restart; when the operator takes the chosen model out of
    IVA_MODELS, the chat answers on the default (the first), /status says so, the log says it
    once; putting it back brings the choice back."""
    state = tmp_path / "state"
    h = Harness(state, tg, fake_eve, IVA_MODELS=MODELS)
    await h.start()
    await tg.message("/model strong", user_id=OWNER)
    await h.settled()
    await h.stop()

    h = Harness(state, tg, fake_eve, IVA_MODELS=MODELS)
    await h.start()
    await tg.message("after a restart", user_id=OWNER)
    await h.settled()
    assert fake_eve.told("send")[-1]["x-iva-model"] == "anthropic/claude-strong"
    await h.stop()

    h = Harness(state, tg, fake_eve, IVA_MODELS="tiny=local/tiny:8000,fast=openai/gpt-fast:128000")
    from tests.harness import InProcess
    watched = InProcess(h)
    with watched.catching_logs():
        await h.start()
        for text in ("strong is gone", "still gone", "/status"):
            await tg.message(text, user_id=OWNER)
            await h.settled()
        await h.stop()
    assert [t["x-iva-model"] for t in fake_eve.told("send")[-2:]] == ["local/tiny", "local/tiny"]
    assert ("Model: tiny — local/tiny, window 8 000 tokens (the default: “strong”, chosen here, is no longer offered)"
            in tg.texts(OWNER)[-1])
    assert "of 4 800 tokens" in tg.texts(OWNER)[-1]  # the default's threshold: 60% × 8 000
    assert watched.logs().count('"chat_model_gone_default_used"') == 1

    h = Harness(state, tg, fake_eve, IVA_MODELS=MODELS)
    await h.start()
    try:
        await tg.message("strong is back", user_id=OWNER)
        await h.settled()
        assert fake_eve.told("send")[-1]["x-iva-model"] == "anthropic/claude-strong"
    finally:
        await h.stop()


async def test_pushed_turns_and_reminders_use_the_chats_model(modelled: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """D1, D2: a pushed turn and a reminder falling due answer on the chat's model, as the
    owner's turns (no speaker), each named for what it is."""
    await tg.message("/model strong", user_id=OWNER)
    await tg.message("hello", user_id=OWNER)
    await modelled.settled()
    assert modelled.pushes is not None and modelled.reminders is not None
    await modelled.pushes.push_turn(str(OWNER), "nightly digest")
    await modelled.settled()
    assert fake_eve.told("send")[-1] == {"x-iva-model": "anthropic/claude-strong", "x-iva-chat": str(OWNER),
                                         "x-iva-role": "owner", "x-iva-turn": "pushed"}
    soon = datetime.fromtimestamp(time.time() + 60, UTC).isoformat()
    await modelled.reminders.set(str(OWNER), "water the plants", at=soon)
    modelled.wall = lambda: time.time() + 120  # the reminders' clock moved past it
    assert await modelled.reminders.fire_due()
    await modelled.settled()
    assert fake_eve.told("send")[-1]["x-iva-turn"] == "reminder"
    assert fake_eve.told("send")[-1]["x-iva-model"] == "anthropic/claude-strong"


async def test_the_threshold_follows_the_window_and_a_smaller_one_compacts_before_the_next_turn(
        modelled: Harness, tg: FakeTelegram, fake_eve: FakeEve):
    """D3: a conversation of 50 000 tokens fits under fast's threshold (76 800); switched to tiny
    (threshold 4 800) it no longer fits: it is compacted at once, silently but for the switch's
    line, and the next message is answered after the compaction, on tiny."""
    await tg.message("big [[tokens=50000]]", user_id=OWNER)
    await modelled.settled()
    chat = await modelled.chat()
    assert chat.measurement == 50_000 and fake_eve.routes("compact") == []
    await tg.message("/model tiny", user_id=OWNER)
    await modelled.settled()
    assert tg.texts(OWNER)[-1] == (
        "From the next answer on, this conversation answers on tiny — local/tiny, window 8 000 tokens.\n"
        "Its window is smaller than this conversation fills (50 000 of 4 800 tokens): I'll compact the "
        "conversation first.")
    assert len(fake_eve.routes("compact")) == 1
    await tg.message("small now", user_id=OWNER)
    await modelled.settled()
    assert tg.texts(OWNER)[-1] == "echo: small now"
    assert fake_eve.told("send")[-1]["x-iva-model"] == "local/tiny"
    # Back to a bigger window: nothing to compact.
    await tg.message("/model strong", user_id=OWNER)
    await modelled.settled()
    assert len(fake_eve.routes("compact")) == 1 and "compact" not in tg.texts(OWNER)[-1]


async def test_the_rebuild_runs_on_the_notes_model_as_a_rebuild_turn(tg: FakeTelegram, fake_eve: FakeEve,
                                                                     in_process_factory: Any):
    """D4: the notebook's rebuild creates its throwaway session telling the channel it is the
    ``rebuild`` turn, on IVA_NOTES_MODEL (not the chat's own), with no speaker."""
    d = in_process_factory(listen=True, IVA_API_TOKEN=API_TOKEN, IVA_NOTES_ENABLED="1", IVA_MODELS=MODELS,
                           IVA_NOTES_MODEL="tiny")
    fake_eve.mcp_url = d.api_url + "/mcp"
    await d.start()
    await tg.message("/model strong", user_id=OWNER)
    await tg.message("hello", user_id=OWNER)
    await tg.wait_texts(2, timeout=30)
    await idle(tg, d)
    base = f"/v1/chats/{OWNER}/notes"
    for i in range(41):
        await api(d, "PUT", f"{base}/fact-{i}", {"body": f"fact {i}", "description": f"fact {i}"})
    await tg.message("trigger", user_id=OWNER)
    await tg.wait_for(lambda: any(h.get("x-iva-turn") == "rebuild" for h in fake_eve.told("create")), 30,
                      "the rebuild's session")
    rebuild = next(h for h in fake_eve.told("create") if h.get("x-iva-turn") == "rebuild")
    assert rebuild == {"x-iva-model": "local/tiny", "x-iva-chat": str(OWNER), "x-iva-turn": "rebuild"}
    assert fake_eve.told("send")[-1]["x-iva-model"] == "anthropic/claude-strong"  # the chat's own turns



def test_iva_models_is_read_with_one_clear_line_per_problem() -> None:
    """The format: name=model:window, comma-separated, the first the default; a model id may hold ':'."""
    models = read_models("fast=openai/gpt-x:128_000, local=ollama/llama3:8b:32000", "local")
    assert [(m.name, m.id, m.window) for m in models.entries] == [("fast", "openai/gpt-x", 128_000),
                                                                  ("local", "ollama/llama3:8b", 32_000)]
    assert models.default is not None and models.default.name == "fast"
    assert models.notes is not None and models.notes.name == "local"
    assert not read_models(None) and not read_models(" , ")
    from bridge.config import ConfigError, Settings
    with pytest.raises(ConfigError) as caught:
        read_models("fast, Big=a/b:1000, x=a b:1000, y=a/b:lots, z=a/b:10, w=a/b:2000, w=a/c:3000", "nope")
    assert caught.value.problems == [
        "IVA_MODELS: 'fast' is not name=model:window (e.g. fast=openai/gpt-5-mini:400000,"
        "strong=anthropic/claude-sonnet-4.5:200000)",
        "IVA_MODELS: the name 'Big' must be 1-32 of a-z 0-9 _ - (starting with a letter or digit): it is what "
        "people type after /model",
        "IVA_MODELS: x's model 'a b' must be eve's model id (no spaces, commas or '='), "
        "e.g. anthropic/claude-sonnet-4.5",
        "IVA_MODELS: y's window 'lots' is not a whole number of tokens",
        "IVA_MODELS: z's window 10 must be at least 1000 tokens",
        "IVA_MODELS: the name 'w' is given twice",
        "IVA_NOTES_MODEL='nope' must be one of IVA_MODELS' names (w)",
    ]
    env = {"IVA_TELEGRAM_TOKEN": "123456:AAEhBOweik6ad9r_QXMENQjcrGbqCr4K-bs", "IVA_EVE_URL": "http://127.0.0.1:1"}
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({**env, "IVA_MODELS": "a=b:1", "IVA_LANG": "de"})
    assert "IVA_MODELS: a's window 1 must be at least 1000 tokens" in caught.value.problems
    assert any(p.startswith("IVA_LANG=") for p in caught.value.problems)
    assert Settings.from_env({**env, "IVA_MODELS": MODELS}).models.names == ("fast", "strong", "tiny")


async def test_the_window_line_follows_the_chats_model(tg: FakeTelegram, fake_eve: FakeEve, in_process_factory: Any):
    """D3: the [window] line of an owner's turn measures against the chat's model's threshold:
    50 000 tokens are no pressure under big's 110 000, and 50 000 of 60 000 once the chat answers
    on small (window 100 000; still under its threshold, so nothing is compacted)."""
    d = in_process_factory(listen=True, IVA_API_TOKEN=API_TOKEN, IVA_NOTES_ENABLED="1",
                           IVA_MODELS="big=a/big:200000,small=a/small:100000")
    fake_eve.mcp_url = d.api_url + "/mcp"
    await d.start()

    async def context(text: str) -> str:
        await tg.message(text, user_id=OWNER)
        await d.settled()
        return str(fake_eve.sends()[-1]["clientContext"])

    assert "[window]" not in await context("one [[tokens=50000]]")
    assert "[window]" not in await context("two [[tokens=50000]]")
    await tg.message("/model small", user_id=OWNER)
    await d.settled()
    assert "compact" not in tg.texts(OWNER)[-1] and fake_eve.routes("compact") == []
    assert "50 000 of 60 000" in await context("three")
