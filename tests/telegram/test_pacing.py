"""The pacer (Q1–Q4, bridge/telegram/pacing.py) against the fake Bot API with Telegram's flood limits on
(``tg_limited``: a call that breaks one is answered 429), in process on the real store.

Each test checks the whole of what the people get: every answer whole, once, in order within its
chat — and no call refused by a limit. A wait Telegram asks for (retry_after) is timed on a
:class:`FakeClock` the test moves, so "wait 25 s" costs no 25 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from bridge.metrics import METRICS
from bridge.telegram.pacing import SLOW_FOR, Budget, Paced, Pacer, pacer_of
from tests.fakes.clock import FakeClock
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, PACED, FakeTelegram, FloodLimits
from tests.harness import OWNER, Harness

USERS = [100 + i for i in range(40)]
GROUP = -100777
MENTION = [{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}]


def answer(tag: str, parts: int) -> str:
    """An answer of ``parts`` messages (paragraphs of ~3000 characters: one message each)."""
    return "\n\n".join(f"{tag} part{i} " + "lorem ipsum " * 250 for i in range(parts))


def scripted(fake_eve: FakeEve, parts: dict[str, int]) -> None:
    """eve answers the message ``tag`` with an answer of ``parts[tag]`` messages."""
    fake_eve.reply_for = lambda text: answer(text.split()[-1], parts[text.split()[-1]]) \
        if text.split() and text.split()[-1] in parts else None


def delivered(tg: FakeTelegram, chat_id: int) -> list[str]:
    """The part markers of what the chat got, in the order Telegram took them."""
    return [t.split()[1] for t in tg.texts(chat_id) if len(t.split()) > 1 and t.split()[1].startswith("part")]


def whole(tg: FakeTelegram, chat_id: int, parts: int) -> bool:
    return delivered(tg, chat_id) == [f"part{i}" for i in range(parts)]


def paced(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve, *, clock: FakeClock | None = None,
          **env: str) -> Harness:
    return Harness(tmp_path / "state", tg, fake_eve, clock=clock, **{
        **PACED, "IVA_ALLOWED_USER_IDS": ",".join(map(str, USERS)), "IVA_STREAMING": "off", **env})


async def test_many_chats_answered_at_once_stay_under_every_limit(tmp_path: Path, tg_limited: FakeTelegram,
                                                                  fake_eve: FakeEve):
    """Q1: 40 chats answered at once with 3 parts each (120 messages, 4 s of the global budget):
    no call refused, each chat's parts whole, once, in order; the chats take turns."""
    tg = tg_limited
    scripted(fake_eve, {f"c{u}": 3 for u in USERS})
    # The global budget two under the default: here the fake Bot API, the fake eve and the bridge
    # share one event loop, and on a loaded 2-core CI that loop's lag (tens of ms) bunches calls
    # the pacer let go 1/28 s apart, so a second at the fake held 30 (2 runs in 6, 2026-12-03).
    # The default's one message of spare is for the network; this loop's lag is the test's own.
    rate = 26
    h = paced(tmp_path, tg, fake_eve, IVA_SEND_RATE=str(rate))
    await h.start()
    try:
        await asyncio.gather(*(tg.message(f"hello c{u}", user_id=u) for u in USERS))
        await h.settled(timeout=60)
        assert tg.flood_refusals == []
        assert all(whole(tg, u, 3) for u in USERS), {u: delivered(tg, u) for u in USERS if not whole(tg, u, 3)}
        sends = [c for c in tg.calls if c.method == "sendMessage" and c.params.get("_ok")]
        assert len(sends) == 120
        # Paced overall, by the pacer's own record (before: a wall-time spread, first to last ≥ 4.6 s):
        # every message passed it, none was told to wait, and the global budget was never slowed.
        pacer = pacer_of(h.s.sender.bot)
        assert pacer is not None and pacer.holds == 0 and pacer.global_rate == rate and pacer.waiting == 0
    finally:
        await h.stop()


async def test_chats_take_turns_part_by_part():
    """Q3: a chat with a 20-part answer has one part waiting at a time; chats asking after its
    first part go before its third (first come, first served at the global budget)."""
    pacer = Pacer(Budget(rate=50, chat_burst=100, chat_rate=100))
    order: list[int] = []
    first = asyncio.Event()

    async def answer_of(chat: int, parts: int) -> None:
        for _ in range(parts):
            await pacer.message_turn(chat)
            order.append(chat)
            first.set()

    long = asyncio.create_task(answer_of(1, 20))
    await first.wait()
    await asyncio.gather(*(answer_of(chat, 1) for chat in range(2, 7)), long)
    assert order.count(1) == 20 and order[0] == 1
    third = [i for i, chat in enumerate(order) if chat == 1][2]
    assert all(order.index(chat) < third for chat in range(2, 7)), order


