"""A soak: many chats, messages arriving all the time, the bridge SIGKILLed at random moments,
eve answering some sends with a 502 after taking them (ambiguous sends, F4; on eve 1.x sent again
with their key, V4: eve's side of the ledger counts each message it took, and none twice), and another process
holding the state database's write lock for spells of up to two seconds (F2), and — as root, the
state directory on a small tmpfs — the disk full for spells of up to three seconds (F8).

The test keeps its own ledger: every accepted message must be answered (each chat's replies in
arrival order), never lost. A kill inside the narrow window between Telegram's answer and our
record may repeat one whole reply (a lock spell can hold that record back, so one kill may hit
several chats' windows): whole-reply duplicates are counted, and each must be labelled — the
daemon logs ``reply_sent_after_restart`` for every reply pending at a kill. Ambiguous sends
and lock or disk-full spells alone add none; every duplicate must be of a chat whose pending
reply was labelled. Sizes: IVA_SOAK_MESSAGES / IVA_SOAK_CHATS / IVA_SOAK_KILLS /
IVA_SOAK_AMBIGUOUS / IVA_SOAK_LOCKS / IVA_SOAK_DISKFULL (the full soak: 500 / 20 / 30 / 30 / 30 /
30, by hand; CI runs a smaller one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import OWNER

pytestmark = pytest.mark.process  # every test here runs the bridge as a process

MESSAGES = int(os.environ.get("IVA_SOAK_MESSAGES", "120"))
CHATS = int(os.environ.get("IVA_SOAK_CHATS", "10"))
KILLS = int(os.environ.get("IVA_SOAK_KILLS", "6"))
AMBIGUOUS = int(os.environ.get("IVA_SOAK_AMBIGUOUS", "6"))
LOCKS = int(os.environ.get("IVA_SOAK_LOCKS", "6"))
DISKFULL = int(os.environ.get("IVA_SOAK_DISKFULL", "4"))


def mounted_small_disk(directory: Path) -> bool:
    """A 64 MB tmpfs on ``directory`` (root only; False where it cannot be had)."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(directory)],
                          capture_output=True, check=False)
    return done.returncode == 0


def fill_disk(directory: Path, seconds: float) -> None:
    """The disk full for a while: a file takes every free block, then goes."""
    filler = directory / f"filler-{time.monotonic_ns()}"
    try:
        with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
        time.sleep(seconds)  # the fault's length, not a wait for anything
    finally:
        filler.unlink(missing_ok=True)


