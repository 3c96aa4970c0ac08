"""Every notebook write is visible (seed 000: "видимость записи — теперь главный").

A note the model saved, changed, pinned or deleted in an owner turn is told with the turn's
answer: one 📝 line with the names, where the owner reads it — their private chat (the chat
itself when the turn was there; for a group's owner turn, the owner's private chat, never the
group). The line is written in the parking transaction, keyed by the turn's claim: once, even
across a restart.
"""

from __future__ import annotations

from collections.abc import Sequence

from diskqueue import Message

from ..notebook.service import Change
from ..storage.payloads import QueuedMessage, decode
from ..storage.store import Chat
from ..telegram.texts import t
from .services import Services

__all__ = ["changes_line", "tell_writes"]


def changes_line(changes: Sequence[Change], lang: str) -> str:
    """``name (new), plan (changed), old (deleted)`` in the owner's language."""
    return ", ".join(f"{name} ({t('notes_did_' + action, lang)})" for name, action in changes)


async def tell_writes(s: Services, chat: Chat, claim: str, inflight: Sequence[Message]) -> None:
    """In the parking transaction of ``chat``'s turn: the 📝 line, if the turn wrote notes (sent
    after the commit: in a group, to the owner's private chat)."""
    if s.notebook is None or not chat.owner_turn:
        return
    changes = await s.notebook.turn_over(chat.address, claim)
    if not changes:
        return
    what = changes_line(changes, chat.lang)
    if chat.chat_id > 0:
        await s.outbox.say(chat, f"notes:{claim}", t("notes_written", chat.lang, what=what))
        return
    owners = [m.user_id for m in map(decode, (m.payload for m in inflight)) if isinstance(m, QueuedMessage) and m.owner]
    owner = owners[0] if owners else next(iter(await s.people.owners()), None)
    if owner is None:
        return
    await s.outbox.say_to(str(owner), owner, None, f"notes:{claim}",
                          t("notes_written_group", chat.lang, chat=chat.chat_id, what=what), markdown=False)
