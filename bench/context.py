"""Benchmark 5: the context economy — the point of parking compaction.

A scripted "day" of N turns (default 300) through the REAL eve from ../shared/eve-peer — eve
1.0.1 by default, 0.80.1 with ``--eve-version 0.80.1`` (EVE_VERSION for the peer's scripts) — with
the window at 1 000 000 and eve's own in-turn compaction at 90% (`EVE_COMPACTION_THRESHOLD=0.9`;
start.sh writes it as `compaction.threshold` for 1.x, `thresholdPercent` for 0.x). Every
turn is a ~12 000-character message (a pasted log, a document); the scripted model reports input
tokens estimated from the real request (the whole history eve sends, clientContext and tool
schemas included), so the sizes grow with the real history. The same day runs twice in one
benchmark, against the same eve build:

- eve alone: Iva's parking compaction as good as off (``IVA_COMPACT_PERCENT=100``: it would
  park at 100% of the window), so eve's in-turn compaction at 900 000 tokens fires first;
- Iva: parking compaction on with its defaults (min(60% × window, 110 000) = 110 000).

The person pauses ``--think`` seconds between a reply and the next message, and every summary
takes ``--summary-delay`` seconds, so a message sent while Iva compacts shows the C3 path. eve's
session budget (0.80's session-limit question, 1.x's ``budget`` interaction; 40 million input
tokens by default) reaches the chat as a message with buttons: the bench presses Approve, as the
person would, and counts them.

    python -m bench.context [--eve-version 1.0.1] [--turns 300] [--chars 12000] [--think 1.0] [--summary-delay 2.0]

A tool-using day (``--tools N --tool-tokens T``; the one reported is ``--tools 2 --tool-tokens
8000``): every turn makes N tool calls, so it has N + 1 model calls, and each call with its
result adds ~T tokens of real text to the history: the call is an ``eve__tool`` call whose input
holds ~T/2 tokens, which eve refuses (no such tool) with an error quoting that input. So eve
estimates, keeps and compacts that text as it would a real tool's output, and the reported inputs
are the fake's estimates of the real requests, as on the plain day.

``--scripted`` is the earlier form of that day: ``noop`` calls (which add nothing to the history)
and ``[[steps=A,B,C]]`` markers reporting the inputs, the conversation's size kept by the bench
(back to ``SUMMARY_TOKENS`` when Iva or eve compacted). Neither eve decides its compaction from
those reported numbers in these turns — both compact on their own estimate of the history, which
stays small — so in that form "eve alone" never compacts and only Iva's parking at 100% of the
window bounds it: it measures Iva at 110 000 against Iva at 1 000 000, not against eve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import ROOT, Daemon, FakeTelegram, free_port, save, table, tmpdir

EVE_PEER = Path(os.environ.get("IVA_EVE_PEER_DIR", ROOT.parent / "shared" / "eve-peer"))
WINDOW = 1_000_000
EVE_THRESHOLD = 0.9  # eve's own compaction (EVE_COMPACTION_THRESHOLD): eve's default
DEFAULT_EVE = "1.0.1"  # what `npm install eve` gives today; 0.80.1 is the other one eve-peer runs
NOTICE = "Compacting the conversation, I'll answer soon."
SUMMARY_TOKENS = 4_000  # a conversation just compacted: the system part, the tools, the summary
WORDS = ("request handled in ms status ok user session cache miss retry backoff queue depth worker "
         "commit fsync latency error timeout upstream gateway token window summary parking").split()


def paste(turn: int, chars: int) -> str:
    """A deterministic ~``chars``-character message, different every turn."""
    rng = random.Random(turn)
    out: list[str] = [f"turn {turn}: here is the next part of the log, keep it in mind."]
    size = len(out[0])
    while size < chars:
        line = f"{rng.randint(10, 23)}:{rng.randint(10, 59)} " + " ".join(rng.choice(WORDS) for _ in range(12))
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:chars]


def llm(base: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


def start_eve(run_dir: Path, mcp_listen: str, eve_version: str = DEFAULT_EVE) -> dict[str, str]:
    # EVE_VERSION picks the peer's home (both versions live side by side) and the agent's
    # compaction key: start.sh writes compaction.threshold for eve 1.x, thresholdPercent for 0.x.
    env = {**os.environ, "EVE_VERSION": eve_version, "EVE_PORT": str(free_port()), "FAKE_LLM_PORT": str(free_port()),
           "EVE_PEER_RUN_DIR": str(run_dir), "EVE_CONTEXT_WINDOW": str(WINDOW),
           "EVE_COMPACTION_THRESHOLD": str(EVE_THRESHOLD),
           "NOTEBOOK_MCP_URL": f"http://{mcp_listen}/mcp"}
    # setup.sh is idempotent (0 s when eve-peer is installed), so a clean clone needs nothing else.
    setup = subprocess.run(["bash", str(EVE_PEER / "setup.sh")], env=env, capture_output=True, text=True,
                           timeout=900, stdin=subprocess.DEVNULL)
    if setup.returncode != 0:
        raise SystemExit(f"eve-peer setup failed:\n{setup.stdout}\n{setup.stderr}")
    done = subprocess.run(["bash", str(EVE_PEER / "start.sh")], env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"eve-peer did not start:\n{done.stdout}\n{done.stderr}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    if values.get("EVE_VERSION") != eve_version:
        raise SystemExit(f"eve-peer runs eve {values.get('EVE_VERSION')}, not {eve_version}")
    values["_env"] = json.dumps({k: env[k] for k in ("EVE_VERSION", "EVE_PORT", "FAKE_LLM_PORT", "EVE_PEER_RUN_DIR")})
    return values


def stop_eve(values: dict[str, str]) -> None:
    env = {**os.environ, **json.loads(values["_env"])}
    subprocess.run(["bash", str(EVE_PEER / "stop.sh")], env=env, capture_output=True, timeout=60,
                   stdin=subprocess.DEVNULL)


async def day(name: str, peer: dict[str, str], mcp_listen: str, *, turns: int, chars: int, think: float,
              summary_delay: float, parking: bool, ceiling: int | None = None, tools: int = 0,
              tool_tokens: int = 0, scripted: bool = False, eve_version: str = DEFAULT_EVE) -> dict[str, Any]:
    llm_url = peer["FAKE_LLM_BASE_URL"]
    llm(llm_url, "/control", {"reset": True})
    llm(llm_url, "/control", {"summary_delay": summary_delay})
    llm(llm_url, "/requests/clear", {})
    tg = FakeTelegram()
    await tg.start()
    state = tmpdir()
    env: dict[str, str] = {"IVA_API_LISTEN": mcp_listen}
    if not parking:
        env.update(IVA_COMPACT_PERCENT="100", IVA_COMPACT_CEILING=str(10 * WINDOW))  # never parks
    elif ceiling:
        env.update(IVA_COMPACT_CEILING=str(ceiling))
    daemon = Daemon(tg, _Eve(peer["EVE_BASE_URL"], peer["EVE_PEER_TOKEN"]), state, **env)  # type: ignore[arg-type]
    await daemon.start()
    latencies: list[float] = []
    windows: list[tuple[float, float]] = []  # (message sent, reply seen), wall clock like the model's log
    noticed = 0
    pressed: set[int] = set()
    prompts: list[dict[str, Any]] = []
    prompt_waits: list[float] = []
    t_start = time.monotonic()
    size, seen_compactions = SUMMARY_TOKENS, 0  # the tool-using day's conversation, as the bench keeps it
    try:
        for turn in range(turns):
            text = paste(turn, chars)
            if tools and not scripted:
                # Real tool traffic: each of the model's N calls is an eve__tool call whose input
                # holds ~T/2 tokens of text; eve refuses the unknown tool with an error that quotes
                # that input, so the call and its result add ~T tokens to the history eve keeps,
                # estimates and compacts, and every reported input is the fake's estimate of the
                # real request, as on the plain day. (A noop call's input is parsed to {} and its
                # output is {"ok":true}: it adds nothing.)
                llm(llm_url, "/control", {"next_tool_calls": [
                    {"name": "eve__tool", "arguments": {"name": "bench_output",
                                                        "input": {"output": paste(turn * 1000 + k + 1, 2 * tool_tokens)}}}
                    for k in range(tools)]})
            elif tools:
                compactions_now, compacting = _compactions(state)
                if compactions_now > seen_compactions or compacting:
                    size, seen_compactions = SUMMARY_TOKENS, compactions_now + int(compacting)
                first = size + chars // 4
                steps = [first + k * tool_tokens for k in range(tools + 1)]
                size = steps[-1] + 50
                text += f"\n[[steps={','.join(map(str, steps))}]]" + " [[call=noop]]" * tools
            before = tg.sent_count
            notices_before = tg.texts().count(NOTICE)
            t0 = time.monotonic()
            sent_wall = time.time()
            await tg.message(text, user_id=1)
            # The reply is the scripted model's echo; a prompt with buttons on the way (eve's
            # session-limit guardrail) is approved the way the person would, and counted.
            while not any(t.startswith(("echo:", "tool done")) for t in tg.texts()[before:]):
                for sent in tg.sent()[before:]:
                    if sent.get("reply_markup") and id(sent) not in pressed:
                        pressed.add(id(sent))
                        prompts.append({"turn": turn, "text": sent["text"][:200]})
                        stalled_at = time.monotonic()
                        await tg.press(sent, "Approve", user_id=1)
                        prompt_waits.append(stalled_at - t0)
                await tg.wait_for(lambda n=len(tg.sent()): len(tg.sent()) > n, 300, f"reply {turn}")
            latencies.append(time.monotonic() - t0)
            windows.append((sent_wall, time.time()))
            noticed += tg.texts().count(NOTICE) - notices_before
            if (turn + 1) % 25 == 0:
                print(f"  {name}: {turn + 1}/{turns} turns, {time.monotonic() - t_start:.0f} s", flush=True)
            await asyncio.sleep(think)
        # Let a last parking compaction finish before reading the log.
        await tg.wait_for(lambda: _idle(state), 120, "idle")
        parking_off = _parking_off(state)
    finally:
        await daemon.stop()
        await tg.stop()
    requests = llm(llm_url, "/requests")
    requests = requests["requests"] if isinstance(requests, dict) else requests
    chat = [r for r in requests if r["kind"] == "chat"]
    compactions = [i for i, r in enumerate(requests) if r["kind"] == "compaction"]
    threshold = (ceiling or min(int(0.6 * WINDOW), 110_000)) if parking else int(EVE_THRESHOLD * WINDOW)
    ineffective = 0
    for i in compactions:
        following = next((r for r in requests[i + 1:] if r["kind"] == "chat"), None)
        if following is not None and following["prompt_tokens"] >= threshold:
            ineffective += 1
    # A compaction that runs while a message waits for its reply delays that reply with nothing
    # said: a user-visible wait. eve's own compactions run inside turns; Iva's run between them,
    # and a message that arrives meanwhile gets the C3 notice.
    in_turn = [requests[i] for i in compactions if any(a <= requests[i]["at"] <= b for a, b in windows)]
    median = sorted(latencies)[len(latencies) // 2]
    return {
        "run": name, "turns": turns, "chars_per_turn": chars, "think_s": think, "summary_delay_s": summary_delay,
        "tools_per_turn": tools, "tokens_per_tool_output": tool_tokens, "parking_turned_off": parking_off,
        "eve_version": eve_version, "tool_inputs": ("scripted [[steps]]" if scripted else "real") if tools else None,
        "threshold": threshold, "model_calls": len(chat),
        "max_input_tokens_per_step": max(r["prompt_tokens"] for r in chat),
        "total_input_tokens": sum(r["prompt_tokens"] for r in chat),
        "compactions": len(compactions), "ineffective_compactions": ineffective,
        "compactions_while_a_reply_was_awaited": len(in_turn),
        "of_those_explained_by_the_notice": min(len(in_turn), noticed),
        "messages_that_met_a_compaction_notice": noticed,
        "eve_prompts_the_person_had_to_answer": len(prompts), "prompts": prompts,
        "prompt_seen_after_s": [round(w, 2) for w in prompt_waits],
        "reply_latency_s": {"p50": round(median, 3), "max": round(max(latencies), 3)},
        "wall_s": round(time.monotonic() - t_start, 1),
    }


def _idle(state: Path) -> bool:
    import sqlite3

    conn = sqlite3.connect(state / "iva.sqlite3")
    try:
        return conn.execute("SELECT count(*) FROM chats WHERE status = 'busy'").fetchone()[0] == 0
    finally:
        conn.close()


def _compactions(state: Path) -> tuple[int, bool]:
    """The chat's compactions so far (Iva's and eve's in-turn ones), and whether one runs now."""
    import sqlite3

    conn = sqlite3.connect(state / "iva.sqlite3")
    try:
        row = conn.execute("SELECT compactions, status = 'busy' AND kind = 'compact' FROM chats").fetchone()
        return (0, False) if row is None else (int(row[0]), bool(row[1]))
    finally:
        conn.close()


