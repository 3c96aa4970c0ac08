"""albums.cut: which claimed messages go now — never half an album (issue 14, I3); and the draft ids
of live replies (L*)."""

from __future__ import annotations

import pytest

from bridge.chat.albums import LOOKAHEAD, SETTLE, cut
from bridge.storage.payloads import QueuedMessage
from diskqueue import Message, State

NOW = 1_000.0
STARTED = 0.0


def _rows(spec: str, *, at: float = NOW - 5) -> tuple[list[Message], list[QueuedMessage]]:
    """"A1 X A2" → messages; a capital letter and a digit is a part of that album."""
    rows, items = [], []
    for i, name in enumerate(spec.split()):
        album = name[0] if name[0].isupper() and name[1:].isdigit() else None
        item = QueuedMessage(text=name, message_id=i + 1, user_id=1, user_name="u", owner=True, private=False,
                             album=album)
        items.append(item)
        rows.append(Message(id=i + 1, address="g", dedupe_key=None, payload=item.to_payload(), state=State.INFLIGHT,
                            attempts=0, claim="c", enqueued_at=at, claimed_at=at))
    return rows, items


@pytest.mark.parametrize(("spec", "limit", "take"), [
    ("x y z", 2, 2),
    ("A1 A2 A3 x", 2, 3),           # the leading album whole, past the limit
    ("x A1 A2", 2, 1),              # an album the limit would split waits, from its first part
    ("A1 x A2 A3", 2, 4),           # interleaved with the leading album: taken with it (review of issue 14)
    ("x A1 y A2", 3, 1),            # a later album interleaved: left whole for the next turn
    ("A1 B1 A2 B2 y", 1, 4),        # two albums interleaved at the head: both whole
    ("x y A1 A2", 10, 4),
])
def test_a_turn_never_splits_an_album(spec: str, limit: int, take: int) -> None:
    rows, items = _rows(spec)
    got = cut(rows, items, [], limit=limit, now=NOW, started=STARTED)
    assert (got.take, got.wait_until) == (take, None)
    albums_in = {i.album for i in items[:got.take] if i.album}
    assert not any(i.album in albums_in for i in items[got.take:])


def test_an_album_still_arriving_waits_or_is_left_for_later() -> None:
    rows, items = _rows("A1 A2", at=NOW - 0.2)
    assert cut(rows, items, [], limit=10, now=NOW, started=STARTED).wait_until == pytest.approx(NOW - 0.2 + SETTLE)
    rows, items = _rows("x A1")
    rows[1] = Message(**{**rows[1].__dict__, "enqueued_at": NOW - 0.2}) if hasattr(rows[1], "__dict__") else rows[1]
    fresh_rows, fresh_items = _rows("x A1", at=NOW - 0.2)
    got = cut([rows[0], fresh_rows[1]], fresh_items, [], limit=10, now=NOW, started=STARTED)
    assert (got.take, got.wait_until) == (1, None)


def test_draft_ids_name_their_turn() -> None:
    """L*: a block's draft id is non-zero, the same on a replay, and says which turn it was of."""
    from bridge.chat.draftids import draft_id, of_turn

    first, second = "claim-one", "claim-two"
    assert draft_id(first, 0) != 0 and draft_id(first, 7) == draft_id(first, 7)
    assert draft_id(first, 7) != draft_id(first, 9)
    assert of_turn(draft_id(first, 7), first) and not of_turn(draft_id(first, 7), second)
    assert 0 < draft_id(first, 2**40) < 2**31  # a positive 32-bit integer, whatever width Telegram reads


def test_an_album_with_a_part_past_the_claim_window_is_not_split() -> None:
    """Two people post 10-photo albums in a group at once (parts interleave), and someone writes.
    With IVA_BATCH=10 and a lookahead of one album, B10 was the 21st row, past the claim. The leading album
    A is taken whole (19 rows), and with it B1..B9: ``where`` knows only the claimed rows, so B
    looks whole. B10 goes alone in the next turn: one album, two turns (I3)."""
    spec = " ".join(f"A{i} B{i}" for i in range(1, 10)) + " A10 x B10"
    rows, items = _rows(spec)
    limit = 10
    claimed = limit + LOOKAHEAD
    got = cut(rows[:claimed], items[:claimed], rows[claimed:], limit=limit, now=NOW, started=STARTED)
    taken = {i.album for i in items[:got.take] if i.album}
    left = [i.text for i in items[got.take:] if i.album in taken]
    assert left == [], f"take={got.take}: {left} of an album in this turn go in the next one"


def test_an_album_continuing_past_the_claim_is_left_whole_for_the_next_turn() -> None:
    """A later album whose parts go on beyond what was claimed: cut before its first part."""
    rows, items = _rows("x y B1 B2")
    extra, _ = _rows("B3")
    got = cut(rows, items, extra, limit=10, now=NOW, started=STARTED)
    assert (got.take, got.wait_until) == (2, None)
