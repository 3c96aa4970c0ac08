"""The notebook's storage (N1, N5, N7, N8, N9): writes, the blind-overwrite guard, the archive."""

from __future__ import annotations

import dataclasses

import pytest

from bridge.notebook import Notebook, NotebookConfig, NoteError
from bridge.storage.store import Store
from diskqueue import Database, DiskQueue


@pytest.fixture
async def nb(tmp_path):
    db = await Database(tmp_path / "s.sqlite3").open()
    await DiskQueue(db).migrate()
    store = Store(db)
    await store.migrate()
    for address, chat_id in (("1", 1), ("-100", -100), ("-100/7", -100)):
        await store.touch_chat(address, chat_id, None, "en")
    try:
        yield Notebook(db, store, NotebookConfig())
    finally:
        await db.close()


async def test_save_update_keeps_prev_body_and_bumps_the_version(nb):
    note, created = await nb.save("1", "shop", "milk", description="shopping")
    assert created and note.prev_body is None
    note, created = await nb.save("1", "shop", "milk, eggs")
    assert not created and note.prev_body == "milk" and note.description == "shopping"
    assert (await nb.store.chat("1")).notes_version == 2


async def test_a_new_note_needs_a_description(nb):
    with pytest.raises(NoteError, match="description"):
        await nb.save("1", "shop", "milk")


async def test_in_index_mode_an_unread_note_cannot_be_overwritten(nb):
    await nb.save("1", "shop", "milk", description="shopping")
    await nb.store.update_chat("1", notes_mode="index", claim="turn-1", status="busy", kind="turn")
    chat = await nb.store.chat("1")
    with pytest.raises(NoteError, match="chat_note_read first"):
        await nb.save("1", "shop", "bread", guard=chat)
    nb.mark_read(chat, "shop")
    await nb.save("1", "shop", "bread", guard=chat)
    # A read in an earlier turn does not count in the next one.
    await nb.store.update_chat("1", claim="turn-2")
    with pytest.raises(NoteError, match="chat_note_read first"):
        await nb.save("1", "shop", "butter", guard=await nb.store.chat("1"))


async def test_inline_mode_needs_no_read_before_overwrite(nb):
    await nb.save("1", "shop", "milk", description="shopping")
    await nb.store.update_chat("1", notes_mode="inline", claim="t")
    await nb.save("1", "shop", "bread", guard=await nb.store.chat("1"))


async def test_pinning_refusals_name_the_fix(nb):
    for i in range(5):
        await nb.save("1", f"p{i}", "x", description="d", pinned=True)
    await nb.save("1", "six", "x", description="d")
    with pytest.raises(NoteError, match="Unpin one first"):
        await nb.set_pinned("1", "six", True)


async def test_archive_and_restore_round_trip_the_records_exactly(nb):
    await nb.save("1", "goal", "ship it", description="goal", pinned=True)
    await nb.save("1", "shop", "milk", description="shopping")
    await nb.save("1", "shop", "milk, eggs")
    before = [dataclasses.replace(n, id=0) for n in await nb.notes("1")]
    version = (await nb.store.chat("1")).notes_version
    replacement = [dataclasses.replace(before[1], body="eggs", prev_body=before[1].body, updated_at=99.0)]
    assert await nb.swap("1", replacement, version=version)
    assert [n.name for n in await nb.notes("1")] == ["shop"]
    assert await nb.restore("1") == 2
    after = [dataclasses.replace(n, id=0) for n in await nb.notes("1")]
    assert after == before  # same births, pins, times and prev_body: the same notes, not namesakes
    # The restore archived what it replaced, so it can itself be undone.
    assert await nb.restore("1") == 1


async def test_a_swap_loses_to_a_write_made_meanwhile(nb):
    await nb.save("1", "shop", "milk", description="shopping")
    version = (await nb.store.chat("1")).notes_version
    await nb.save("1", "todo", "call", description="todo")
    assert not await nb.swap("1", [], version=version)
    assert len(await nb.notes("1")) == 2 and await nb.archive("1") is None


async def test_deleting_a_chat_deletes_the_notes_of_all_its_topics_only(nb):
    await nb.save("-100", "a", "x", description="d")
    await nb.save("-100/7", "b", "y", description="d")
    await nb.save("1", "c", "z", description="d")
    assert await nb.delete_chat(-100) == 2
    assert await nb.notes("-100") == [] and await nb.notes("-100/7") == []
    assert len(await nb.notes("1")) == 1


async def test_the_tool_limit_on_count_refuses_with_what_to_do(nb):
    nb.limits = dataclasses.replace(nb.limits, max_notes=2)
    await nb.save("1", "a", "x", description="d")
    await nb.save("1", "b", "x", description="d")
    with pytest.raises(NoteError, match="Merge or delete"):
        await nb.save("1", "c", "x", description="d")
    await nb.save("1", "a", "updated")  # an update is always fine


async def test_the_mode_is_fixed_at_turn_entry_and_stays_for_the_whole_turn(nb):
    """N2: the mode is computed once when the turn is claimed. A turn that grows its notebook past
    the index edge (12 notes) keeps the inline block and inline's rules to its end; the next
    turn would enter in index mode."""
    from bridge.chat.transitions import Transitions
    from tests.scenarios import owner_turn

    tr = Transitions(store=nb.store, queue=DiskQueue(nb.db), notebook=nb)
    await owner_turn(tr, "1", "s1")
    chat = await nb.store.chat("1")
    assert chat.notes_mode == "inline"
    for i in range(14):
        await nb.save("1", f"n{i}", f"body {i}", description=f"note {i}", guard=chat)
    chat = await nb.store.chat("1")
    assert chat.notes_mode == "inline" and await nb.mode_at_entry(chat) == "index"
    block, _ = await nb.block(chat, threshold=100_000, window=200_000)
    assert "body 13" in block and "chat_note_read" not in block  # still inline: every body quoted
    await nb.save("1", "n0", "changed unread", guard=chat)  # no read-before-overwrite inside this turn
