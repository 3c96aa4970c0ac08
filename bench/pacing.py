"""Pacing benchmarks (issue 23, Q1–Q4): the real daemon against the fake Bot API with Telegram's
flood limits on (``FloodLimits``: 30 messages in any second, 20 in any minute to one group, one a
second to one private chat with a burst of 4), each scenario run twice in one run, side by side:

- **paced** — the product's defaults (``IVA_SEND_*``, ``IVA_DRAFT_RATE``: Telegram's limits);
- **unpaced** — the pacer's budgets opened wide, as before it: every chat sends as fast as it can
  and only reacts to a 429 (its chat waits ``retry_after``).

Scenarios (``--only 1,2,3``):

1. ``--chats`` (200) private chats answered at once, 3-part answers: 429s (goal 0), the time from
   the first part to the last against the floor of the global limit (``(parts - 1) / 30`` s, goal
   ≤ 1.15×), and every chat's parts whole, once, in order.
2. A forum receiving ``--group-answers`` (40) answers in ``--group-seconds`` (60): one question
   per topic, spread evenly (each topic is its own conversation, all share the group's budget):
   429s (goal 0), how long the last answer waited.
3. ``--streams`` (16) chats streaming drafts for ``--stream-seconds`` (60): draft frames a second
   overall and per chat, 429s, and the time from eve's ``message.completed`` to the final's
   ``sendMessage`` (goal: drafts never delay finals) — also run paced with drafts off, the
   baseline of that goal (the 16 finals come at once: the global budget spaces them either way).

``nice python -m bench.pacing`` (the default sizes; ``--quick`` for a smaller run).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from typing import Any

from bench.common import dist_ms, save, stack, table, teardown
from tests.fakes.telegram import BOT_USERNAME, UNPACED, FakeTelegram, FloodLimits

FLOOR_RATE = 30.0
MENTION = [{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}]
GROUP = -100900


def answer(tag: str, parts: int) -> str:
    """An answer of ``parts`` messages (paragraphs of ~3000 characters: one message each)."""
    return "\n\n".join(f"{tag} part{i} " + "lorem ipsum " * 250 for i in range(parts))


def oks(tg: FakeTelegram, method: str = "sendMessage") -> list[Any]:
    return [c for c in tg.calls if c.method == method and c.params.get("_ok")]


async def limited_stack(chats: int, paced: bool, **env: str) -> tuple[FakeTelegram, Any, Any, list[int]]:
    tg, eve, daemon, _, users = await stack(chats, **({} if paced else UNPACED), **env)
    tg.limits = FloodLimits()
    return tg, eve, daemon, users


async def probe_depth(daemon: Any, samples: list[tuple[float, float]], every: float = 0.05) -> None:
    """Sample the daemon's pacer queue depth (``iva_pacer_queue_depth`` on /metrics) until cancelled."""
    import httpx

    async with httpx.AsyncClient(base_url=f"http://{daemon.env['IVA_API_LISTEN']}") as client:
        while True:
            text = (await client.get("/metrics")).text
            depth = next(float(line.split()[1]) for line in text.splitlines()
                         if line.startswith("iva_pacer_queue_depth "))
            samples.append((time.monotonic(), depth))
            await asyncio.sleep(every)


async def many_chats(chats: int, paced: bool, probe: bool = False, **env: str) -> dict[str, Any]:
    tg, eve, daemon, users = await limited_stack(chats, paced, **{"IVA_MAX_TURNS": str(chats), "IVA_STREAMING": "off",
                                                                  **env})
    eve.reply_for = lambda text: answer(text.split()[-1], 3) if text.startswith("question ") else None
    samples: list[tuple[float, float]] = []
    try:
        await daemon.start()
        prober = asyncio.create_task(probe_depth(daemon, samples)) if probe else None
        started = time.monotonic()
        await tg.add_updates([tg.make_message(f"question c{u}", user_id=u) for u in users])
        await tg.wait_for(lambda: len(oks(tg)) >= 3 * chats, 600, "every part")
        if prober is not None:
            prober.cancel()
        sends = oks(tg)
        span = sends[-1].at - sends[0].at
        floor = (len(sends) - 1) / FLOOR_RATE
        in_order = all([t.split()[1] for t in tg.texts(u)] == ["part0", "part1", "part2"] for u in users)
        gaps = [b.at - a.at for a, b in itertools.pairwise(sends)]
        result = {"chats": chats, "parts": len(sends), "429s": len(tg.flood_refusals),
                  "first_to_last_s": round(span, 2), "floor_s": round(floor, 2), "ratio": round(span / floor, 3),
                  "all_s": round(sends[-1].at - started, 2), "whole_once_in_order": in_order,
                  "gap_ms": dist_ms(gaps), "most_in_a_second": most_in(sends, 1.0)}
        if samples:
            inside = [d for t, d in samples if sends[0].at <= t <= sends[-1].at]
            result["queue_empty_share"] = round(sum(1 for d in inside if d == 0) / max(1, len(inside)), 3)
            result["queue_depth_p50"] = statistics.median(inside) if inside else 0
        return result
    finally:
        await teardown(daemon, tg, eve)


def most_in(sends: list[Any], window: float) -> int:
    """The most calls within any ``window`` seconds (half open, as the fake counts)."""
    times, most, left = [c.at for c in sends], 0, 0
    for right, t in enumerate(times):
        while t - times[left] >= window:
            left += 1
        most = max(most, right - left + 1)
    return most


