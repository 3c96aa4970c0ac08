"""Who may answer a turn's question (S3, F11), and whether anyone who may is there to.

A question (T5) belongs to the people whose messages make the turn, and to the owners, always.
A pushed turn or a reminder's fire has no such people — nobody wrote it in the chat — so its
question belongs to the people of its chat:

- in a private chat, its person (the chat's id is theirs);
- in a group, anyone who may talk to the bot there: the owners and the allowed users, whoever
  of them presses or writes in that group (a press is bound to its chat, S3); a stranger never.
  Stored as :data:`EVERYONE` in the prompt's askers.

The same people may answer it in text (their message joins the pushed turn, which is then no
longer the owner's alone, N1) and may ``/stop`` or ``/new`` it in a group.

A question nobody present may answer (a private chat whose person may no longer talk: removed
with ``/users``) is not exempt from the busy timeout: nobody will answer it, so the turn is lost
like any turn that makes no progress, and the chat is free again (F11).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from diskqueue import DiskQueue

from ..people import People
from ..storage.payloads import PushedTurn, Queued, QueuedMessage, decode
from ..storage.store import Chat

__all__ = ["EVERYONE", "OWNERS", "answerable", "askers", "may_answer", "pushed_question", "running"]

EVERYONE = 0  # no Telegram user has the id 0: "anyone who may talk in the chat"
OWNERS = -1  # no Telegram user has a negative id: "the owners alone" (a budget prompt, V6)


def askers(items: Sequence[Queued], chat_id: int) -> list[int]:
    """Who may answer a question of the turn made of ``items`` (besides the owners)."""
    people = sorted({i.user_id for i in items if isinstance(i, QueuedMessage)})
    if people and not any(isinstance(i, PushedTurn) for i in items):
        return people
    return [chat_id] if chat_id > 0 else [EVERYONE]  # F11: the people of the chat


def may_answer(asked: Collection[int], user: int) -> bool:
    """``user`` is one of ``asked`` (an owner may answer besides: the caller asks that)."""
    return user > 0 and (user in asked or EVERYONE in asked)


async def running(queue: DiskQueue, chat: Chat) -> list[int]:
    """:func:`askers` of the chat's running turn (its rows in flight)."""
    return askers([decode(r.payload) for r in await queue.inflight(chat.address)], chat.chat_id)


async def answerable(people: People, asked: Collection[int]) -> bool:
    """Someone who may answer is there to: anyone of a group, or one of ``asked`` who may still
    talk to the bot (in a private chat the owners are not there: its person is)."""
    if EVERYONE in asked:
        return True
    for user in asked:
        if await people.may_talk(user):
            return True
    return False


async def pushed_question(queue: DiskQueue, chat: Chat) -> bool:
    """The chat's running turn is a pushed one (or a reminder's) waiting on a question: the
    people of the chat answer it, in text too, whatever kind of turn it is (N1 aside)."""
    if not chat.waiting_input:
        return False
    return any(m.payload.get("kind") == PushedTurn.kind for m in await queue.inflight(chat.address)
               if m.claim == chat.claim)
