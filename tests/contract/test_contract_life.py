"""The life of a chat on every eve (contract, SPEC V1): a streamed answer, a tool-using turn,
/compact, a question answered by button and by text, a restart of Iva mid-compaction, and (on
the real eves) eve killed mid-compaction. Each runs on the fake eve (stream version 27), the real
eve 0.80.1 (26) and the real eve 1.0.1 (27); the bridge in process (tests/harness.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from bridge.telegram.texts import t
from tests.conftest import OWNER

A = str(OWNER)


def compacting(c) -> bool:
    return bool(c) and c["status"] == "busy" and c["kind"] == "compact"


def eve_compacting(backend, before: int = 0) -> bool:
    """eve itself has begun the compaction (not only Iva's record): the summary is being written."""
    if backend.fake is not None:
        return any(s.compacting for s in backend.fake.sessions.values())
    return sum(1 for r in backend.real.llm_requests() if r.get("kind") == "compaction") > before


def summaries(backend) -> int:
    return 0 if backend.real is None else sum(1 for r in backend.real.llm_requests() if r.get("kind") == "compaction")


def ask(backend, question: str, options: list[str]) -> str:
    """The marker that makes the model ask (the fake eve's, or the real eve's ask_question tool)."""
    if backend.fake is not None:
        return f"[[ask={question}|{'|'.join(options)}]]"
    call = {"question": question, "options": [{"label": o, "description": f"the {o} one"} for o in options]}
    return f"[[call=ask_question {json.dumps(call)}]]"


@pytest.fixture
async def daemon(eve_in_process_factory, backend):
    d = eve_in_process_factory(backend.url, backend.token, backend.fake)
    await d.start()
    await d.h.daemon_steps()  # the window learned from eve's /info
    return d


async def test_a_streamed_answer_arrives_once(tg, backend, daemon):
    """T6/L1: an answer written word by word is one message, sent once."""
    await tg.message("stream these words please [[chunkdelay=0.1]]", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await daemon.settled()
    assert tg.texts() == ["echo: stream these words please"]


async def test_a_tool_using_turn_is_answered_once(tg, backend, daemon):
    """A turn whose model calls a tool first: one answer, after the tool."""
    await tg.message("use the tool [[tool=noop]]", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await daemon.settled()
    # the scripted model's words after a tool: "echo: …" on the fake, "tool done: …" on fake_llm.py
    assert tg.texts() == [("echo: " if backend.fake is not None else "tool done: ") + "use the tool"]
    assert daemon.chat(A)["status"] == "idle"


async def test_compact_on_demand(tg, backend, daemon):
    """M1/M5: /compact after a long turn: accepted with the size, done, the chat free."""
    await tg.message("a long one [[tokens=60000]]", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await tg.wait_for(lambda: daemon.chat(A)["status"] == "idle", 30, "idle")
    await tg.message("/compact", user_id=OWNER)
    done = t("compact_done", "en")
    await tg.wait_for(lambda: done in tg.texts(), 60, "the compaction done")
    await tg.wait_for(lambda: daemon.chat(A)["status"] == "idle", 30, "idle")
    assert tg.texts()[1].startswith("Compacting the conversation (60") and daemon.chat(A)["compactions"] == 1


@pytest.mark.parametrize("how", ["button", "text"])
async def test_a_question_is_answered_by_button_or_by_text(tg, backend, daemon, how):
    """T5/V6: the model asks; the question shows with its options as buttons; a press, or the
    person's next message, answers it; the turn goes on to one answer and the chat is free."""
    await tg.message(f"pick a colour {ask(backend, 'Which colour?', ['Red', 'Blue'])}", user_id=OWNER)
    await tg.wait_for(lambda: any(m.get("reply_markup") for m in tg.sent(OWNER)), 40, "the question")
    prompt = next(m for m in tg.sent(OWNER) if m.get("reply_markup"))
    assert prompt["text"] == "Which colour?"
    labels = [b["text"] for row in prompt["reply_markup"]["inline_keyboard"] for b in row]
    assert labels == ["Red", "Blue"]
    if how == "button":
        await tg.press(prompt, "Red", user_id=OWNER)
    else:
        await tg.message("Blue", user_id=OWNER)
    await tg.wait_for(lambda: len(tg.texts()) >= 2, 40, "the answer after the question")
    await tg.wait_for(lambda: daemon.chat(A)["status"] == "idle", 40, "idle")
    await daemon.settled()
    answers = tg.texts()[1:]
    assert len(answers) == 1 and "failed" not in answers[0].lower()
    chosen = "Red" if how == "button" else "Blue"
    if backend.real is not None:  # the model got the person's answer as the tool's result
        assert any(chosen in json.dumps(r) for r in backend.real.llm_requests()[-3:])
    else:
        assert chosen.lower() in answers[0].lower()


@pytest.mark.parametrize("press", ["Approve", "Deny"])
async def test_an_approval_is_answered_by_button(tg, backend, daemon, press):
    """V6: a tool that needs approval pauses the turn; the approval shows with its two buttons; a
    press answers it (eve runs the tool, or tells the model it was denied) and the turn ends in
    one answer."""
    if backend.fake is not None:
        marker = "[[ask=Approve Guarded?|approve|cancel]] [[askkind=tool-approval]]"
    else:
        marker = '[[call=guarded {"what": "x"}]]'
    await tg.message(f"guarded job {marker}", user_id=OWNER)
    await tg.wait_for(lambda: any(m.get("reply_markup") for m in tg.sent(OWNER)), 40, "the approval")
    prompt = next(m for m in tg.sent(OWNER) if m.get("reply_markup"))
    labels = [b["text"] for row in prompt["reply_markup"]["inline_keyboard"] for b in row]
    assert labels in (["Approve", "Deny"], ["Approve", "Cancel"]), labels  # 0.80.1 says Cancel
    await tg.press(prompt, labels[0] if press == "Approve" else labels[1], user_id=OWNER)
    await tg.wait_for(lambda: len(tg.texts()) >= 2, 40, "the answer after the approval")
    await tg.wait_for(lambda: daemon.chat(A)["status"] == "idle", 40, "idle")
    await daemon.settled()
    answers = tg.texts()[1:]
    assert len(answers) == 1 and "failed" not in answers[0].lower(), answers
    if backend.real is not None:  # the model got the tool's result, or the denial
        result = json.dumps(backend.real.llm_requests()[-1])
        assert ("denied" in result.lower()) == (press == "Deny"), result[-500:]


async def test_a_restart_of_iva_mid_turn_answers_once(tg, backend, eve_in_process_factory):
    """R2/T7 on every eve: Iva stopped while eve runs a turn; started again, it reads the stream
    from the cursor and answers once, in the same session."""
    d = eve_in_process_factory(backend.url, backend.token, backend.fake)
    await d.start()
    await tg.message("warm up", user_id=OWNER)
    await tg.wait_texts(1, timeout=30)
    await d.settled()
    session = d.chat(A)["eve_session"]
    await tg.message("slow restart turn [[delay=3]]", user_id=OWNER)
    await tg.wait_for(lambda: backend.running("slow restart turn"), 30, "eve running the turn")
    await d.h.stop()  # the graceful stop SIGTERM makes: the record stays busy(turn)
    await d.start()
    await tg.wait_for(lambda: "echo: slow restart turn" in tg.texts(), 40, "the answer after the restart")
    await d.settled()
    assert tg.texts() == ["echo: warm up", "echo: slow restart turn"]
    assert d.chat(A)["eve_session"] == session


async def test_a_restart_of_iva_mid_compaction_finishes_it(tg, backend, eve_in_process_factory):
    """R2 on every eve: Iva stopped while eve compacts; started again, it follows the compaction
    from the cursor to its end, once; the next message is answered after it."""
    d = eve_in_process_factory(backend.url, backend.token, backend.fake)
    await d.start()
    await d.h.daemon_steps()
    backend.slow_summary(4)
    before = summaries(backend)
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await tg.wait_for(lambda: compacting(d.chat(A)) and eve_compacting(backend, before), 40, "eve compacting")
    await d.h.stop()  # the graceful stop SIGTERM makes: the record stays busy(compacting)
    await d.start()
    await tg.wait_for(lambda: d.chat(A)["status"] == "idle", 60, "the compaction followed to its end")
    assert d.chat(A)["compactions"] == 1
    await tg.message("after", user_id=OWNER)
    await tg.wait_for(lambda: "echo: after" in tg.texts(), 40, "the next answer")
    await d.settled()
    assert tg.texts() == ["echo: big", "echo: after"]


async def test_eve_killed_mid_compaction_frees_the_chat(tg, backend, eve_in_process_factory):
    """eve SIGKILLed while it compacts, restarted on its store. eve 1.x ends the compaction
    interrupted (PROTOCOL-27.md §10): the chat is free at once, the conversation as it was. eve
    0.80 leaves the session stuck (PROTOCOL.md §9): the busy timeout frees the chat, silently
    (an auto compaction, C11). Either way the next message is answered, once."""
    if backend.real is None:
        pytest.skip("a real eve's crash: the fake has no process to kill")
    d = eve_in_process_factory(backend.url, backend.token, None, IVA_BUSY_TIMEOUT="10")
    await d.start()
    await d.h.daemon_steps()
    backend.slow_summary(8)
    before = summaries(backend)
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await tg.wait_for(lambda: compacting(d.chat(A)) and eve_compacting(backend, before), 40, "eve compacting")
    await asyncio.to_thread(backend.real.restart_eve, kill=True)
    await tg.wait_for(lambda: d.chat(A)["status"] == "idle", 90, "the chat free again")
    assert tg.texts() == ["echo: big"]  # an auto compaction is silent, ended or lost (C11)
    await tg.message("after", user_id=OWNER)
    await tg.wait_for(lambda: "echo: after" in tg.texts(), 60, "the next answer")
    await d.settled()
    assert tg.texts() == ["echo: big", "echo: after"]
