"""The one error tree of the bridge (eve's own errors are :mod:`eve_client`'s, drawn there).

    BridgeError
    ├── ConfigError            config/_env.py: every problem found in the environment, one line each
    ├── StateUnavailable       storage/state.py: the state database cannot be used (locked, full, not permitted)
    ├── StateCorrupt           storage/state.py: SQLite found the database corrupt while the bridge ran (exit 5)
    ├── SchemaMismatch         storage/schema.py: the database's schema is not this Iva's (iva status)
    ├── SchemaTooNew           storage/schema.py: a newer Iva wrote the state (exit 6)
    ├── OtherBot               storage/schema.py: the state is another bot's (exit 7)
    ├── IllegalTransition      chat/transitions/: not defined from the chat's current state
    │   └── Superseded         the busy period a caller follows is over (its claim is not the record's)
    ├── Lost                   chat/delivery.py: the eve session is gone, stranded or stuck
    ├── Unheard                chat/delivery.py: nothing to send but recordings without a transcript
    ├── TranscribeFailed       chat/transcribe.py: a recording has no transcript
    ├── SpeakFailed            chat/speak.py: no voice for an answer
    ├── TooBig                 chat/compose.py: a file over the size cap
    ├── ChatGone               telegram/sender.py: the bot was blocked or kicked, the chat or topic is gone
    │   └── TopicGone          a forum topic is gone (the group still is there)
    ├── EphemeralRefused       telegram/sender.py: Telegram would not show a message to one person alone
    ├── Paced                  telegram/pacing.py: a draft frame or typing not sent now (try again later)
    ├── PushError              push/turns.py: a pushed turn's bad input
    ├── ToolUsed               notebook/rebuild.py: the rebuild's model called a tool (S5)
    └── NoteError              notebook/rules.py: a refusal the model reads (also a ValueError)

Private control-flow exceptions (``app._Shutdown``, ``web.mcp._Refused`` …) and the
storage layer's ``diskqueue.DatabaseError`` stay outside: they never leave their module.
This module imports nothing of the bridge, so every layer may derive from it.
"""

from __future__ import annotations

__all__ = ["BridgeError"]


class BridgeError(Exception):
    """Root of every error the bridge raises on purpose."""
