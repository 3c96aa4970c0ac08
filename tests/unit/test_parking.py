"""Parking decisions (C1, C8, LESSONS #4): pure functions, no I/O."""

from __future__ import annotations

import dataclasses

from bridge.chat.parking import cooldown, in_turn_threshold, parking_decision, threshold
from bridge.storage.store import Chat, ChatStatus

CHAT = Chat(
    address="1", chat_id=1, thread_id=None, lang="en", eve_session="wrun_1", status=ChatStatus.BUSY,
    kind="turn", origin=None, cursor=9, claim="c", deliveries=(), busy_since=None, progress_at=None,
    measurement=None, compaction_disabled=False, reset_mark=False, reset_requested=False,
    reset_reply_to=None, reset_dropped=0, blocked=False, turns=1,
)


def test_threshold_is_the_smaller_of_percent_and_ceiling():
    assert threshold(128_000, 60, 110_000) == 76_800
    assert threshold(1_000_000, 60, 110_000) == 110_000
    assert threshold(None, 60, 110_000) == 110_000  # unknown window: the ceiling alone


def test_in_turn_safety_net_is_a_quarter_higher():
    assert in_turn_threshold(128_000) == 96_000
    assert in_turn_threshold(1_000_000) == 137_500
    assert in_turn_threshold(200_000) == 137_500


def test_compacts_at_or_above_the_threshold_only():
    assert parking_decision(CHAT, 76_800, 76_800).compact
    assert not parking_decision(CHAT, 76_799, 76_800).compact
    assert not parking_decision(CHAT, None, 76_800).compact


def test_ineffective_compaction_disables_parking():
    after = dataclasses.replace(CHAT, after_pending=True)
    decision = parking_decision(after, 90_000, 76_800)
    assert not decision.compact
    assert decision.updates == {"after_pending": 0, "last_after": 90_000, "compaction_disabled": 1}
    assert decision.after == 90_000


def test_effective_compaction_keeps_parking_on():
    after = dataclasses.replace(CHAT, after_pending=True)
    decision = parking_decision(after, 3_000, 76_800)
    assert not decision.compact and decision.updates == {"after_pending": 0, "last_after": 3_000}


def test_disabled_session_never_compacts():
    assert not parking_decision(dataclasses.replace(CHAT, compaction_disabled=True), 200_000, 76_800).compact


def test_failed_compaction_backs_off():
    cooling = dataclasses.replace(CHAT, compact_failures=1, compact_retry_at=1_000.0)
    assert not parking_decision(cooling, 100_000, 76_800, now=999.0).compact
    assert parking_decision(cooling, 100_000, 76_800, now=1_001.0).compact
    assert [cooldown(n) for n in (1, 2, 3, 9)] == [60.0, 300.0, 900.0, 900.0]


def test_after_is_the_first_step_and_the_decision_the_last():
    """seed 004: "after" from the turn's first measured step; compacting again from its last."""
    after = dataclasses.replace(CHAT, after_pending=True)
    decision = parking_decision(after, 85_000, 76_800, first=20_000)
    assert decision.after == 20_000 and decision.updates == {"after_pending": 0, "last_after": 20_000}
    assert decision.compact