def _parking_off(state: Path) -> bool:
    import sqlite3

    conn = sqlite3.connect(state / "iva.sqlite3")
    try:
        row = conn.execute("SELECT compaction_disabled FROM chats").fetchone()
        return bool(row and row[0])
    finally:
        conn.close()


class _Eve:
    """What bench.common.Daemon needs of an eve: its URL and token."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token


def main() -> None:
    global WINDOW
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--chars", type=int, default=12_000)
    parser.add_argument("--think", type=float, default=1.0)
    parser.add_argument("--summary-delay", type=float, default=2.0)
    parser.add_argument("--only", choices=["eve", "iva"])
    parser.add_argument("--ceiling", type=int, help="IVA_COMPACT_CEILING for the Iva run (default 110 000)")
    parser.add_argument("--tools", type=int, default=0, help="tool calls per turn (a tool-using day; see the docstring)")
    parser.add_argument("--tool-tokens", type=int, default=8_000, help="tokens each call and its result add to the history")
    parser.add_argument("--scripted", action="store_true",
                        help="tool-using day: report the steps' inputs by [[steps=…]] instead of sending real tool traffic")
    parser.add_argument("--eve-version", default=DEFAULT_EVE, choices=["1.0.1", "0.80.1"],
                        help="the real eve to run (EVE_VERSION for ../shared/eve-peer's scripts)")
    parser.add_argument("--window", type=int, default=WINDOW,
                        help="the model's context window (EVE_CONTEXT_WINDOW); a smaller one reaches eve's own compaction sooner")
    parser.add_argument("--out", help="the result's name in bench/results/ (default from the options)")
    args = parser.parse_args()
    WINDOW = args.window
    mcp_listen = f"127.0.0.1:{free_port()}"
    peer = start_eve(tmpdir(), mcp_listen, args.eve_version)
    print(f"eve {peer['EVE_VERSION']} at {peer['EVE_BASE_URL']}", flush=True)
    runs = []
    try:
        for name, parking in (("eve alone", False), ("iva", True)):
            if args.only and not name.startswith(args.only):
                continue
            print(f"{name}: {args.turns} turns of {args.chars} characters", flush=True)
            runs.append(asyncio.run(day(name, peer, mcp_listen, turns=args.turns, chars=args.chars, think=args.think,
                                        summary_delay=args.summary_delay, parking=parking,
                                        ceiling=args.ceiling, tools=args.tools, tool_tokens=args.tool_tokens,
                                        scripted=args.scripted, eve_version=peer["EVE_VERSION"])))
    finally:
        stop_eve(peer)
    rows = [("metric", *(r["run"] for r in runs))]
    for key in ("max_input_tokens_per_step", "total_input_tokens", "model_calls", "compactions",
                "ineffective_compactions", "compactions_while_a_reply_was_awaited",
                "of_those_explained_by_the_notice", "messages_that_met_a_compaction_notice",
                "eve_prompts_the_person_had_to_answer", "parking_turned_off", "wall_s"):
        rows.append((key, *(f"{r[key]:,}".replace(",", " ") if isinstance(r[key], int) else str(r[key]) for r in runs)))
    result: dict[str, Any] = {"eve_version": peer["EVE_VERSION"], "runs": runs}
    if len(runs) == 2:
        ratio = runs[1]["total_input_tokens"] / runs[0]["total_input_tokens"]
        result["iva_total_vs_eve_alone"] = round(ratio, 4)
        rows.append(("iva total / eve alone", "", f"{ratio:.1%}"))
    print(table(rows))
    name = args.out or ("context" + (f"-ceiling{args.ceiling}" if args.ceiling else "")
                        + (f"-tools{args.tools}" if args.tools else "") + ("-scripted" if args.scripted else "") + f"-{peer['EVE_VERSION']}"
                        + (f"-{args.turns}turns" if args.turns != 300 else ""))
    print(f"written to {save(name, result)}")


if __name__ == "__main__":
    main()
