"""The parking handler: the turn is over at eve and eve is idle (C1, C2, C6, N7, N11).

It measures and, at or above the threshold, moves the chat from busy(turn) to busy(compacting,
auto) in the same transaction that finishes the turn, so no message slips in between;
:mod:`.compaction` follows it from there."""

from __future__ import annotations

from ... import log
from ...metrics import METRICS
from ...storage.store import CompactPhase
from ...telegram.texts import number, t
from .. import notewrites
from .base import Ended, Period, Phase, Stop
from .compaction import Compaction, CompactionPhase, WatchPhase

__all__ = ["park"]

logger = log.get(__name__)


async def park(p: Period, *, measurement: int | None, first: int | None, announced: bool) -> Phase | Ended:
    """Release the chat, or move it straight into a compaction (C1, C2). ``measurement``: the
    turn's last model call's input; ``first``: its first (a compaction's "after", seed 004);
    ``announced``: a compaction released before the turn was announced during it (C6)."""
    s = p.s
    claim = p.owned()
    threshold = await s.threshold(p.address)  # D3: the chat's model's, as it is now
    async with s.store.db.transaction():
        parked = await s.transitions.park(
            p.address, claim, cursor=p.cursor, measurement=measurement, threshold=threshold,
            may_compact=not s.requests.outstanding(p.address), announced=announced, first=first,
        )
        await p.spend.commit(s.store, p.address)
        chat = parked.chat
        await notewrites.tell_writes(s, chat, claim, parked.inflight)  # seed 000: every write visible
        if parked.after_before is not None and parked.decision.after is not None:
            await s.outbox.say(chat, f"after:{p.cursor}:{chat.claim}",
                               t("compact_after", chat.compact_lang or chat.lang, after=number(parked.decision.after),
                                 before=number(parked.after_before)))
    METRICS.turns.labels(outcome="completed").inc()
    logger.info("turn_finished", measurement=measurement, messages=len(parked.inflight),
                threshold=threshold, compacting=parked.compaction_claim is not None,
                **parked.decision.updates)
    if chat.owner_turn and s.rebuilder is not None and s.rebuilder.wanted(p.address):
        # N7: after the turn, beside the compaction, never in front of the reply (sent already).
        s.spawn(s.rebuilder.maybe_run(p.address))
    if parked.compaction_claim is None:
        if chat.compact_phase is not CompactPhase.RELEASED:
            return Ended()
        watched = await s.store.chat(p.address)
        if watched is None or watched.compact_phase is not CompactPhase.RELEASED:
            return Ended()  # announced during the turn: nothing outstanding
        # C6: the compaction released before this turn is still outstanding at eve: watch
        # for its announcement (which takes the chat again) as the released watch does.
        await p.stop_typing()
        p.typing = None
        p.claim = None
        logger.info("compaction_watch_resumed_after_turn")
        return WatchPhase(p, Compaction(watched))
    # busy(turn) → busy(compacting, auto): auto compaction is silent (C11).
    await p.close()
    current = await s.store.chat(p.address)
    assert current is not None
    # The turn's stop is over with the turn (the record's mark was cleared when it parked):
    # a /stop now stops the compaction.
    p.claim = parked.compaction_claim
    return CompactionPhase(p, Compaction(current), stop=Stop.WANTED if current.stop_wanted else Stop.NONE)