async def test_one_long_answer_is_paced_within_its_chat_and_others_go_meanwhile(
        tmp_path: Path, tg_limited: FakeTelegram, fake_eve: FakeEve):
    """Q2, Q3: an 8-part answer goes as a burst of 3, then one a second; a chat asking meanwhile
    is answered before it ends (it never waits behind the long one)."""
    tg = tg_limited
    scripted(fake_eve, {"long": 8, "short": 1})
    h = paced(tmp_path, tg, fake_eve)
    await h.start()
    try:
        await tg.message("tell me long", user_id=USERS[0])
        await tg.wait_texts(1, USERS[0], timeout=15)
        await tg.message("and me short", user_id=USERS[1])
        await h.settled(timeout=40)
        assert tg.flood_refusals == []
        assert whole(tg, USERS[0], 8) and whole(tg, USERS[1], 1)
        # By order, not by wall-time gaps (before: parts 4..8 asserted ≥ 4.5 s apart): the fake
        # refused nothing over its one-a-second chat limit, and the short answer went between
        # the long one's parts.
        sends = [c.params["chat_id"] for c in tg.calls if c.method == "sendMessage" and c.params.get("_ok")]
        long_at = [i for i, chat in enumerate(sends) if chat == USERS[0]]
        assert long_at[0] < sends.index(USERS[1]) < long_at[-1]
    finally:
        await h.stop()


async def test_a_busy_group_stays_under_its_minute(tmp_path: Path, fake_eve: FakeEve):
    """Q1 for a group: 25 topics of one forum answered at once share the group's budget; no
    window of the fake's "minute" holds more than its 20. (Time scaled by ten: the fake's minute
    is 6 s and the pacer's group rate 170 a minute, so the test takes 8 s, not 80.)"""
    tg = FakeTelegram(limits=FloodLimits(group_window=6.0))
    await tg.start()
    h = paced(tmp_path, tg, fake_eve, IVA_SEND_GROUP_PER_MINUTE="170")
    await h.start()
    try:
        for topic in range(2, 27):
            await tg.message(f"@{BOT_USERNAME} topic {topic}", user_id=OWNER, chat_id=GROUP, chat_type="supergroup",
                             thread_id=topic, is_topic=True, entities=MENTION)
        await h.settled(timeout=40)
        assert tg.flood_refusals == []
        sends = [c for c in tg.calls if c.method == "sendMessage" and c.params.get("_ok")]
        assert sorted(c.params.get("message_thread_id") for c in sends) == list(range(2, 27))  # each once
        times = [c.at for c in sends]
        assert max(sum(1 for t in times if start <= t < start + 6.0) for start in times) <= 20
    finally:
        await h.stop()
        await tg.stop()


async def test_a_chat_told_to_wait_25_s_waits_and_the_others_go_on(tmp_path: Path, tg_limited: FakeTelegram,
                                                                   fake_eve: FakeEve):
    """Q4: Telegram tells one chat to wait 25 s on the first part of its answer: the other chats are
    answered meanwhile; that chat gets nothing more until the 25 s are over, then the rest of
    its answer, once and in order."""
    tg, clock = tg_limited, FakeClock()
    waiting, others = USERS[0], USERS[1:6]
    scripted(fake_eve, {f"c{u}": 3 for u in USERS})
    tg.fail("sendMessage", 429, retry_after=25, chat_id=waiting)
    h = paced(tmp_path, tg, fake_eve, clock=clock)
    await h.start()
    try:
        await tg.message(f"hello c{waiting}", user_id=waiting)
        await tg.wait_for(lambda: clock.sleepers, 15, "the chat held")
        for u in others:
            await tg.message(f"hello c{u}", user_id=u)
        await tg.wait_for(lambda: all(whole(tg, u, 3) for u in others), 20, "the others answered")
        assert delivered(tg, waiting) == []
        assert len([c for c in tg.calls if c.method == "sendMessage" and c.params["chat_id"] == waiting]) == 1
        await clock.advance(24)
        pacer = pacer_of(h.s.sender.bot)
        assert pacer is not None and pacer.held_for(waiting) == 1 and clock.sleepers == 1
        assert delivered(tg, waiting) == []
        await clock.advance(1)
        await h.settled(timeout=20)
        assert whole(tg, waiting, 3) and all(whole(tg, u, 3) for u in others)
        assert tg.flood_refusals == []
    finally:
        await h.stop()


