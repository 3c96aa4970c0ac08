"""The turn's transitions: idle → busy(turn), every step inside a turn (:class:`_Turns`), and the
ways out of it (:class:`_TurnEnds`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from diskqueue import Message
from eve_client import START, Position

from ...push import turns as pushed
from ...storage.payloads import InputAnswer, Kind, Origin, PushedTurn, QueuedMessage, decode
from ...storage.store import Chat, ChatStatus, CompactPhase
from .. import albums, askers, owners, parking
from .record import (
    _IDLE,
    ChatState,
    Claim,
    IllegalTransition,
    Parked,
    Settling,
    _claim_id,
    _fresh,
    _Record,
    steer_claim,
)

# V6: how far a look for a budget prompt's button answer reaches into the queue (its place behind
# a busy group's messages)
ANSWERS_SCAN = 1000

class _Turns(_Record):
    """idle → busy(turn), and every step inside a turn."""

    __slots__ = ()

    # -- idle → busy(turn) ------------------------------------------------------------------

    async def claim_turn(self, address: str, *, limit: int, files_budget: int | None = None,
                         file_cap: int = 0) -> Claim | Settling | None:
        """idle|released → busy(turn) with the address's next messages; None when there is nothing
        to claim or the chat is not free (busy, or a /new waits); :class:`Settling` (nothing
        written) when the next message is part of an album still arriving (:mod:`.albums`: an
        album goes whole, once settled). With ``files_budget`` (bytes),
        the turn takes messages while their files' declared sizes fit (one of unknown size counts
        as ``file_cap``); the first always goes, the rest wait for the next turn."""
        async with self.store.db.transaction():
            chat = await self.store.chat(address)
            if chat is None or chat.busy or chat.reset_requested:
                return None
            claim = _claim_id()
            messages = await self.queue.claim(address, limit=limit + albums.LOOKAHEAD, claim=claim)
            items = [decode(m.payload) for m in messages]
            stale = [m for m, item in zip(messages, items, strict=True) if isinstance(item, InputAnswer)]
            if stale:
                # A button pressed after its turn ended: nothing waits for it any more.
                await self.queue.ack([m.id for m in stale], claim=claim)
                kept = [(m, i) for m, i in zip(messages, items, strict=True) if not isinstance(i, InputAnswer)]
                messages, items = [m for m, _ in kept], [i for _, i in kept]
            if not messages:
                return None
            if (alone := pushed.alone(items)) < len(messages):  # W1: a pushed turn is a turn of its own
                await self.queue.nack([m.id for m in messages[alone:]], claim=claim)
                messages, items = messages[:alone], items[:alone]
            taken = self.album_cut(messages, items, await self.queue.queued(address), limit=limit)
            if taken.take < len(messages):
                await self.queue.nack([m.id for m in messages[taken.take:]], claim=claim)
                messages, items = messages[:taken.take], items[:taken.take]
            if taken.wait_until is not None:
                return Settling(taken.wait_until)
            if files_budget is not None:
                spent, cut = 0, len(messages)
                for i, item in enumerate(items):
                    if isinstance(item, QueuedMessage) and item.attachment is not None:
                        spent += item.attachment.size or file_cap
                        if spent > files_budget and i > 0:
                            cut = i
                            break
                if cut < len(messages):
                    await self.queue.nack([m.id for m in messages[cut:]], claim=claim)
                    messages, items = messages[:cut], items[:cut]
            first = items[0]
            owner = isinstance(first, QueuedMessage | PushedTurn) and first.owner
            fields: dict[str, Any] = {"owner_turn": owner}
            if self.notebook is not None:
                # N1: the notebook rides only in the owner's turns, so a turn is one kind or the
                # other: the first message that differs waits for the next turn.
                cut = next((i for i, item in enumerate(items)
                            if isinstance(item, QueuedMessage) and item.owner != owner), len(messages))
                if cut < len(messages):
                    await self.queue.nack([m.id for m in messages[cut:]], claim=claim)
                    messages = messages[:cut]
                if owner:
                    fields["notes_mode"] = await self.notebook.mode_at_entry(chat)  # N2: fixed for the turn
            session = None if chat.reset_mark else chat.eve_session
            now = self.clock()
            if session is not None and chat.compact_phase is CompactPhase.RELEASED:
                # C6: a released compaction eve may still announce stays outstanding through the
                # turn; the turn's end watches for it again (park).
                fields.update(compact_phase=CompactPhase.RELEASED, origin=chat.origin)
            await self._write(address, **{
                **_IDLE, **(_fresh(chat) if session is None else {}), **fields,
                "status": ChatStatus.BUSY, "kind": Kind.TURN, "claim": claim, "busy_since": now,
                "progress_at": now, "reset_mark": False, "eve_session": session,
                "cursor": chat.cursor if session else START,
            })
            return Claim(claim=claim, session=session, messages=messages)

    # -- inside a turn ---------------------------------------------------------------------

    async def session_opened(self, address: str, claim: str, session: str, *, eve_version: str | None = None) -> Chat:
        """busy(turn) without a session → with this new one, read from its start; ``eve_version``
        built it (V5: another eve strands it). A session an upgrade left behind is forgotten here:
        the caller tells the person in the same commit. The chat as it was."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            if chat.eve_session is not None:
                raise IllegalTransition(f"{address} has a session already")
            await self._write(address, eve_session=session, cursor=START, session_eve=eve_version)
            return chat

    async def session_dropped(self, address: str, claim: str, *, upgraded: bool = False) -> None:
        """eve no longer knows the session: the turn goes on in a new one (all fresh).
        ``upgraded``: an eve upgrade stranded it — the new session tells the person, once (V5)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            await self._write(address, _fresh(chat), upgraded_from=chat.eve_session if upgraded else chat.upgraded_from)

    async def delivered(self, address: str, claim: str, delivery_id: str | None,
                        marks: Mapping[str, int] | None = None, *, steered: Sequence[int] = (),
                        steer_claim: str | None = None) -> None:
        """eve has a message of this turn; the one-shot notebook marks (N6) go with it. A steered
        message (claimed under ``steer_claim`` until eve had it, F4) joins the turn's claim in
        the same commit."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            known = [*chat.deliveries, delivery_id] if delivery_id else list(chat.deliveries)
            if steered and steer_claim is not None:
                await self.queue.reassign(steered, claim=steer_claim, to=claim)
            # V5: eve has the new session's first send (and the exchange carried with it)
            await self._write(address, deliveries=known, progress_at=self.clock(), upgraded_from=None, **(marks or {}))

    async def advance(self, address: str, claim: str, cursor: Position) -> None:
        """The consumer applied eve's events up to ``cursor`` (effects in the caller's transaction).
        The hot path of every reply: one guarded statement; the record is read only to say why
        it did not apply."""
        async with self.store.db.transaction():
            if not await self.store.update_chat_if(address, {"claim": claim, "status": ChatStatus.BUSY},
                                                   cursor=cursor, progress_at=self.clock()):
                await self._owned(address, claim, ChatState.TURN, ChatState.COMPACTING)
                raise IllegalTransition(f"{address}: advance did not apply")

    async def waiting_on_person(self, address: str, claim: str, *, waiting: bool,
                                cursor: Position | None = None) -> None:
        """T5: the turn waits on the person's answer (or no longer does)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            fields: dict[str, Any] = {"waiting_input": waiting}
            if cursor is not None:
                fields.update(cursor=cursor, progress_at=self.clock())
            await self._write(address, fields)

    async def in_turn_compacted(self, address: str, claim: str, cursor: Position) -> None:
        """eve compacted inside the turn: a compaction all the same (the N6 nudge counts it)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            await self._write(address, compactions=chat.compactions + 1, cursor=cursor)

    async def turn_shared(self, address: str, claim: str) -> None:
        """Someone else's words joined the owner's turn: it is not the owner's any more (N1)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self._write(address, owner_turn=False)

    async def claim_steer(self, address: str, claim: str, *, limit: int,
                          answers_only: bool = False) -> Claim | Settling | None:
        """busy(turn) → the same, with the next messages claimed for the running turn under the
        steer's own claim (:func:`steer_claim`, F4: until eve has them). Pushed turns stay
        queued (W1: never steered into a turn), and so does a message of the other kind (N1: the
        notebook rides one kind of turn); an album steers whole, once settled (I3):
        :class:`Settling` (nothing claimed) until then. None: nothing to steer."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            steer = steer_claim(claim)
            if answers_only:
                # V6: a budget prompt is open: the button answers go, wherever they are in the queue
                # (behind a busy group's messages); the messages stay queued, in order
                claimed = await self.queue.claim(address, limit=ANSWERS_SCAN, claim=steer)
                answers = [m for m in claimed if isinstance(decode(m.payload), InputAnswer)]
                await self.queue.nack([m.id for m in claimed if m not in answers], claim=steer)
                return Claim(claim=steer, session=chat.eve_session, messages=answers) if answers else None
            claimed = await self.queue.claim(address, limit=limit + albums.LOOKAHEAD, claim=steer)
            claimed = await pushed.unsteered(self.queue, claimed, claim=steer)  # W1: never steered into a turn
            if self.notebook is not None and not await askers.pushed_question(self.queue, chat):
                # N1: the notebook rides one kind of turn; the other kind waits. A pushed turn's
                # question is the chat's people's (F11): their answer joins it (the turn shared).
                claimed = await owners.own_kind(self.queue, claimed, owner_turn=chat.owner_turn, claim=steer)
            if not claimed:
                return None
            taken = self.album_cut(claimed, [decode(m.payload) for m in claimed], await self.queue.queued(address),
                                   limit=limit)
            if taken.take < len(claimed):
                await self.queue.nack([m.id for m in claimed[taken.take:]], claim=steer)
                claimed = claimed[:taken.take]
            if taken.wait_until is not None:
                return Settling(taken.wait_until)
            return Claim(claim=steer, session=chat.eve_session, messages=claimed)

    async def send_failed(self, address: str, claim: str, ids: Sequence[int]) -> None:
        """busy(turn) stays: eve, itself up, answered the turn's send with a server error; the
        failure is counted (F6: a message eve always fails on is sent a bounded number of times)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.count_failure(ids, claim=claim)

    async def steer_taken(self, address: str, claim: str, ids: Sequence[int]) -> None:
        """A steer's messages are done with: eve took the answers, or they are recordings
        nobody could hear (told in the caller's transaction)."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.ack(ids, claim=steer_claim(claim))

    async def steer_returned(self, address: str, claim: str, ids: Sequence[int]) -> None:
        """A steer's messages go back to the head of the queue: eve never had them."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.nack(ids, claim=steer_claim(claim))



class _TurnEnds(_Record):
    """The ways out of a turn: parked, given back, failed, lost."""

    __slots__ = ()

    # -- the ways out of a turn --------------------------------------------------------------

    async def park(self, address: str, claim: str, *, cursor: Position, measurement: int | None, threshold: int,
                   may_compact: bool, announced: bool = False, first: int | None = None) -> Parked:
        """busy(turn) → idle, or straight into busy(compacting, auto) in the same commit (C1, C2);
        → released when a compaction released before this turn is still outstanding at eve and
        was not announced during it (C6: the consumer watches for it)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            outstanding = chat.compact_phase is CompactPhase.RELEASED and not announced
            may_compact = may_compact and not outstanding  # C5: never a second request
            now = self.clock()
            decision = parking.parking_decision(chat, measurement, threshold, first=first, now=now)
            inflight = await self._ack_inflight(chat)
            fields: dict[str, Any] = {**_IDLE, "cursor": cursor, "progress_at": now, "turns": chat.turns + 1,
                                      **decision.updates}
            if measurement is not None:
                fields.update(measurement=measurement, measured_at=now)
            after_before = None
            if decision.after is not None and chat.after_report:
                after_before = chat.compact_before
                fields["after_report"] = False
            compaction_claim = None
            if decision.compact and may_compact:
                compaction_claim = _claim_id()
                fields.update(status=ChatStatus.BUSY, kind=Kind.COMPACT, origin=Origin.AUTO, claim=compaction_claim,
                              busy_since=now, compact_notified=False, compact_before=measurement,
                              compact_phase=CompactPhase.WANTED, compact_reply_to=None, compact_lang=None)
            elif outstanding:
                fields.update(compact_phase=CompactPhase.RELEASED, origin=chat.origin)
            await self._write(address, fields)
            if chat.eve_session:
                await self.store.close_prompts(chat.eve_session)
            return Parked(chat, inflight, decision, compaction_claim, after_before)

    async def give_back(self, address: str, claim: str) -> None:
        """busy(turn) → idle without a turn (eve never had it): the messages go back to the head."""
        async with self.store.db.transaction():
            await self._owned(address, claim, ChatState.TURN)
            await self.queue.nack([m.id for m in await self.queue.inflight(address)])
            await self._write(address, _IDLE)

    async def fail_turn(self, address: str, claim: str) -> tuple[Chat, list[Message]]:
        """busy(turn) → idle: eve refused the message itself; it is done with."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN)
            inflight = await self._ack_inflight(chat)
            await self._write(address, _IDLE)
            return chat, inflight

    async def session_lost(self, address: str, claim: str | None, *,
                           upgraded: bool = False) -> tuple[Chat, list[Message]]:
        """any busy state or a released watch → idle with the session-reset mark (R2, R3): the
        session is gone, stranded or stuck; the next message starts a new one. ``upgraded``: an
        eve upgrade stranded it — the next new session tells the person so, once (V5)."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN, ChatState.COMPACTING, ChatState.RELEASED)
            inflight = await self._ack_inflight(chat)
            await self._write(address, _IDLE, _fresh(chat), reset_mark=True,
                              upgraded_from=chat.eve_session if upgraded else chat.upgraded_from)
            return chat, inflight

    async def built_by(self, address: str, claim: str, eve_version: str) -> None:
        """The session's first event names the eve that built it (V5: what strands it later);
        the guess made when it was created (eve's version as last seen) is corrected."""
        async with self.store.db.transaction():
            chat = await self._owned(address, claim, ChatState.TURN, ChatState.COMPACTING)
            if chat.session_eve != eve_version:
                await self._write(address, session_eve=eve_version)

    async def _ack_inflight(self, chat: Chat) -> list[Message]:
        """The turn's messages are done; any other in flight (a steer eve never confirmed, F4)
        goes back to the head of the queue. Returns the turn's."""
        inflight = await self.queue.inflight(chat.address)
        mine = [m for m in inflight if m.claim == chat.claim]
        others = [m.id for m in inflight if m.claim != chat.claim]
        if mine:
            await self.queue.ack([m.id for m in mine], claim=chat.claim)
        if others:
            await self.queue.nack(others)
        return mine
