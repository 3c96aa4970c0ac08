"""An edited message (I2): what becomes of a person's correction.

Telegram sends an edit as ``edited_message``, the whole message as it now reads, with its
``edit_date``. The rule, decided in ingest's one transaction with the edit's dedupe mark — the
same transaction order as the claim of a turn, so an edit and a claim never interleave:

* **still waiting** (the message is QUEUED): its text (and file) is replaced in place, by one
  guarded ``UPDATE … WHERE id = ? AND state = QUEUED``. One turn, with the corrected words; the
  👀 receipt it had stays, no second one.
* **on its way to eve** (claimed, but eve's acceptance of it is not on the record yet): replaced
  in place too (guarded on the claim). If the send had not left yet, or has to be sent again
  after a failure or a restart, eve gets the corrected words; if it had left, eve has the first
  words and the edit is not sent after it. This is the edit that races the claim: exactly one
  turn, with one of the two texts, never two turns.
* **eve has it** (done, or in flight with eve's acceptance recorded): a new message marked
  ``[correction of my earlier message]`` with the new words (a new or replaced file goes with
  it), queued like any message — the chat's turn policy decides when eve sees it.
* **unknown** (never queued — sent before the bot was there, pruned by retention, or refused
  as it first read, e.g. a bare mention): queued as an ordinary message.
* **nothing changed** (the words and the file are what eve has or will get), **a message we
  answered ourselves** (a command), **a message /new dropped**: nothing
  goes to eve (logged).

Each edit is handled once: its dedupe key is the chat, the message id and the edit date (plus a
digest of the new words, so two different edits within the same second are two), committed
with its effect. A live location's updates (an edit every few seconds) never get here: ingest
ignores edits of a location.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib

from diskqueue import DiskQueue, Message, State

from ..storage.marks import EditMark, RefusedMark, remember
from ..storage.payloads import QueuedMessage, decode
from ..storage.store import Store

__all__ = ["EditOutcome", "commit_edit", "edit_key", "message_key"]


class EditOutcome(enum.StrEnum):
    DUPLICATE = "duplicate"  # this edit was handled before (a redelivered update)
    REPLACED = "edited"  # the waiting message now carries the new words
    CORRECTION = "correction"  # queued as a correction of what eve has
    NEW = "queued"  # the original was never queued: an ordinary message
    UNCHANGED = "unchanged"
    IGNORED = "edit_ignored"  # the original was refused, a command, or dropped by /new


def message_key(chat_id: int, message_id: int) -> str:
    return f"tg:{chat_id}:{message_id}"


def edit_key(chat_id: int, message_id: int, edit_date: int | None, item: QueuedMessage) -> str:
    digest = hashlib.sha256(repr(item.revision()).encode()).hexdigest()[:8]
    return f"{message_key(chat_id, message_id)}:e{edit_date or 0}:{digest}"


def _revision(row: Message) -> tuple[str, str | None] | None:
    payload = row.payload
    if (edited := EditMark.revision_of(payload)) is not None:
        return edited
    item = decode(payload) if payload.get("kind") == QueuedMessage.kind else None
    return item.revision() if isinstance(item, QueuedMessage) else None


async def commit_edit(queue: DiskQueue, store: Store, address: str, *, original: str, key: str,
                      item: QueuedMessage) -> tuple[EditOutcome, int | None]:
    """Apply the rule of the module's docstring; call inside ingest's transaction. Returns the
    outcome and the id of a newly queued message (a correction or an unknown original)."""
    history = await queue.history(original)
    if any(row.dedupe_key == key for row in history):
        return EditOutcome.DUPLICATE, None
    # The message: the one with the original key, or else the edit that was queued in its place
    # (an original we never had: its later edits revise that one).
    # A message we refused (a bare mention, a video) counts as never queued: edited into one we
    # take, it is queued now — once; a later edit revises that one.
    first = next((row for row in history if row.dedupe_key == original and row.payload.get("kind") != RefusedMark.kind),
                 None) or next((row for row in history if row.payload.get("kind") == QueuedMessage.kind), None)
    if first is None:
        row = await queue.enqueue(address, item.to_payload(), dedupe_key=key)
        return (EditOutcome.NEW, row) if row is not None else (EditOutcome.DUPLICATE, None)
    text, file_id = item.revision()
    mark = EditMark(text, file_id)
    known = [r for r in map(_revision, history) if r is not None]
    if first.payload.get("kind") != QueuedMessage.kind or first.state is State.DROPPED:
        await remember(queue, address, dataclasses.replace(mark, ignored=True), dedupe_key=key)
        return EditOutcome.IGNORED, None
    if known and known[-1] == item.revision():
        await remember(queue, address, mark, dedupe_key=key)
        return EditOutcome.UNCHANGED, None
    if first.state is State.QUEUED:
        replaced = await queue.replace(first.id, item.to_payload(), state=State.QUEUED)
    elif first.state is State.INFLIGHT and not await _eve_has(store, address, first):
        replaced = await queue.replace(first.id, item.to_payload(), state=State.INFLIGHT, claim=first.claim)
    else:
        replaced = False
    if replaced:
        await remember(queue, address, mark, dedupe_key=key)
        return EditOutcome.REPLACED, None
    before = known[-1][1] if known else None
    # The new words (and a new or replaced file); the quote and the album stay with the message eve
    # has: a correction is a message of its own, never an album's part.
    correction = dataclasses.replace(item, correction=True, reply=None, album=None,
                                     attachment=item.attachment if file_id is not None and file_id != before else None)
    row = await queue.enqueue(address, correction.to_payload(), dedupe_key=key)
    return (EditOutcome.CORRECTION, row) if row is not None else (EditOutcome.DUPLICATE, None)


async def _eve_has(store: Store, address: str, row: Message) -> bool:
    """An in-flight message is eve's once the turn that claimed it has eve's acceptance on the
    record (a steered one joins the turn's claim only then)."""
    chat = await store.chat(address)
    return chat is not None and row.claim is not None and row.claim == chat.claim and bool(chat.deliveries)