async def test_a_final_told_to_wait_again_and_again_is_never_given_up(tmp_path: Path, tg_limited: FakeTelegram,
                                                                      fake_eve: FakeEve):
    """Q4: twelve 429s in a row on one chat's answer (each retry_after 10 s, two minutes in all):
    the answer still goes, whole, once, in order; another chat is answered meanwhile."""
    tg, clock = tg_limited, FakeClock()
    held, other = USERS[0], USERS[1]
    scripted(fake_eve, {f"c{u}": 2 for u in USERS})
    tg.fail("sendMessage", 429, retry_after=10, times=12, chat_id=held)
    h = paced(tmp_path, tg, fake_eve, clock=clock)
    await h.start()
    try:
        await tg.message(f"hello c{held}", user_id=held)
        await tg.message(f"hello c{other}", user_id=other)
        for round_ in range(1, 13):
            await tg.wait_for(lambda: clock.sleepers, 15, f"the chat held ({round_})")
            await clock.advance(10)
            await tg.wait_for(lambda r=round_: len([c for c in tg.calls if c.method == "sendMessage"
                                                    and c.params["chat_id"] == held]) > r, 15, "the retry")
        await h.settled(timeout=20)
        assert whole(tg, held, 2) and whole(tg, other, 2)
        assert h.observe("SELECT count(*) FROM outbox WHERE state != 'sent'")[0][0] == 0
    finally:
        await h.stop()


async def test_drafts_under_pressure_are_skipped_never_queued_and_never_delay_a_final(
        tmp_path: Path, tg_limited: FakeTelegram, fake_eve: FakeEve):
    """Q3: 16 chats streaming at once on a global budget of 10 a second: no call refused, every
    final whole and once; each chat's frames within its own budget; frames skipped, not queued.
    Settled, not timed: the pacer's clock (its draft gaps) stands still, so a chat's budget of one
    frame a second allows it exactly one frame however slow the machine — the rest are skipped,
    and no final waits for them (the turns all settle). That a waiting message goes before any
    frame is the next test's, on the pacer alone."""
    tg, clock = tg_limited, FakeClock()
    chats = USERS[:16]
    h = paced(tmp_path, tg, fake_eve, clock=clock, IVA_STREAMING="draft", IVA_SEND_RATE="10")
    await h.start()
    try:
        words = " ".join(f"w{i}" for i in range(24))
        await asyncio.gather(*(tg.message(f"{words} c{u} [[chunkdelay=0.05]]", user_id=u) for u in chats))
        await h.settled(timeout=60)
        assert tg.flood_refusals == []
        for u in chats:
            assert tg.texts(u) == [f"echo: {words} c{u}"]
            assert len(tg.drafts(u)) <= 1, tg.drafts(u)  # the clock never moved: one frame at most
        pacer = pacer_of(h.s.sender.bot)
        assert pacer is not None and pacer.skipped["draft"] >= len(chats)
        assert h.observe("SELECT count(*) FROM outbox WHERE state != 'sent'")[0][0] == 0
    finally:
        await h.stop()


async def test_a_draft_never_queues_and_never_goes_before_a_waiting_message():
    """Q3 on the pacer alone: while a message waits for the global budget, a draft frame asked
    for is skipped at once (Paced, never queued) and the message goes first; when no message
    waits and the budget has room, the frame goes."""
    pacer = Pacer(Budget(rate=10))
    await pacer.message_turn(1)  # takes the global budget's slot: the next waits ~0.1 s
    order: list[str] = []

    async def message() -> None:
        await pacer.message_turn(2)
        order.append("message")

    waiting = asyncio.create_task(message())
    await asyncio.sleep(0)  # one step of the task: it runs until it waits for the global budget
    assert pacer.waiting == 1
    try:
        await pacer.light_turn("draft", 3)
        order.append("draft")
    except Paced as exc:
        assert exc.why == "the global budget is short"
        order.append("draft skipped")
    await waiting
    assert order == ["draft skipped", "message"] and pacer.skipped["draft"] == 1
    await pacer.light_turn("draft", 3)  # nothing waits: the frame goes (within one slot)
    assert pacer.skipped["draft"] == 1


