"""The compaction's transitions (:class:`_Compactions`): busy(compacting) captured, posted,
accepted, released and taken again, stopped, finished; and the stop and cancel marks."""

from __future__ import annotations

from typing import Any

from eve_client import Position

from ...storage.payloads import Kind, Origin
from ...storage.store import CancelMark, Chat, ChatStatus, CompactPhase
from .. import draftids, parking
from .record import _IDLE, ChatState, Finished, IllegalTransition, _claim_id, _Record, state_of


class _Compactions(_Record):
    """busy(compacting): captured, posted, accepted, released and taken again, stopped, finished."""

    __slots__ = ()

    # -- compactions -----------------------------------------------------------------------

    async def capture_manual(self, address: str, *, before: int, reply_to: int, lang: str) -> str | None:
        """idle → busy(compacting, manual) (M1): the claim, or None if the chat is not free, has
        nothing to compact, or a released compaction may still start in eve (C5: never two)."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or state_of(chat) is not ChatState.IDLE or chat.reset_requested or not chat.eve_session \
                    or chat.reset_mark:
                return None
            claim = _claim_id()
            now = self.clock()
            await self._write(address, _IDLE, status=ChatStatus.BUSY, kind=Kind.COMPACT, origin=Origin.MANUAL,
                              claim=claim, busy_since=now, progress_at=now, compact_notified=False,
                              compact_before=before, compact_phase=CompactPhase.WANTED, compact_reply_to=reply_to,
                              compact_lang=lang)
            return claim

    async def capture_for_window(self, address: str, *, before: int, threshold: int) -> str | None:
        """idle → busy(compacting, auto) (D3): the chat now answers on a model whose threshold its
        conversation (``before``, the last measurement) no longer fits under; compacted before
        its next turn, silently as parking does (C11). The claim, or None when the chat is not
        free, has no session, fits, parking is off for it (C8) or backs off after a failure."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            now = self.clock()
            if chat is None or state_of(chat) is not ChatState.IDLE or chat.reset_requested or not chat.eve_session \
                    or chat.reset_mark or chat.compaction_disabled or before < threshold \
                    or (chat.compact_retry_at is not None and now < chat.compact_retry_at):
                return None
            claim = _claim_id()
            await self._write(address, _IDLE, status=ChatStatus.BUSY, kind=Kind.COMPACT, origin=Origin.AUTO,
                              claim=claim, busy_since=now, progress_at=now, compact_notified=False,
                              compact_before=before, compact_phase=CompactPhase.WANTED, compact_reply_to=None,
                              compact_lang=None)
            return claim

    async def compact_posted(self, address: str, claim: str) -> None:
        """The compact request goes out now (C5: once per compaction)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_phase is not CompactPhase.WANTED:
                raise IllegalTransition(f"{address}: compaction already {chat.compact_phase}")
            await self._write(address, compact_phase=CompactPhase.POSTED)

    async def compact_accepted(self, address: str, claim: str) -> None:
        """eve accepted the request or announced the compaction."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.COMPACTING)
            await self._write(address, compact_phase=CompactPhase.ACCEPTED)

    async def release(self, address: str, claim: str, cursor: Position) -> None:
        """busy(compacting) → released: eve did not accept within the ack window (C6)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_phase not in (CompactPhase.WANTED, CompactPhase.POSTED):
                raise IllegalTransition(f"{address}: eve has the compaction ({chat.compact_phase})")
            origin = chat.origin
            await self._write(address, _IDLE, cursor=cursor, origin=origin, compact_phase=CompactPhase.RELEASED)

    async def recapture(self, address: str) -> str | None:
        """released → busy(compacting): eve announced the compaction after all (C6). The new claim,
        or None when the chat is not released any more (a turn or a /new came first)."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or state_of(chat) is not ChatState.RELEASED or chat.reset_requested:
                return None
            claim = _claim_id()
            await self._write(address, status=ChatStatus.BUSY, kind=Kind.COMPACT, claim=claim,
                              busy_since=self.clock(), progress_at=self.clock(), compact_notified=False,
                              compact_phase=CompactPhase.ACCEPTED)
            return claim

    async def end_watch(self, address: str) -> bool:
        """released → idle: the watch of a released compaction ended without one (C6, C10)."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or state_of(chat) is not ChatState.RELEASED:
                return False
            await self._write(address, _IDLE)
            return True

    async def want_stop(self, address: str, *, draft: int | None = None) -> Chat | None:
        """busy(turn|compacting) → the same, with the stop mark (L*: the stop button, /stop): the
        consumer cancels in eve. The chat as it was (also when a stop was asked for already: the
        consumer is woken to try the cancel again); None when nothing runs (idle, released), or
        when ``draft`` (the stop button's draft id) belongs to a turn that is over — a late press
        never stops the turn that came after."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or not chat.busy or chat.reset_requested:
                return None
            if draft is not None and (chat.kind is not Kind.TURN or chat.claim is None
                                      or not draftids.of_turn(draft, chat.claim)):
                return None
            if not chat.stop_wanted:
                await self._write(address, stop_wanted=True)
            return chat

    async def want_cancel(self, address: str, claim: str) -> bool:
        """C4: a message wants the compaction cancelled; True the first time."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_cancel is not None:
                return False
            await self._write(address, compact_cancel=CancelMark.WANTED)
            return True

    async def cancel_sent(self, address: str, claim: str) -> None:
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            if chat.compact_cancel is not CancelMark.WANTED:
                raise IllegalTransition(f"{address}: no cancel wanted")
            await self._write(address, compact_cancel=CancelMark.SENT)

    async def notify_compacting(self, address: str) -> bool:
        """C3: the first message during a compaction gets the notice; True when this one does."""
        # One guarded statement: it runs in every message's ingest transaction.
        return bool(await self.store.update_chat_if(
            address, {"status": ChatStatus.BUSY, "kind": Kind.COMPACT, "compact_notified": False},
            compact_notified=True))

    async def finish_compaction(self, address: str, claim: str | None, *, cursor: Position, ok: bool) -> Finished:
        """busy(compacting) or released → idle (C7): completed, cancelled (C4) or failed."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING, ChatState.RELEASED)
            now = self.clock()
            outcome = "completed" if ok else ("cancelled" if chat.compact_cancel is not None else "failed")
            fields: dict[str, Any] = {**_IDLE, "cursor": cursor, "progress_at": now}
            if ok:
                fields.update(after_pending=True, compact_failures=0, compact_retry_at=None,
                              compactions=chat.compactions + 1, after_report=chat.origin is Origin.MANUAL)
            elif outcome == "failed" and chat.origin is Origin.AUTO:
                failures = chat.compact_failures + 1
                fields.update(compact_failures=failures, compact_retry_at=now + parking.cooldown(failures))
            await self._write(address, fields)
            return Finished(chat, outcome)

    async def drop_compaction(self, address: str, claim: str) -> Chat:
        """busy(compacting) → idle: requested, but eve never began it (the answer was lost with a
        restart). Not a failure of the summarizer: no back-off counts it (R3)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.COMPACTING)
            await self._write(address, _IDLE)
            return chat
