"""Benchmark 8 (issue 13, L*): time to first visible text, and Bot API calls, with live drafts on and off.

``python -m bench.live`` runs the real daemon against the fakes twice in one run, first with
``IVA_STREAMING=draft`` and then with ``IVA_STREAMING=off``. Each time ``--chats`` people (private
chats) ask ``--answers`` questions in all, one after another per chat and the chats at once; each
answer is about ``--chars`` characters that the fake eve streams word by word, one
``message.appended`` delta every ``--pace`` seconds (``[[chunkdelay=S]] [[reply=TEXT]]``). By
default the fake eve's first delta comes at once after the send is accepted (the bridge is still
finishing its own side of the send then: its worst case); ``--ttft S`` makes eve think S seconds
first (``[[delay=S]]``, a model's time to first token), which isolates the delta → frame path.

Per answer, every time taken in this process (the fakes' ``time.monotonic()``):

- t0 — the fake eve emits the answer's first ``message.appended`` (``FakeEve.first_delta_at``);
- t_visible — the fake Bot API receives the first ``sendMessageDraft`` of that chat after t0 whose
  text begins the answer (drafts on), or the final ``sendMessage`` with the whole answer (off);
- the final — the fake Bot API receives the ``sendMessage`` with the whole answer, against the
  fake eve's ``message.completed`` (what drafts cost the final message: ``Draft.settle``).

Bot API calls (``sendMessageDraft``, ``sendMessage``, ``sendChatAction``, and any other method
but ``getUpdates``) are counted over the measured answers, warm-up excluded, per 1 000
characters of answer.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from collections import Counter
from typing import Any

from bench.common import dist_ms, save, stack, table, teardown

VISIBLE = ("sendMessageDraft", "sendMessage", "sendChatAction")
WORDS = ("the", "a", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "this", "you",
         "can", "be", "your", "note", "answer", "message", "because", "between", "question", "usually",
         "something", "different", "important", "remember", "tomorrow", "together", "morning", "evening",
         "probably", "language", "weather", "kitchen", "library", "window", "garden", "travel", "simple",
         "already", "another", "problem", "example", "however", "although", "perhaps", "without")


def answer_text(tag: str, chars: int, rng: random.Random) -> str:
    """About ``chars`` characters of words and punctuation, unique by ``tag``; no ``]`` (a marker)."""
    words = [f"{tag}:"]
    length = len(words[0])
    while length < chars:
        word = rng.choice(WORDS)
        if rng.random() < 0.08:
            word += rng.choice(",.")
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


async def one_mode(mode: str, answers: int, chats: int, chars: int, pace: float, gap: float, ttft: float,
                   seed: int) -> dict[str, Any]:
    tg, eve, daemon, _, users = await stack(chats, IVA_STREAMING=mode)
    await daemon.start()
    rng = random.Random(seed)
    per_chat = max(1, answers // chats)
    replies = {u: [answer_text(f"{mode}{u}.{n}", chars, rng) for n in range(per_chat)] for u in users}
    try:
        # Warm-up: one short turn per chat (the eve session is created), not measured.
        for u in users:
            await tg.message(f"warm {u}", user_id=u)
        await tg.wait_sent(lambda: all(f"echo: warm {u}" in tg.sent_texts for u in users), 60)
        await asyncio.sleep(max(gap, 0.5))  # the warm-up busy periods end (typing stopped, parked)
        mark = len(tg.calls)
        cpu0 = daemon.cpu_seconds()
        started = time.monotonic()

        async def person(u: int) -> None:
            for reply in replies[u]:
                delay = f" [[delay={ttft}]]" if ttft else ""
                await tg.message(f"[[chunkdelay={pace}]]{delay} [[reply={reply}]]", user_id=u)
                await tg.wait_sent(lambda r=reply: r in tg.sent_texts, 120)
                await asyncio.sleep(gap)  # the person reads before writing again

        await asyncio.gather(*(person(u) for u in users))
        wall = time.monotonic() - started
        await asyncio.sleep(0.5)  # a frame landing after the final would be counted (and reported)
        cpu = daemon.cpu_seconds() - cpu0
        calls = tg.calls[mark:]
    finally:
        await teardown(daemon, tg, eve)

    visible: list[float] = []
    final_after_completed: list[float] = []
    whole_text: list[float] = []
    frames_per_answer: list[int] = []
    frame_gaps: list[float] = []
    late_frames = 0
    raw: list[dict[str, Any]] = []
    drafts_by_chat: dict[int, list[Any]] = {}
    for c in calls:
        if c.method == "sendMessageDraft" and c.params.get("_ok"):
            drafts_by_chat.setdefault(int(c.params["chat_id"]), []).append(c)
    for u in users:
        for reply in replies[u]:
            t0, sent, completed = eve.first_delta_at[reply], tg.sent_texts[reply], eve.completed_at[reply]
            whole_text.append(sent - t0)
            final_after_completed.append(sent - completed)
            frames = [c for c in drafts_by_chat.get(u, []) if t0 <= c.at <= sent + 0.5
                      and reply.startswith(str(c.params.get("text", "")))]
            late_frames += sum(1 for c in frames if c.at > sent)
            frames = [c for c in frames if c.at <= sent]
            frames_per_answer.append(len(frames))
            frame_gaps += [b.at - a.at for a, b in itertools.pairwise(frames)]
            if mode == "off":
                visible.append(sent - t0)
            elif frames:
                visible.append(frames[0].at - t0)
            else:  # no frame at all: the first visible text was the final message
                visible.append(sent - t0)
            # Per answer, ms from eve's first delta: the first visible text, message.completed, the
            # final sendMessage, the last frame before it.
            raw.append({"chat": u, "chars": len(reply), "visible_ms": round(visible[-1] * 1000, 3),
                        "completed_ms": round((completed - t0) * 1000, 3), "final_ms": round((sent - t0) * 1000, 3),
                        "last_frame_ms": round((frames[-1].at - t0) * 1000, 3) if frames else None,
                        "frames": len(frames)})
    by_method = Counter(c.method for c in calls if c.method != "getUpdates")
    total_chars = sum(len(r) for rs in replies.values() for r in rs)
    n = len(whole_text)
    return {
        "mode": mode, "answers": n, "chats": chats, "chars_per_answer_mean": round(total_chars / n, 1),
        "deltas_per_answer_mean": round(statistics.fmean(len(r.split(" ")) for rs in replies.values() for r in rs), 1),
        "pace_s": pace, "wall_s": round(wall, 1), "cpu_ms_per_answer": round(cpu * 1000 / n, 2),
        "first_visible": dist_ms(visible),
        "whole_text": dist_ms(whole_text),
        "final_after_completed": dist_ms(final_after_completed),
        "frames_per_answer_mean": round(statistics.fmean(frames_per_answer), 2),
        "answers_without_a_frame": sum(1 for f in frames_per_answer if not f),
        "frame_gap": dist_ms(frame_gaps) if frame_gaps else None,
        "frame_gap_min_ms": round(min(frame_gaps) * 1000, 3) if frame_gaps else None,
        "frames_after_the_final": late_frames,
        "calls_by_method": dict(by_method),
        "calls_per_1000_chars": {m: round(by_method[m] * 1000 / total_chars, 2) for m in VISIBLE},
        "visible_calls_per_1000_chars": round(sum(by_method[m] for m in VISIBLE) * 1000 / total_chars, 2),
        "per_answer": raw,
    }


async def run(answers: int, chats: int, chars: int, pace: float, gap: float, ttft: float) -> dict[str, Any]:
    load_before = _load()
    on = await one_mode("draft", answers, chats, chars, pace, gap, ttft, seed=13)
    off = await one_mode("off", answers, chats, chars, pace, gap, ttft, seed=13)
    p50_on, p50_off = on["first_visible"]["p50"], off["first_visible"]["p50"]
    return {"answers": answers, "chats": chats, "chars": chars, "pace_s": pace, "gap_s": gap, "ttft_s": ttft,
            "load_before": load_before, "draft": on, "off": off,
            "first_visible_p50_ratio_off_over_draft": round(p50_off / p50_on, 1) if p50_on else None,
            "first_visible_p50_ratio_draft_over_off": round(p50_on / p50_off, 4) if p50_off else None,
            "goal_p50_with_drafts_le_500ms": p50_on <= 500}


def _load() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers", type=int, default=32, help="answers per mode, in all")
    parser.add_argument("--chats", type=int, default=4, help="private chats at once")
    parser.add_argument("--chars", type=int, default=1000, help="characters per answer, about")
    parser.add_argument("--pace", type=float, default=0.03, help="seconds between two deltas (one word each)")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds a person waits before the next question")
    parser.add_argument("--ttft", type=float, default=0.0,
                        help="seconds eve waits before the first delta ([[delay=S]]; 0: at once, the bridge's worst case)")
    args = parser.parse_args()
    result = asyncio.run(run(args.answers, args.chats, args.chars, args.pace, args.gap, args.ttft))
    result["load_after"] = _load()
    path = save(f"live-ttft{args.ttft:g}" if args.ttft else "live", result)
    on, off = result["draft"], result["off"]

    def ms(d: dict[str, Any]) -> str:
        return f"{d['p50']} / {d['p99']}"

    rows = [("", "IVA_STREAMING=draft", "IVA_STREAMING=off"),
            ("first visible text p50 / p99 ms", ms(on["first_visible"]), ms(off["first_visible"])),
            ("whole text (final sendMessage) p50 / p99 ms", ms(on["whole_text"]), ms(off["whole_text"])),
            ("message.completed → sendMessage p50 / p99 ms", ms(on["final_after_completed"]),
             ms(off["final_after_completed"])),
            ("drafts / sendMessage / sendChatAction per 1 000 chars",
             " / ".join(str(on["calls_per_1000_chars"][m]) for m in VISIBLE),
             " / ".join(str(off["calls_per_1000_chars"][m]) for m in VISIBLE)),
            ("Bot API calls per 1 000 chars", str(on["visible_calls_per_1000_chars"]),
             str(off["visible_calls_per_1000_chars"])),
            ("frames per answer (min gap ms)", f"{on['frames_per_answer_mean']} ({on['frame_gap_min_ms']})", "0"),
            ("CPU per answer ms", str(on["cpu_ms_per_answer"]), str(off["cpu_ms_per_answer"]))]
    print(table(rows))
    print(f"first visible text p50: off / draft = {result['first_visible_p50_ratio_off_over_draft']}×; "
          f"goal ≤ 500 ms with drafts: {'met' if result['goal_p50_with_drafts_le_500ms'] else 'NOT met'}")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