def hold_write_lock(db: Path, seconds: float) -> None:
    """Another process's write transaction (an operator's sqlite3 shell, a backup) for a while."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)  # the fault's length, not a wait for anything
        conn.execute("ROLLBACK")
    finally:
        conn.close()


async def test_soak_with_random_sigkills(tg, fake_eve, daemon_factory, tmp_path):
    rng = random.Random(20261201)
    users = [OWNER] + [1000 + n for n in range(CHATS - 1)]
    disk = tmp_path / "disk"
    full_spells = DISKFULL if mounted_small_disk(disk) else 0
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_ALLOWED_USER_IDS=",".join(map(str, users)),
                       IVA_LOG_LEVEL="info", IVA_STATE_DIR=str(disk))
    d.log = tmp_path / "daemon.log"  # beside the small disk, never on it
    fake_eve.step_delay = 0.05
    await d.start()
    sent: dict[int, list[str]] = {u: [] for u in users}
    kill_at = set(rng.sample(range(5, MESSAGES - 5), KILLS))
    ambiguous_at = set(rng.sample(range(5, MESSAGES - 5), AMBIGUOUS))
    lock_at = set(rng.sample(range(5, MESSAGES - 5), LOCKS))
    full_at = set(rng.sample(range(5, MESSAGES - 5), full_spells))
    db = Path(d.env["IVA_STATE_DIR"]) / "iva.sqlite3"
    spells: list[asyncio.Task[None]] = []
    for n in range(MESSAGES):
        if n in ambiguous_at:
            fake_eve.ambiguous_sends += 1  # the next send is taken and run, but answered 502
        if n in lock_at:
            spells.append(asyncio.create_task(asyncio.to_thread(hold_write_lock, db, rng.uniform(0.2, 2.0))))
        if n in full_at:
            spells.append(asyncio.create_task(asyncio.to_thread(fill_disk, disk, rng.uniform(0.5, 3.0))))
        user = rng.choice(users)
        token = f"u{user}m{n}"
        sent[user].append(token)
        await tg.message(token, user_id=user)
        if n in kill_at:
            await asyncio.sleep(rng.uniform(0.0, 0.3))  # pacing: a random moment for the kill
            await d.kill()
            await d.start()
        else:
            await asyncio.sleep(rng.uniform(0.0, 0.03))  # pacing: messages arrive all the time

    def answered() -> bool:
        got = set()
        for text in tg.texts():
            got.update(re.findall(r"u\d+m\d+", text))
        return all(token in got for tokens in sent.values() for token in tokens)

    try:
        await asyncio.gather(*spells)
        await tg.wait_for(answered, 180, "every message answered")
        await d.settled(60)
    finally:
        if full_spells:
            await d.kill()
            await asyncio.to_thread(subprocess.run, ["umount", "-l", str(disk)], check=False)
    replies = [t for t in tg.texts() if t.startswith("echo: ")]
    duplicates = sum(c - 1 for c in Counter(replies).values() if c > 1)
    # Every duplicate must be labelled: a reply pending at a kill is logged when it goes again —
    # and each duplicated reply's chat must have as many labelled replies as it has duplicates.
    logs = d.log.read_text(errors="replace")
    label_lines = [line for line in logs.splitlines() if "reply_sent_after_restart" in line]
    labelled = len(label_lines)
    assert duplicates <= labelled, (f"{duplicates} duplicated replies, {labelled} labelled: "
                                    f"{[r for r, c in Counter(replies).items() if c > 1]}")
    by_chat = Counter(m.group(1) for line in label_lines if (m := re.search(r'"address": ?"(\d+)', line)))
    if len(by_chat) == labelled:  # every label names its chat: check them one by one
        doubled = Counter(re.search(r"u(\d+)m", r).group(1) for r, c in Counter(replies).items()  # type: ignore[union-attr]
                          for _ in range(c - 1) if re.search(r"u(\d+)m", r))
        unlabelled = {chat: n for chat, n in doubled.items() if n > by_chat.get(chat, 0)}
        assert not unlabelled, f"duplicates without a label, by chat: {unlabelled}"
    struck = logs.count('"ingest_commit_failed"') + logs.count('"worker_failed"')
    for user, tokens in sent.items():
        seen: list[str] = []
        for text in dict.fromkeys(tg.texts(user)):  # whole-reply duplicates collapsed
            seen.extend(re.findall(r"u\d+m\d+", text))
        assert seen == tokens, f"chat {user}: {seen} != {tokens}"
    assert not [t for t in tg.texts() if "repeat" in t]
    # eve's side of the ledger (V4): how often eve took each message as a new delivery. On eve 1.x
    # an ambiguous send, or one a kill cut before its receipt was recorded, is sent again with its
    # key and eve answers it with the first delivery: no duplicate there for any label to excuse.
    taken = Counter(token for session in fake_eve.sessions.values() for body in session.sends
                    for token in re.findall(r"u\d+m\d+", str(body.get("message"))))
    eve_duplicates = sum(c - 1 for c in taken.values() if c > 1)
    assert eve_duplicates == 0, f"eve took these more than once: {[k for k, c in taken.items() if c > 1]}"
    print(f"soak: {MESSAGES} messages, {CHATS} chats, {KILLS} kills, {AMBIGUOUS} ambiguous sends "
          f"({AMBIGUOUS - fake_eve.ambiguous_sends} struck), {LOCKS} lock spells, {full_spells} disk-full spells "
          f"({struck} failed commits retried), {len(replies)} replies, "
          f"{duplicates} duplicated replies ({labelled} replies labelled as possibly repeated), 0 lost; "
          f"eve took {sum(taken.values())} messages, {eve_duplicates} twice (stream version {fake_eve.stream_version})")
