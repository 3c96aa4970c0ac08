"""The phases of a busy period, each a small object the loop of
:class:`~bridge.chat.consumer.BusyPeriod` hands what arrives (R1, R2).

::

    TurnPhase ──park: below threshold──► (ended: idle)
        │  └──park: a compaction released before the turn is outstanding (C6)──► WatchPhase
        └──park: measurement ≥ threshold (C1, C2)──► CompactionPhase
    CompactionPhase ──ack window passed (C6): release──► WatchPhase
    WatchPhase ──eve begins it: recapture──► CompactionPhase
    CompactionPhase ──eve idle (C7)──► (ended: idle)
    WatchPhase ──a message, the busy timeout──► (ended: the worker takes it)

Modules, in import order: :mod:`.turn` (a turn's events, prompts, the stop, parking) imports
:mod:`.steer` (messages for a running turn) and :mod:`.compaction` (the compaction and its
released watch), which import :mod:`.base` (the typed inbox, the results, the shared facts
of the period, the two enums of a turn and the spend record).
"""
