"""A soak: many chats, messages arriving all the time, the bridge SIGKILLed at random moments.

The test keeps its own ledger: every accepted message must be answered (each chat's replies in
arrival order), never lost. A kill inside the narrow window between Telegram's answer and our
record may repeat one whole reply, so whole-reply duplicates are counted and bounded by the
number of kills. Sizes: IVA_SOAK_MESSAGES / IVA_SOAK_CHATS / IVA_SOAK_KILLS (the full soak:
500 / 20 / 30, by hand; CI runs a smaller one).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections import Counter

from tests.conftest import OWNER

MESSAGES = int(os.environ.get("IVA_SOAK_MESSAGES", "120"))
CHATS = int(os.environ.get("IVA_SOAK_CHATS", "10"))
KILLS = int(os.environ.get("IVA_SOAK_KILLS", "6"))


async def test_soak_with_random_sigkills(tg, fake_eve, daemon_factory):
    rng = random.Random(20261201)
    users = [OWNER] + [1000 + n for n in range(CHATS - 1)]
    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_ALLOWED_USER_IDS=",".join(map(str, users)),
                       IVA_LOG_LEVEL="info")
    fake_eve.step_delay = 0.05
    await d.start()
    sent: dict[int, list[str]] = {u: [] for u in users}
    kill_at = sorted(rng.sample(range(5, MESSAGES - 5), KILLS))
    for n in range(MESSAGES):
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

    await tg.wait_for(answered, 180, "every message answered")
    await d.settled(60)
    replies = [t for t in tg.texts() if t.startswith("echo: ")]
    duplicates = sum(c - 1 for c in Counter(replies).values() if c > 1)
    assert duplicates <= KILLS, f"{duplicates} duplicated replies for {KILLS} kills"
    for user, tokens in sent.items():
        seen: list[str] = []
        for text in dict.fromkeys(tg.texts(user)):  # whole-reply duplicates collapsed
            seen.extend(re.findall(r"u\d+m\d+", text))
        assert seen == tokens, f"chat {user}: {seen} != {tokens}"
    assert not [t for t in tg.texts() if "repeat" in t]
    print(f"soak: {MESSAGES} messages, {CHATS} chats, {KILLS} kills, {len(replies)} replies, "
          f"{duplicates} duplicated replies")
