"""Settings from the environment (SPEC §2), validated once, with one clear message per bad value.

One frozen value object per concern, each with its defaults beside it and read by its own reader
from the environment (httpx's ``Timeout``, ``Limits``, ``Proxy``): :class:`EveConfig`,
:class:`TelegramConfig`, :class:`PacingConfig`, :class:`WebhookConfig`, :class:`ApiConfig` (the
local HTTP listener), :class:`ChatConfig` (the turns), :class:`CompactionConfig`, :class:`NotesConfig`,
:class:`VoiceConfig`, :class:`PeopleConfig` and :class:`Models`. :class:`Settings` composes them;
:meth:`Settings.from_env` runs every reader and raises every problem found as one :class:`ConfigError`.

    _env.py       Env (the readers' helpers, one message per bad value), ConfigError, state_dir_of
    _telegram.py  TelegramConfig, PacingConfig, WebhookConfig, token_problem
    _chat.py      EveConfig, ChatConfig, CompactionConfig, PeopleConfig
    _local.py     ApiConfig, NotesConfig, VoiceConfig, is_loopback, listener_problem
    _models.py    Model, Models, read_models (IVA_MODELS, IVA_NOTES_MODEL)
    _settings.py  Settings, from_env
"""

from __future__ import annotations

from ._chat import (
    DEFAULT_BATCH,
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_COMPACT_ACK_SECONDS,
    DEFAULT_COMPACT_CEILING,
    DEFAULT_COMPACT_PERCENT,
    DEFAULT_EVE_GRACE,
    DEFAULT_INVITE_HOURS,
    DEFAULT_MANUAL_COMPACT_MIN,
    DEFAULT_MAX_TURNS,
    DEFAULT_SEND_ATTEMPTS,
    DEFAULT_SEND_MAX_AGE,
    ChatConfig,
    CompactionConfig,
    EveConfig,
    PeopleConfig,
    read_chat,
    read_compaction,
    read_eve,
    read_people,
)
from ._env import (
    ConfigError,
    Env,
    state_dir_of,
)
from ._local import (
    DEFAULT_API_LISTEN,
    DEFAULT_HEALTH_REPLY_SECONDS,
    DEFAULT_SPEAK_TIMEOUT,
    DEFAULT_TRANSCRIBE_TIMEOUT,
    ApiConfig,
    NotesConfig,
    VoiceConfig,
    is_loopback,
    listener_problem,
    read_api,
    read_notes,
    read_voice,
)
from ._models import (
    MODELS_EXAMPLE,
    Model,
    Models,
    models_of,
    read_models,
)
from ._settings import (
    DEFAULT_RETENTION_DAYS,
    Settings,
)
from ._telegram import (
    DEFAULT_DRAFT_RATE,
    DEFAULT_DRAFT_TIMEOUT,
    DEFAULT_MAX_FILE_MB,
    DEFAULT_SEND_CHAT_BURST,
    DEFAULT_SEND_CHAT_RATE,
    DEFAULT_SEND_GROUP_BURST,
    DEFAULT_SEND_GROUP_PER_MINUTE,
    DEFAULT_SEND_RATE,
    DEFAULT_TELEGRAM_API_URL,
    DEFAULT_WEBHOOK_LISTEN,
    PacingConfig,
    TelegramConfig,
    WebhookConfig,
    read_pacing,
    read_telegram,
    read_webhook,
    token_problem,
)

__all__ = [
    "DEFAULT_API_LISTEN",
    "DEFAULT_BATCH",
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_COMPACT_ACK_SECONDS",
    "DEFAULT_COMPACT_CEILING",
    "DEFAULT_COMPACT_PERCENT",
    "DEFAULT_DRAFT_RATE",
    "DEFAULT_DRAFT_TIMEOUT",
    "DEFAULT_EVE_GRACE",
    "DEFAULT_HEALTH_REPLY_SECONDS",
    "DEFAULT_INVITE_HOURS",
    "DEFAULT_MANUAL_COMPACT_MIN",
    "DEFAULT_MAX_FILE_MB",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_RETENTION_DAYS",
    "DEFAULT_SEND_ATTEMPTS",
    "DEFAULT_SEND_CHAT_BURST",
    "DEFAULT_SEND_CHAT_RATE",
    "DEFAULT_SEND_GROUP_BURST",
    "DEFAULT_SEND_GROUP_PER_MINUTE",
    "DEFAULT_SEND_MAX_AGE",
    "DEFAULT_SEND_RATE",
    "DEFAULT_SPEAK_TIMEOUT",
    "DEFAULT_TELEGRAM_API_URL",
    "DEFAULT_TRANSCRIBE_TIMEOUT",
    "DEFAULT_WEBHOOK_LISTEN",
    "MODELS_EXAMPLE",
    "ApiConfig",
    "ChatConfig",
    "CompactionConfig",
    "ConfigError",
    "Env",
    "EveConfig",
    "Model",
    "Models",
    "NotesConfig",
    "PacingConfig",
    "PeopleConfig",
    "Settings",
    "TelegramConfig",
    "VoiceConfig",
    "WebhookConfig",
    "is_loopback",
    "listener_problem",
    "models_of",
    "read_api",
    "read_chat",
    "read_compaction",
    "read_eve",
    "read_models",
    "read_notes",
    "read_pacing",
    "read_people",
    "read_telegram",
    "read_voice",
    "read_webhook",
    "state_dir_of",
    "token_problem",
]
