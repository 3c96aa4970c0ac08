"""T5, V6: what a turn waits on a person for, shown so that a person can act on it.

- **An approval or a question**: a message with its options as buttons (free text answers a
  question too), for the people whose turn asked and the owners (S3, F11: bridge/chat/askers.py).
- **A budget prompt** (eve's ``limits.sessionUsage`` guardrail): only an owner may let the
  assistant go on. In an owner's private chat it is asked there, with Continue / Stop; anywhere
  else the chat is told in one line that the owner was asked, and each owner gets the prompt in
  their private chat. It never holds a chat for ever: nobody present may answer it, so the busy
  timeout counts, and then the turn is stopped with one line (the session stays over budget until
  someone continues: the next message meets the prompt again).
- **A sign-in**: its prompt with the link as a button (and a device code where eve gives one).
- **A kind Iva does not know**: said in one line, and the turn stopped — never a silent wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import eve_client as eve

from ...storage.payloads import PromptButton
from ...storage.store import Chat
from ...telegram.texts import t
from .. import askers
from .base import Period

__all__ = ["Shown", "show"]

# eve's budget options (PROTOCOL-27.md §9; 0.80's "continue"/"stop" as its reader maps them)
_CONTINUE = frozenset({"approve", "continue"})
_STOP = frozenset({"deny", "stop"})


@dataclass(frozen=True, slots=True)
class Shown:
    """``answerable``: someone present may answer (else the busy timeout counts, F11). ``budget``:
    a budget prompt is open (owners only). ``unknown``: a kind Iva cannot show (the caller says it
    and stops the turn)."""

    answerable: bool
    budget: bool = False
    unknown: str | None = None


async def show(p: Period, chat: Chat, event: eve.QuestionOpened, claim: str) -> Shown:
    """Each request of ``event`` shown as its kind needs, committed with the cursor."""
    store = p.s.store
    unknown = next((q.kind for q in event.questions if not q.known), None)
    if unknown is not None:
        return Shown(answerable=False, unknown=unknown)
    # S3: the people whose messages make this turn may answer (and the owners, always); a
    # pushed turn's or a reminder's: the people of its chat (F11, bridge/chat/askers.py).
    asked = await askers.running(p.s.queue, chat)
    answerable = await askers.answerable(p.s.people, asked)
    budget = any(q.kind == "budget" for q in event.questions)
    owners = await p.s.people.owners() if budget else []
    await p.stop_typing()  # before the buttons are sent, which the commit below does
    async with store.db.transaction():
        for request in event.questions:
            key = f"{event.key}:{request.id}"
            if request.kind == "budget":
                await _budget(p, chat, request, key, owners)
                continue
            prompt_id = await store.add_prompt(p.address, p.session, request.id, [o.id for o in request.options],
                                               chat_id=chat.chat_id, askers=asked)
            buttons = [{"text": o.label[:60], "callback_data": PromptButton(prompt_id, i).encode()}
                       for i, o in enumerate(request.options[:12])]
            rows = [buttons[i:i + 3] for i in range(0, len(buttons), 3)] or None
            text = request.prompt or t("input_needed", chat.lang)
            if request.kind == "sign-in":
                text = _sign_in(request, chat.lang)
                if request.link:
                    rows = [[{"text": t("sign_in_button", chat.lang), "url": request.link}]]
            await store.put_outgoing(p.address, key, chat.chat_id, chat.thread_id, text, markup=rows)
        await p.s.transitions.advance(p.address, claim, p.cursor)
    # A budget prompt waits on an owner, who is never "present" for the busy timeout's sake:
    # given up after it (V6), unlike a question its askers may take their time over (F5).
    return Shown(answerable=answerable and not budget, budget=budget)


async def _budget(p: Period, chat: Chat, request: eve.Question, key: str, owners: list[int]) -> None:
    """An owner's private chat is asked in place; any other chat is told the owner was asked, and
    each owner gets the prompt in their private chat (one prompt: the first press answers it)."""
    store = p.s.store
    here = chat.chat_id in owners
    prompt_id = await store.add_prompt(p.address, p.session, request.id, [o.id for o in request.options],
                                       chat_id=chat.chat_id if here else None, askers=[askers.OWNERS])
    options = [o for o in request.options if o.id in _CONTINUE | _STOP] or list(request.options)

    def rows(lang: str) -> list[list[dict[str, str]]]:
        label = {**{i: t("budget_continue", lang) for i in _CONTINUE}, **{i: t("budget_stop", lang) for i in _STOP}}
        return [[{"text": label.get(o.id, o.label)[:60],
                  "callback_data": PromptButton(prompt_id, request.options.index(o)).encode()} for o in options]]

    if here:
        await store.put_outgoing(p.address, key, chat.chat_id, chat.thread_id, t("budget_prompt", chat.lang),
                                 markup=rows(chat.lang))
        return
    await p.s.outbox.say(chat, key, t("budget_waiting_owner", chat.lang))
    for owner in owners:
        await store.put_outgoing(str(owner), f"{key}:owner", owner, None,
                                 t("budget_prompt_for", chat.lang, chat=p.address), markup=rows(chat.lang))


def _sign_in(request: eve.Question, lang: str) -> str:
    lines = [request.prompt or t("sign_in_needed", lang)]
    if request.provider:
        lines[0] = f"{request.provider}: {lines[0]}"
    if request.code:
        lines.append(request.code)
    if request.link:
        lines.append(request.link)
    return "\n".join(lines)