async def busy_group(answers: int, seconds: float, paced: bool) -> dict[str, Any]:
    tg, eve, daemon, _ = await limited_stack(1, paced, IVA_MAX_TURNS="64", IVA_STREAMING="off")
    try:
        await daemon.start()
        asked: dict[int, float] = {}
        for n in range(answers):
            topic = n + 2
            asked[topic] = time.monotonic()
            await tg.message(f"@{BOT_USERNAME} topic {topic}", user_id=1, chat_id=GROUP, chat_type="supergroup",
                             thread_id=topic, is_topic=True, entities=MENTION)
            await asyncio.sleep(seconds / answers)
        await tg.wait_for(lambda: len(oks(tg)) >= answers, 900, "every answer")
        sends = oks(tg)
        waits = [c.at - asked[c.params["message_thread_id"]] for c in sends]
        topics = sorted(c.params["message_thread_id"] for c in sends)
        worst_minute = max(sum(1 for c in sends if s.at <= c.at < s.at + 60) for s in sends)
        return {"answers": answers, "over_s": seconds, "429s": len(tg.flood_refusals),
                "each_once": topics == sorted(asked), "most_in_a_minute": worst_minute,
                "wait_p50_s": round(statistics.median(waits), 1), "wait_max_s": round(max(waits), 1),
                "last_s": round(sends[-1].at - min(asked.values()), 1)}
    finally:
        await teardown(daemon, tg, eve)


async def streams(chats: int, seconds: float, paced: bool, drafts: bool = True) -> dict[str, Any]:
    tg, eve, daemon, users = await limited_stack(chats, paced, IVA_MAX_TURNS=str(chats),
                                                 IVA_STREAMING="draft" if drafts else "off")
    words = int(seconds / 0.5)
    try:
        await daemon.start()
        texts = {u: " ".join(f"c{u}w{i}" for i in range(words)) for u in users}
        await tg.add_updates([tg.make_message(f"{texts[u]} [[chunkdelay=0.5]]", user_id=u)
                              for u in users])
        await tg.wait_for(lambda: len(oks(tg)) >= chats, seconds * 3 + 60, "every final")
        finals = {c.params["chat_id"]: c.at for c in oks(tg)}
        frames = oks(tg, "sendMessageDraft")
        lag = [finals[u] - eve.completed_at[f"echo: {texts[u]}"] for u in users]
        first, last = (min(f.at for f in frames), max(f.at for f in frames)) if frames else (0.0, 1.0)
        per_chat = [len([f for f in frames if f.params["chat_id"] == u]) / (last - first) for u in users]
        gaps = [b.at - a.at for u in users
                for a, b in itertools.pairwise([f for f in frames if f.params["chat_id"] == u])] or [0.0]
        refused = {m: len([c for c in tg.flood_refusals if c.method == m]) for m in ("sendMessageDraft", "sendMessage")}
        return {"chats": chats, "seconds": seconds, "frames": len(frames),
                "frames_per_s": round(len(frames) / (last - first), 1),
                "per_chat_per_s": round(statistics.fmean(per_chat), 2), "min_gap_s": round(min(gaps), 3),
                "429s_drafts": refused["sendMessageDraft"], "429s_finals": refused["sendMessage"],
                "completed_to_final_ms": dist_ms(lag)}
    finally:
        await teardown(daemon, tg, eve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="1,2,3")
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--group-answers", type=int, default=40)
    parser.add_argument("--group-seconds", type=float, default=60.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--stream-seconds", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="50 chats, 30 s group and streams")
    parser.add_argument("--modes", default="paced,unpaced,nodrafts",
                        help="which runs: paced, unpaced, nodrafts (paced, drafts off: scenario 3's baseline)")
    parser.add_argument("--probe", action="store_true",
                        help="1: sample the daemon's pacer queue depth on /metrics (what share of the run it was empty)")
    args = parser.parse_args()
    if args.quick:
        args.chats, args.group_answers, args.group_seconds, args.stream_seconds = 50, 30, 30.0, 30.0
    only = {int(x) for x in args.only.split(",")}
    result: dict[str, Any] = {"args": vars(args)}

    async def run() -> None:
        names = {"paced": "paced", "unpaced": "unpaced", "nodrafts": "paced, drafts off"}
        modes = [names[m] for m in args.modes.split(",")]
        for mode in modes:
            paced = mode != "unpaced"
            if 1 in only and mode != "paced, drafts off":
                result.setdefault("1_many_chats", {})[mode] = r = await many_chats(args.chats, paced, args.probe)
                print(mode, "1", r, flush=True)
            if 2 in only and mode != "paced, drafts off":
                result.setdefault("2_busy_group", {})[mode] = r = await busy_group(args.group_answers,
                                                                                   args.group_seconds, paced)
                print(mode, "2", r, flush=True)
            if 3 in only:
                # The baseline of "drafts never delay finals": the same finals, paced, without drafts.
                result.setdefault("3_streams", {})[mode] = r = await streams(args.streams, args.stream_seconds,
                                                                             paced, drafts=mode != "paced, drafts off")
                print(mode, "3", r, flush=True)

    asyncio.run(run())
    rows = [("scenario", "mode", "429s", "figures")]
    for key in sorted(k for k in result if k[0].isdigit()):
        for mode, r in result[key].items():
            rows.append((key, mode, str(r.get("429s", (r.get("429s_drafts"), r.get("429s_finals")))),
                         ", ".join(f"{k}={v}" for k, v in r.items() if not k.startswith("429"))))
    print(table(rows))
    print(save("pacing", result))


if __name__ == "__main__":
    main()