async def test_a_hung_draft_frame_holds_the_final_only_its_own_timeout(tmp_path: Path, tg: FakeTelegram,
                                                                       fake_eve: FakeEve):
    """Issue 20 (11): a draft frame Telegram never answers is given up after IVA_DRAFT_TIMEOUT,
    not aiogram's 60 s: the final answer follows eve's completion within it."""
    release = asyncio.Event()

    async def hang(params: dict) -> None:
        await release.wait()

    tg.hooks["sendMessageDraft"] = hang
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_DRAFT_TIMEOUT="1")
    await h.start()
    try:
        await tg.message("one two three four [[chunkdelay=0.1]]", user_id=OWNER)
        # The frame never answers while this waits: the final comes within this bound only if
        # the frame was given up at IVA_DRAFT_TIMEOUT, not aiogram's 60 s (a failure bound: no
        # duration is asserted).
        await tg.wait_texts(1, OWNER, timeout=40)
        assert tg.texts(OWNER) == ["echo: one two three four"]
    finally:
        release.set()
        await h.stop()


async def test_typing_is_never_sent_twice_within_its_5_s(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """Q3: three turns in a row in one chat: one typing action, not one per turn — the 5 s on
    the pacer's injected clock, which stands still; once it has moved them, typing goes again
    (before: wall-time gaps between actions were asserted)."""
    clock = FakeClock()
    h = Harness(tmp_path / "state", tg, fake_eve, clock=clock, IVA_STREAMING="off")
    await h.start()
    try:
        for n in range(3):
            await tg.message(f"quick {n}", user_id=OWNER)
            await tg.wait_texts(n + 1, OWNER)
        await h.settled()
        assert len(tg.calls_of("sendChatAction")) == 1
        pacer = pacer_of(h.s.sender.bot)
        await clock.advance(5)
        await tg.message("slow one [[delay=3]]", user_id=OWNER)
        await tg.wait_for(lambda: len(tg.calls_of("sendChatAction")) == 2, 20, "typing again after 5 s")
        await h.settled()
        assert len(tg.calls_of("sendChatAction")) == 2 and pacer is not None
    finally:
        await h.stop()


async def test_several_chats_told_at_once_slow_the_global_budget():
    """Q4: one chat's 429 holds that chat only; three chats told within a second mean the global
    limit was hit, and the global budget runs at half speed for a while (on the pacer's clock),
    then at full speed again."""
    clock = FakeClock()
    pacer = Pacer(Budget(rate=100), clock=clock)
    pacer.told_to_wait(1, 5)
    assert pacer.held_for(1) > 4 and pacer.held_for(2) == 0
    assert pacer.global_rate == 100
    pacer.told_to_wait(2, 1)
    pacer.told_to_wait(3, 1)
    assert pacer.global_rate == 50
    await clock.advance(SLOW_FOR - 1)
    assert pacer.global_rate == 50
    await clock.advance(1)
    assert pacer.global_rate == 100


async def test_a_slow_down_lets_no_message_past_those_already_waiting():
    """Q1 (issue 34): the slow-down changes the one global bucket's rate in place.
    Messages wait in the bucket when three chats are told to wait; a message that comes right
    after waits behind them (before: the slow-down swapped in a fresh, empty bucket, and the
    newcomer went at once while the waiting ones drained the old one — a burst over the global
    rate right after Telegram said it was hit). A slow rate (one message every ten seconds) keeps
    the waiting ones waiting however busy the machine is; nothing here waits for a slot."""
    clock = FakeClock()
    pacer = Pacer(Budget(rate=0.1), clock=clock)
    went: list[int] = []

    async def message(chat: int) -> None:
        await pacer.message_turn(chat)
        went.append(chat)

    tasks = [asyncio.create_task(message(chat)) for chat in range(10, 15)]
    try:
        for _ in range(20):  # each task's first step: one through, the rest into the bucket's queue
            await asyncio.sleep(0)
        assert went == [10] and pacer.waiting == 4  # the bucket's one slot taken, the rest waiting in it
        for chat in (1, 2, 3):
            pacer.told_to_wait(chat, 1)
        assert pacer.global_rate == 0.05
        tasks.append(asyncio.create_task(message(99)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert went == [10] and pacer.waiting == 5, went
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_metrics_show_the_pacer(tmp_path: Path, tg_limited: FakeTelegram, fake_eve: FakeEve):
    """/metrics: the pacer's queue depth, its waits and the flood waits Telegram asked for. The
    five parts are five observed waits, and the chat's burst of three makes the fourth wait at
    all (how long is the machine's business: no duration is asserted)."""
    scripted(fake_eve, {"c100": 5})
    before = METRICS.pacer_wait._sum.get()  # type: ignore[attr-defined]
    count = _observed(METRICS.registry)
    h = paced(tmp_path, tg_limited, fake_eve)
    await h.start()
    try:
        await tg_limited.message("hello c100", user_id=USERS[0])
        await h.settled(timeout=20)
        text = generate_latest(METRICS.registry).decode()
        assert "iva_pacer_queue_depth 0.0" in text
        assert "iva_pacer_wait_seconds_count" in text and "iva_pacer_flood_waits_total" in text
        assert _observed(METRICS.registry) - count >= 5
        assert METRICS.pacer_wait._sum.get() > before  # type: ignore[attr-defined]  # parts 4, 5 waited
    finally:
        await h.stop()


def _observed(registry: CollectorRegistry) -> float:
    """How many waits ``iva_pacer_wait_seconds`` has observed."""
    return registry.get_sample_value("iva_pacer_wait_seconds_count") or 0.0


async def test_the_pacer_is_on_every_bot():
    """Every call to Telegram goes through one pacer: make_bot puts it on the session, with the
    product's defaults — Telegram's limits."""
    from bridge.app import make_bot
    from bridge.config import Settings

    settings = Settings.from_env({"IVA_TELEGRAM_TOKEN": "123456:" + "a" * 35, "IVA_EVE_URL": "http://127.0.0.1:1",
                                 "IVA_OWNER_IDS": "1"})
    bot = make_bot(settings)
    try:
        pacer = pacer_of(bot)
        assert pacer is not None and pacer.budget == Budget()
        assert (Budget().rate, Budget().chat_burst, Budget().chat_rate, Budget().group_per_minute,
                Budget().draft_rate) == (28, 3, 1, 20, 1)
    finally:
        await bot.session.close()


async def test_sigterm_with_a_draft_frame_hung_stops_within_systemds_timeout(tg: FakeTelegram, fake_eve: FakeEve,
                                                                            in_process_factory):
    """Issue 20 (11): SIGTERM while Telegram holds a draft frame: the daemon ends within its
    draft timeout (5 s), well inside TimeoutStopSec=30 — not after aiogram's 60 s. In process,
    SIGTERM is the graceful stop (the workers' close awaited, then everything closed)."""
    release = asyncio.Event()

    async def hang(params: dict) -> None:
        await release.wait()

    tg.hooks["sendMessageDraft"] = hang
    daemon = in_process_factory()
    await daemon.start()
    try:
        await tg.message("one two three four five six [[chunkdelay=1]]", user_id=OWNER)
        await tg.wait_for(lambda: tg.in_flight("sendMessageDraft"), 15, "a draft frame in flight")
        await asyncio.wait_for(daemon.stop(), timeout=25)  # inside TimeoutStopSec=30: the failure bound
    finally:
        release.set()


async def test_opening_a_topic_is_paced_like_a_message():
    """Q1: createForumTopic posts (the topic's first service message), so it passes the pacer
    like a message: a chat held by a 429 opens no topic until the hold is over, and a group's
    fourth topic in a row waits for the group's budget (a burst of 3)."""
    from aiogram.methods import CreateForumTopic

    clock, holding = FakeClock(), asyncio.Event()

    async def sleep(seconds: float) -> None:
        holding.set()
        await clock.sleep(seconds)

    pacer = Pacer(Budget(group_per_minute=600, group_burst=3), clock=clock, sleep=sleep)
    sent: list[float] = []

    async def make_request(bot: object, method: object) -> str:
        sent.append(clock())
        return "opened"

    def open_topic(chat: int) -> asyncio.Task[object]:
        return asyncio.ensure_future(pacer(make_request, None, CreateForumTopic(chat_id=chat, name="t")))  # type: ignore[arg-type]

    pacer.told_to_wait(GROUP, 5)
    held = open_topic(GROUP)
    await asyncio.wait_for(holding.wait(), 5)
    assert sent == [] and not held.done() and pacer.waiting == 1
    await clock.advance(5)
    assert await asyncio.wait_for(held, 5) == "opened" and len(sent) == 1

    # The group's budget: 3 at once (the first is above), then the rest wait for it — by state,
    # not by wall time (before: ≥ 0.15 s asserted). The group's pace here is one every ~21 s
    # (6 a minute), so the two past the burst are still waiting however slow the machine.
    slow = Pacer(Budget(group_per_minute=6, group_burst=3), clock=clock, sleep=sleep)
    opened = []

    async def counted(bot: object, method: object) -> str:
        opened.append(method)
        return "opened"

    tasks = [asyncio.ensure_future(slow(counted, None, CreateForumTopic(chat_id=GROUP, name="t")))  # type: ignore[arg-type]
             for _ in range(5)]
    try:
        await asyncio.wait_for(_until(lambda: len(opened) == 3 and slow.waiting == 2), 10)
        assert sum(t.done() for t in tasks) == 3  # the two past the burst wait in the group's budget
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):  # the caller's wait_for bounds it
        if condition():
            return
        await asyncio.sleep(0.01)
