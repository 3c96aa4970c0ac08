"""Benchmark 4: recovery time — 1 000 busy records at start, half finished in eve while the
bridge was down, half lost (eve no longer knows the session): time until every chat is
reconciled (idle, the finished ones answered, the lost ones told to repeat)."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time

from bench.common import Daemon, FakeEve, FakeTelegram, save, table, tmpdir


def busy_count(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT count(*) FROM chats WHERE status = 'busy'").fetchone()[0]
    finally:
        conn.close()


async def run(chats: int, unpaced: bool = False) -> dict:
    tg, eve = FakeTelegram(), FakeEve()
    await tg.start()
    await eve.start()
    state = tmpdir()
    users = [100 + c for c in range(chats)]
    from tests.fakes.telegram import UNPACED

    daemon = Daemon(tg, eve, state, IVA_ALLOWED_USER_IDS=",".join(map(str, users)), IVA_MAX_TURNS=str(chats),
                    **(UNPACED if unpaced else {}))
    await daemon.start()
    try:
        for u in users:
            await tg.message(f"u{u} [[delay=40]]", user_id=u)
        db = state / "iva.sqlite3"
        deadline = time.monotonic() + 300
        while busy_count(db) < chats and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        # Every turn must have reached eve before the kill (a chat is marked busy before its send).
        while sum(len(s.sends) for s in eve.sessions.values()) < chats and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await daemon.kill()
        sessions = list(eve.sessions.values())
        lost = sessions[: len(sessions) // 2]
        for s in lost:  # eve forgot these (restarted with a wiped store, say)
            if s.task:
                s.task.cancel()
            del eve.sessions[s.id]
        while any(s.running or s.turns_run == 0 for s in eve.sessions.values()):
            await asyncio.sleep(0.2)  # the other half finish in eve while the bridge is down
        assert busy_count(db) == chats, busy_count(db)
        before = tg.sent_count
        t0 = time.monotonic()
        await daemon.start()
        ready = time.monotonic() - t0  # imports, open, quick_check, getMe: the first poll
        while busy_count(db) > 0 and time.monotonic() - t0 < 300:
            await asyncio.sleep(0.05)
        reconciled = time.monotonic() - t0
        await tg.wait_sent(lambda: tg.sent_count - before >= chats, 300)
        answered = time.monotonic() - t0
        texts = tg.texts()[-chats:]
        repeats = sum("repeat" in t for t in texts)
    finally:
        await daemon.stop()
        await tg.stop()
        await eve.stop()
    return {"chats": chats, "lost": len(lost), "reconciled_s": round(reconciled, 2), "ready_s": round(ready, 2),
            "reconciled_after_ready_s": round(reconciled - ready, 2),
            "all_messages_sent_s": round(answered, 2), "told_to_repeat": repeats,
            "answered": chats - repeats}


async def start_times(runs: int) -> dict[str, list[float]]:
    """The start alone, side by side: Iva (an empty state) and the minimal aiogram + httpx
    forwarder (bench/forwarder.py), from exec to the first getUpdates — imports included."""
    import sys

    out: dict[str, list[float]] = {"iva": [], "forwarder": []}
    for _ in range(runs):
        for name, argv in (("iva", None), ("forwarder", [sys.executable, "-m", "bench.forwarder"])):
            tg, eve = FakeTelegram(), FakeEve()
            await tg.start()
            await eve.start()
            daemon = Daemon(tg, eve, tmpdir())
            t0 = time.monotonic()
            await daemon.start(argv)
            out[name].append(round(time.monotonic() - t0, 2))
            await daemon.stop()
            await tg.stop()
            await eve.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chats", type=int, default=1000)
    parser.add_argument("--starts", type=int, default=0, help="only the start, this many times each: Iva and "
                        "the minimal aiogram forwarder, alternately")
    parser.add_argument("--unpaced", action="store_true", help="the pacer's budgets opened: the bridge's own "
                        "recovery, without the 1 000 messages' 36 s at Telegram's 28 a second")
    args = parser.parse_args()
    if args.starts:
        starts = asyncio.run(start_times(args.starts))
        print(starts)
        print(f"written to {save('starts', starts)}")
        return
    result = asyncio.run(run(args.chats, args.unpaced))
    print(table([("metric", "value", "goal"),
                 ("busy records at start", str(result["chats"]), ""),
                 ("time until every chat reconciled", f"{result['reconciled_s']} s", "≤ 5 s"),
                 ("of which: start until the first poll", f"{result['ready_s']} s", ""),
                 ("of which: reconciling after that", f"{result['reconciled_after_ready_s']} s", ""),
                 ("time until every reply/notice sent", f"{result['all_messages_sent_s']} s", ""),
                 ("answered / told to repeat", f"{result['answered']} / {result['told_to_repeat']}", "")]))
    print(f"written to {save('recovery', result)}")


if __name__ == "__main__":
    main()
