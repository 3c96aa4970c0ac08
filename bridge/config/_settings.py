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
