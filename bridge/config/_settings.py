"""Settings: one value object per concern, read together from the environment."""

from __future__ import annotations

import os
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ._chat import (
    ChatConfig,
    CompactionConfig,
    EveConfig,
    PeopleConfig,
    read_chat,
    read_compaction,
    read_eve,
    read_people,
)
from ._env import ConfigError, Env, state_dir_of
from ._local import ApiConfig, NotesConfig, VoiceConfig, read_api, read_notes, read_voice
from ._models import Models, models_of
from ._telegram import (
    PacingConfig,
    TelegramConfig,
    WebhookConfig,
    read_pacing,
    read_telegram,
    read_webhook,
)

__all__ = ["DEFAULT_RETENTION_DAYS", "Settings"]

DEFAULT_RETENTION_DAYS = 14


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything Iva is configured by (SPEC §2, docs/configuration.md), one object per concern,
    built once by :meth:`from_env` and passed down."""

    telegram: TelegramConfig
    eve: EveConfig
    people: PeopleConfig = field(default_factory=PeopleConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    pacing: PacingConfig = field(default_factory=PacingConfig)
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    notes: NotesConfig = field(default_factory=NotesConfig)
    voice: VoiceConfig = field(default_factory=VoiceConfig)
    models: Models = field(default_factory=Models)  # IVA_MODELS and IVA_NOTES_MODEL (D1, D4)
    state_dir: Path = Path("./var")
    lang: Literal["ru", "en"] = "ru"  # when the user's Telegram language is neither
    log_level: str = "info"
    tz: str = "UTC"  # the IANA zone a reminder's cron reads in when it names none (W7)
    retention_days: int | None = DEFAULT_RETENTION_DAYS  # F7; None: nothing is pruned

    @property
    def db_path(self) -> Path:
        return self.state_dir / "iva.sqlite3"

    @property
    def secrets(self) -> list[str]:
        """What no log line and no `iva check` line may show (S5)."""
        return [x for x in (self.telegram.token, self.eve.token, self.api.token, self.api.mcp_token,
                            self.webhook.secret) if x]

    # --- The flat names of before the concerns, while the uses move (removed in the next commit). ---
    @property
    def telegram_token(self) -> str:
        return self.telegram.token

    @property
    def eve_url(self) -> str:
        return self.eve.url

    @property
    def eve_token(self) -> str | None:
        return self.eve.token

    @property
    def telegram_api_url(self) -> str:
        return self.telegram.api_url

    @property
    def owner_ids(self) -> frozenset[int]:
        return self.people.owner_ids

    @property
    def allowed_user_ids(self) -> frozenset[int]:
        return self.people.allowed_user_ids

    @property
    def turn_policy(self) -> Literal["queue", "immediate"]:
        return self.chat.turn_policy

    @property
    def streaming(self) -> Literal["draft", "off"]:
        return self.chat.streaming

    @property
    def context_window(self) -> int | None:
        return self.compaction.context_window

    @property
    def compact_percent(self) -> int:
        return self.compaction.percent

    @property
    def compact_ceiling(self) -> int:
        return self.compaction.ceiling

    @property
    def inturn_percent(self) -> float | None:
        return self.compaction.inturn_percent

    @property
    def manual_compact_min(self) -> int:
        return self.compaction.manual_min

    @property
    def compact_ack_seconds(self) -> float:
        return self.compaction.ack_seconds

    @property
    def busy_timeout(self) -> float:
        return self.chat.busy_timeout

    @property
    def eve_grace(self) -> float:
        return self.eve.grace

    @property
    def health_reply_seconds(self) -> float:
        return self.api.health_reply_seconds

    @property
    def send_attempts(self) -> int:
        return self.eve.send_attempts

    @property
    def send_max_age(self) -> float:
        return self.eve.send_max_age

    @property
    def api_listen(self) -> str:
        return self.api.listen

    @property
    def api_token(self) -> str | None:
        return self.api.token

    @property
    def mcp_token(self) -> str | None:
        return self.api.mcp_token

    @property
    def webhook_url(self) -> str | None:
        return self.webhook.url

    @property
    def webhook_secret(self) -> str | None:
        return self.webhook.secret

    @property
    def webhook_listen(self) -> str:
        return self.webhook.listen

    @property
    def max_turns(self) -> int:
        return self.chat.max_turns

    @property
    def batch_size(self) -> int:
        return self.chat.batch_size

    @property
    def max_file_mb(self) -> int:
        return self.telegram.max_file_mb

    @property
    def transcribe_cmd(self) -> tuple[str, ...]:
        return self.voice.transcribe_cmd

    @property
    def transcribe_timeout(self) -> float:
        return self.voice.transcribe_timeout

    @property
    def speak_cmd(self) -> tuple[str, ...]:
        return self.voice.speak_cmd

    @property
    def speak_timeout(self) -> float:
        return self.voice.speak_timeout

    @property
    def invite_hours(self) -> int:
        return self.people.invite_hours

    @property
    def send_rate(self) -> float:
        return self.pacing.rate

    @property
    def send_chat_burst(self) -> int:
        return self.pacing.chat_burst

    @property
    def send_chat_rate(self) -> float:
        return self.pacing.chat_rate

    @property
    def send_group_per_minute(self) -> float:
        return self.pacing.group_per_minute

    @property
    def send_group_burst(self) -> int:
        return self.pacing.group_burst

    @property
    def draft_rate(self) -> float:
        return self.pacing.draft_rate

    @property
    def draft_timeout(self) -> float:
        return self.pacing.draft_timeout

    @property
    def notes_enabled(self) -> bool:
        return self.notes.enabled

    @property
    def notes_connection(self) -> str:
        return self.notes.connection

    @property
    def notes_texts(self) -> tuple[str | None, str | None, str | None]:
        return self.notes.texts

    def may_talk(self, user_id: int) -> bool:
        return self.people.may_talk(user_id)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``IVA_*``; raise :class:`ConfigError` listing every bad or missing value."""
        read = Env(os.environ if env is None else env)
        telegram, notes = read_telegram(read), read_notes(read)
        api = read_api(read, notes_enabled=notes.enabled)
        settings = cls(
            telegram=telegram, eve=read_eve(read), people=read_people(read), chat=read_chat(read),
            compaction=read_compaction(read), pacing=read_pacing(read),
            webhook=read_webhook(read, api_url=telegram.api_url, api_listen=api.listen), api=api, notes=notes,
            voice=read_voice(read), models=models_of(read),
            state_dir=state_dir_of(read.get("IVA_STATE_DIR") or read.get("STATE_DIRECTORY")),
            lang=read.choice("IVA_LANG", ("ru", "en"), "ru"),
            log_level=read.choice("IVA_LOG_LEVEL", ("debug", "info", "warning", "error"), "info", quoted=False),
            tz=_tz(read), retention_days=_retention(read),
        )
        if read.problems:
            raise ConfigError(read.problems)
        return settings


def _tz(env: Env) -> str:
    tz = env.get("IVA_TZ") or "UTC"
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "Europe" is a directory
        env.problem(f"IVA_TZ={tz!r} is not an IANA time zone, e.g. Europe/Berlin or UTC")
        return "UTC"
    return tz


def _retention(env: Env) -> int | None:
    """F7: whole days, at least 1 (Telegram keeps an unconfirmed update for 24 h, so an update's
    dedupe mark must outlive that); 0 or "off" keeps everything."""
    name = "IVA_RETENTION_DAYS"
    raw = env.get(name)
    if raw is None:
        return DEFAULT_RETENTION_DAYS
    if raw.lower() in ("0", "off"):
        return None
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        env.problem(f"{name}={raw!r} is not a whole number of days (or 0/off: keep everything)")
        return DEFAULT_RETENTION_DAYS
    if value < 1:
        env.problem(f"{name}={value} must be at least 1 (a day: Telegram redelivers an update for up "
                    "to 24 h and its dedupe mark must outlive that), or 0/off to keep everything")
        return DEFAULT_RETENTION_DAYS
    return value
