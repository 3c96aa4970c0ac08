"""The words of a turn as eve writes them (T6, L1, L2, L*): the block being written shows in
the live draft; a finished answer block goes to the outbox (keyed on its place in eve's stream);
narration shows only in the draft; a stopped turn's text stays readable, marked as stopped."""

from __future__ import annotations

import eve_client as eve

from ...storage.store import Chat
from ...telegram.texts import t
from .. import draftids, speak
from ..live import progress_line
from .base import Period, Stop

__all__ = ["Reply"]


class Reply:
    """The turn's text: ``block`` is the one being written, ``draft_id`` its draft's."""

    def __init__(self, p: Period, chat: Chat) -> None:
        self.p = p
        self.chat = chat
        self.block = ""
        self.draft_id = 0

    def delta(self, event: eve.TextDelta, stop: Stop) -> None:
        self.block += event.delta
        self.show(event.position.line, self.block, stop)

    def tool(self, event: eve.ToolCalled, stop: Stop) -> None:
        """L2: while no text is being written, the draft names the tool at work."""
        name = event.label or (event.names[0] if event.names else "")
        if name and not self.block.strip():
            self.show(event.position.line, progress_line(name, self.chat.lang), stop)

    async def done(self, event: eve.TextDone, claim: str, stop: Stop) -> Stop:
        """A finished block: an answer part goes out, once; the stop flags as they are after it."""
        p, s, chat = self.p, self.p.s, self.chat
        if event.phase is eve.Phase.NARRATION:
            # Words on the way to a tool (eve 1.x): progress, never the answer. The draft showed
            # them as they came; without a draft they are not sent (docs/behaviour.md). A stopped
            # turn's partial text arrives so, marked interrupted: the stop rule shows it.
            self.block = event.text if event.interrupted and stop else ""
            if not self.block:
                self.draft_id = 0
            return stop
        text, self.block, self.draft_id = event.text, "", 0
        if p.draft is not None:
            await p.draft.settle()  # no frame may land after the final message
        if not text.strip() or Stop.SHOWN in stop:
            return stop
        if stop:  # written before the stop reached eve: readable, marked
            text = f"{text}\n\n{t('stopped_mark', chat.lang)}"
            stop |= Stop.SHOWN
        if p.typing is not None and event.final:
            await p.typing.stop()  # never after the final send (LESSONS #12), which the commit below does
        async with s.store.db.transaction():
            await s.store.put_outgoing(p.address, event.key, chat.chat_id, chat.thread_id, text)
            await s.transitions.advance(p.address, claim, p.cursor)
            await p.spend.commit(s.store, p.address)
        await speak.after_answer(s, p.address, chat.chat_id, chat.thread_id, text)  # P4
        return stop

    async def ended(self, event: eve.TurnEnded, claim: str, stop: Stop) -> Stop:
        """The turn is over: L*, what was written before the stop stays readable, marked."""
        p, s, chat = self.p, self.p.s, self.chat
        if stop and self.block.strip() and Stop.SHOWN not in stop:
            if p.draft is not None:
                await p.draft.settle()
            async with s.store.db.transaction():
                await s.store.put_outgoing(p.address, f"stopped:{event.key}", chat.chat_id, chat.thread_id,
                                           f"{self.block}\n\n{t('stopped_mark', chat.lang)}")
                await s.transitions.advance(p.address, claim, p.cursor)
            stop |= Stop.SHOWN
        self.block, self.draft_id = "", 0
        return stop

    def show(self, line: int, text: str, stop: Stop) -> None:
        """The live draft shows ``text`` (one draft id per text block, from its first event)."""
        draft = self.p.draft
        if draft is None or stop:
            return
        if not self.draft_id:
            # Non-zero, the same when a restart replays the block, and naming this turn: a late
            # press of a finished draft's stop button never stops the turn after it.
            self.draft_id = draftids.draft_id(self.p.owned(), line)
        draft.show(self.draft_id, text)

    async def end_draft(self) -> None:
        """The draft shows nothing more; the next block gets a draft of its own."""
        await self.p.end_draft()
        self.draft_id = 0
