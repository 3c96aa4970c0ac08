"""A chat's life: one state machine, driven by eve's durable stream (R1, R2; DESIGN §1).

::

                 claim_turn                          park: measurement ≥ threshold
   idle ─────────────────────────► busy(turn) ─────────────────────────► busy(compacting, auto)
   ▲ ▲ ◄───────────────────────────┘ │  park: below threshold              │  WANTED → POSTED
   │ │      give_back / fail_turn    │                                     │  → ACCEPTED
   │ │                               │ gone / stuck: session_lost          │  eve idle after it:
   │ │                               ▼  (reset mark, fresh session)        │  finish_compaction
   │ └────────────── idle + reset mark ◄───────────────────────────────────┤
   │                                                                       │ ack window passed
   │  capture_manual (/compact, idle, measured ≥ minimum)                  ▼ (C6): release
   │  capture_for_window (/model: a smaller window, D3) → busy(compacting, auto)
   ├──────────────────────────► busy(compacting, manual) ──────►  released (idle, watched)
   │  finish_compaction / drop_compaction ◄────┘                           │ compaction.requested:
   │                                                                       │ recapture → busy(
   └───────────────────────────────── end_watch / claim_turn ◄─────────────┘  compacting)

   any state ── request_new (/new) ──► reset requested ── new_conversation ──► idle, fresh session

Inside a state, transitions that move no arrow: ``session_opened``, ``session_dropped``,
``delivered``, ``advance``, ``waiting_on_person``, ``in_turn_compacted``, ``turn_shared``,
``send_failed``, ``claim_steer``, ``steer_taken``, ``steer_returned`` (a turn; the last three:
messages steered into it);
``compact_posted``, ``compact_accepted``, ``want_cancel``, ``cancel_sent``, ``notify_compacting`` (a
compaction); ``want_stop`` (a turn or a compaction: the stop button, /stop); ``built_by``
(which eve built the session, V5); ``touch``,
``mark_blocked``, ``bot_removed`` (any state); ``repair_at_start`` (before any worker runs:
in-flight messages of free chats back to the queue, released watches ended).

The record (:class:`bridge.storage.chats.Chat`) is the one source of truth: status, kind, origin, eve
session, cursor, claim, deliveries, the compaction phase (``compact_phase``: wanted, posted,
accepted, released; ``compact_cancel``: wanted, sent) and the marks (reset mark, /new
requested, C3 notice sent, C8 disabled, waiting on the person, stop asked for). Only :mod:`.transitions` writes
them, one named transition per transaction, its precondition checked inside.

Modules, in import order (each imports only those below it):

* :mod:`.worker` — the scheduler and one task per address: claim, drive, /new;
* :mod:`.recovery` — a busy record with no consumer (a restart, a captured /compact) resumed
  from its cursor; sending a claimed turn;
* :mod:`.consumer` — the busy period on eve's stream: a loop over its phases;
* :mod:`.phases` — the phases (:mod:`.phases.turn`: turn events, prompts, parking, the live draft
  and the stop; :mod:`.phases.steer`; :mod:`.phases.compaction`: the compaction — request, ack
  window, cancel (C4), finish (C7) — and its released watch) and the typed inbox;
* :mod:`.live` — the live draft of a private chat (L*): throttled frames, the progress line;
* :mod:`.endings` — ``end(outcome)``: a session lost (R2, R3), a refused or unheard turn, with
  what the person hears;
* :mod:`.delivery` and :mod:`.compose` — a turn's messages to eve;
* :mod:`.services` — the frozen bundle of services the machinery is given;
* :mod:`.outbox` — durable notices and replies on their way to Telegram;
* :mod:`.transitions` — every write of a chat's state;
* :mod:`.askers` — who may answer a turn's question (S3; a pushed turn's: its chat's people, F11);
* :mod:`.parking` — the pure decisions (threshold, C8, back-off);
* :mod:`.albums` — the pure decision of which claimed messages go now (an album whole, once
  settled: ``claim_turn`` answers :class:`~.transitions.Settling` until then);
* :mod:`.media` — a turn's file parts and transcripts, kept until eve has the turn (an outage
  does not fetch and transcribe again at every retry).

Recovery is not a second machine: a restart finds busy records and hands each to the same
consumer from its saved cursor. What a restart cannot read from eve's stream is in the record.
"""
