"""The typed dedupe marks write the JSON the dict marks wrote, key for key and in order, so a
mark written before them reads the same, and a held album part reads back what was held."""

from __future__ import annotations

import json

from bridge.storage.marks import (
    AlbumHeld,
    AlbumMark,
    CommandMark,
    EditMark,
    PairingMark,
    PeopleMark,
    RefusedMark,
    StopMark,
)


def test_each_mark_writes_the_payload_the_dict_marks_wrote() -> None:
    """The marks' JSON, byte for byte, as the dicts of intake/ wrote it before the marks were typed."""
    cases = [
        (CommandMark("notes"), {"kind": "command", "command": "notes"}),
        (CommandMark(), {"kind": "command"}),
        (PairingMark(), {"kind": "pairing"}),
        (PeopleMark(42), {"kind": "people", "remove": 42}),
        (StopMark(), {"kind": "stop"}),
        (AlbumMark(), {"kind": "album"}),
        (RefusedMark(), {"kind": "refused"}),
        (AlbumHeld(7, refusal="no videos"), {"kind": "album_held", "refusal": "no videos", "message_id": 7}),
        (AlbumHeld(7, item={"kind": "message", "text": "hi"}),
         {"kind": "album_held", "item": {"kind": "message", "text": "hi"}, "message_id": 7}),
        (EditMark("new words", None), {"kind": "edit", "text": "new words", "file_id": None}),
        (EditMark("w", "f1", ignored=True), {"kind": "edit", "text": "w", "file_id": "f1", "ignored": True}),
    ]
    for mark, before in cases:
        assert json.dumps(mark.to_payload(), ensure_ascii=False) == json.dumps(before, ensure_ascii=False), mark


def test_a_held_part_and_an_edit_read_back_from_their_payloads() -> None:
    """What a held album part or an edit mark carried is read back from the queue row's payload;
    any other payload is not one."""
    held = AlbumHeld(9, item={"kind": "message", "text": "a"})
    assert AlbumHeld.from_payload(held.to_payload()) == held
    refused = AlbumHeld(9, refusal="too big")
    assert AlbumHeld.from_payload(refused.to_payload()) == refused
    assert AlbumHeld.from_payload({"kind": "album"}) is None
    assert EditMark.revision_of(EditMark("t", "f").to_payload()) == ("t", "f")
    assert EditMark.revision_of({"kind": "message", "text": "t"}) is None
