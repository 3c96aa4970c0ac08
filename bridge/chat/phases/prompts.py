"""T5: what a turn waits on a person for, shown as a message with its options as buttons."""

from __future__ import annotations

import eve_client as eve

from ...storage.payloads import PromptButton
from ...storage.store import Chat
from ...telegram.texts import t
from .. import askers
from .base import Period

__all__ = ["show"]


async def show(p: Period, chat: Chat, event: eve.QuestionOpened, claim: str) -> bool:
    """Each question or approval as a message with its options as inline buttons, committed with
    the cursor. True when someone present may answer it (F11: else the busy timeout counts)."""
    store = p.s.store
    # S3: the people whose messages make this turn may answer (and the owners, always); a
    # pushed turn's or a reminder's: the people of its chat (F11, bridge/chat/askers.py).
    asked = await askers.running(p.s.queue, chat)
    answerable = await askers.answerable(p.s.people, asked)
    await p.stop_typing()  # before the buttons are sent, which the commit below does
    async with store.db.transaction():
        for request in event.questions:
            prompt_id = await store.add_prompt(p.address, p.session, request.id, [o.id for o in request.options],
                                               chat_id=chat.chat_id, askers=asked)
            buttons = [{"text": o.label[:60], "callback_data": PromptButton(prompt_id, i).encode()}
                       for i, o in enumerate(request.options[:12])]
            rows = [buttons[i:i + 3] for i in range(0, len(buttons), 3)] or None
            text = request.prompt or t("input_needed", chat.lang)
            await store.put_outgoing(p.address, f"{event.key}:{request.id}", chat.chat_id, chat.thread_id, text,
                                     markup=rows)
        await p.s.transitions.advance(p.address, claim, p.cursor)
    return answerable
