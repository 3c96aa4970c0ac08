"""Settings from the environment (SPEC §2), validated once, with one clear message per bad value."""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .errors import BridgeError

__all__ = ["ConfigError", "Model", "Models", "Settings", "is_loopback", "listener_problem", "read_models",
           "state_dir_of"]

DEFAULT_TELEGRAM_API_URL = "https://api.telegram.org"
DEFAULT_COMPACT_PERCENT = 60
DEFAULT_COMPACT_CEILING = 110_000
DEFAULT_MANUAL_COMPACT_MIN = 30_000
DEFAULT_COMPACT_ACK_SECONDS = 5.0
DEFAULT_BUSY_TIMEOUT = 900.0


DEFAULT_EVE_GRACE = 3.0  # seconds eve may take to start a turn with a message we are unsure it has (F4)
DEFAULT_SEND_MAX_AGE = 3600.0  # seconds: a message eve failed on and still fails on this long after it came is given up (F6)
DEFAULT_SEND_ATTEMPTS = 5  # a message eve answers 5xx (and never started) goes this often, then the person is told (F6)
DEFAULT_HEALTH_REPLY_SECONDS = 120.0
DEFAULT_MAX_TURNS = 16
DEFAULT_BATCH = 10
DEFAULT_API_LISTEN = "127.0.0.1:8787"
DEFAULT_WEBHOOK_LISTEN = "127.0.0.1:8443"  # webhook mode (O1): TLS is the reverse proxy's job
DEFAULT_MAX_FILE_MB = 20  # the Bot API's getFile limit
DEFAULT_RETENTION_DAYS = 14
DEFAULT_TRANSCRIBE_TIMEOUT = 60.0
DEFAULT_SPEAK_TIMEOUT = 60.0
DEFAULT_INVITE_HOURS = 24  # how long an /invite link stays good (P2)
# The pacer (docs/pacing.md): Telegram's documented flood limits, with a little room for the network.
DEFAULT_SEND_RATE = 28.0  # messages a second overall (Telegram: about 30)
DEFAULT_SEND_CHAT_BURST = 3  # messages at once to one private chat, then...
DEFAULT_SEND_CHAT_RATE = 1.0  # ... this many a second (Telegram: about 1, short bursts allowed)
DEFAULT_SEND_GROUP_PER_MINUTE = 20.0  # messages a minute to one group or forum (Telegram: 20)
DEFAULT_SEND_GROUP_BURST = 3  # of them, this many at once (the rest paced so no minute holds more)
DEFAULT_DRAFT_RATE = 1.0  # live draft frames a second per chat, at most
DEFAULT_DRAFT_TIMEOUT = 5.0  # seconds one draft frame may take before it is given up

_TOKEN_SECRET = re.compile(r"[A-Za-z0-9_-]+")
_TOKEN_SECRET_MIN = 20  # BotFather's secrets are 35 characters; the fakes' are shorter


def state_dir_of(value: str | None) -> Path:
    """The state directory from IVA_STATE_DIR or systemd's STATE_DIRECTORY (its first, when it
    names several), else ./var."""
    return Path(value.split(":")[0]) if value else Path("./var")


def token_problem(token: str) -> str | None:
    """What is wrong with a bot token's shape (``<bot id>:<secret>``, as @BotFather gives it:
    ``123456789:AAE…`` — digits, a colon, 35 letters, digits, ``-`` and ``_``), else None. The
    message never repeats the token."""
    name = "IVA_TELEGRAM_TOKEN"
    if ":" not in token:
        return (f"{name} does not look like a bot token: it has no ':' — a bot token is <bot id>:<secret>, "
                "e.g. 123456789:AAEhBOweik6ad9r_QXMENQjcrGbqCr4K-bs (copy it whole from @BotFather)")
    bot_id, _, secret = token.partition(":")
    problems = []
    if not (bot_id.isascii() and bot_id.isdigit() and len(bot_id) >= 3):
        problems.append("the part before ':' must be the bot's numeric id (3 or more digits)")
    if not _TOKEN_SECRET.fullmatch(secret):
        bad = sorted({c for c in secret if not (c.isascii() and (c.isalnum() or c in "-_"))})
        what = "it is empty" if not secret else \
            "it contains " + ", ".join("a space" if c == " " else repr(c) for c in bad)
        problems.append(f"the part after ':' must be letters, digits, '-' and '_' only ({what})")
    elif len(secret) < _TOKEN_SECRET_MIN:
        problems.append(f"the part after ':' must be at least {_TOKEN_SECRET_MIN} characters "
                        f"(it has {len(secret)}; @BotFather's have 35)")
    if not problems:
        return None
    return f"{name} does not look like a bot token: " + "; ".join(problems)


_WEBHOOK_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")  # what setWebhook's secret_token allows
_LISTEN = re.compile(r"(\[[0-9a-fA-F:]+\]|[\w.-]+):\d{1,5}")


def is_loopback(listen: str) -> bool:
    """``host:port`` names a loopback address: ``localhost``, 127.0.0.0/8 or ::1."""
    host = listen.rpartition(":")[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another name: it may resolve anywhere


def listener_problem(listen: str, notes_enabled: bool, mcp_token: str | None) -> str | None:
    """S1: the notebook's /mcp is not served off loopback without its token."""
    if notes_enabled and not mcp_token and not is_loopback(listen):
        return (f"IVA_API_LISTEN={listen} is not loopback, so /mcp needs a token: set IVA_MCP_TOKEN (and the same "
                "value as NOTEBOOK_MCP_TOKEN where eve builds its notebook connection), or IVA_NOTES_ENABLED=0")
    return None


class ConfigError(BridgeError):
    """Every problem found in the environment, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


_MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_MODEL_ID = re.compile(r"[^\s,=]+")
MODELS_EXAMPLE = "fast=openai/gpt-5-mini:400000,strong=anthropic/claude-sonnet-4.5:200000"


@dataclass(frozen=True, slots=True)
class Model:
    """One model the operator allows (D1): its short name in /model, eve's id for it, its window."""

    name: str
    id: str
    window: int


@dataclass(frozen=True, slots=True)
class Models:
    """IVA_MODELS, the operator's allow-list (D1): the first is every chat's default; and
    IVA_NOTES_MODEL, the one the notebook's rebuild runs on (D4; None: the chat's own)."""

    entries: tuple[Model, ...] = ()
    notes: Model | None = None

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def default(self) -> Model | None:
        return self.entries[0] if self.entries else None

    def get(self, name: str | None) -> Model | None:
        return next((m for m in self.entries if m.name == name), None) if name else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.entries)


def read_models(raw: str | None, notes: str | None = None) -> Models:
    """IVA_MODELS (``name=eve model id:window``, comma-separated; a model id may hold ``:``
    itself, the window is after the last) and IVA_NOTES_MODEL (one of its names). Raises
    :class:`ConfigError` naming every bad entry."""
    problems: list[str] = []
    entries: list[Model] = []
    for part in (raw or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, rest = part.partition("=")
        model_id, colon, window = rest.rpartition(":")
        name, model_id = name.strip(), model_id.strip()
        if not eq or not colon:
            problems.append(f"IVA_MODELS: {part!r} is not name=model:window (e.g. {MODELS_EXAMPLE})")
            continue
        if not _MODEL_NAME.fullmatch(name):
            problems.append(f"IVA_MODELS: the name {name!r} must be 1-32 of a-z 0-9 _ - (starting with a letter "
                            "or digit): it is what people type after /model")
            continue
        if not _MODEL_ID.fullmatch(model_id):
            problems.append(f"IVA_MODELS: {name}'s model {model_id!r} must be eve's model id (no spaces, commas or '='), "
                            "e.g. anthropic/claude-sonnet-4.5")
            continue
        try:
            tokens = int(window.strip().replace("_", ""))
        except ValueError:
            problems.append(f"IVA_MODELS: {name}'s window {window.strip()!r} is not a whole number of tokens")
            continue
        if tokens < 1000:
            problems.append(f"IVA_MODELS: {name}'s window {tokens} must be at least 1000 tokens")
            continue
        if any(m.name == name for m in entries):
            problems.append(f"IVA_MODELS: the name {name!r} is given twice")
            continue
        entries.append(Model(name, model_id, tokens))
    models = Models(tuple(entries))
    chosen = None
    if notes is not None:
        chosen = models.get(notes.strip().lower())
        if chosen is None:
            problems.append(f"IVA_NOTES_MODEL={notes!r} must be one of IVA_MODELS' names "
                            f"({', '.join(models.names) or 'IVA_MODELS is empty'})")
    if problems:
        raise ConfigError(problems)
    return Models(models.entries, chosen)


def _models(raw: str | None, notes: str | None, problems: list[str]) -> Models:
    """:func:`read_models` for :meth:`Settings.from_env`: its problems joined to the others'."""
    try:
        return read_models(raw, notes)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return Models()


@dataclass(frozen=True, slots=True)
class Settings:
    telegram_token: str = field(repr=False)
    eve_url: str
    eve_token: str | None = field(default=None, repr=False)
    telegram_api_url: str = DEFAULT_TELEGRAM_API_URL
    state_dir: Path = Path("./var")
    owner_ids: frozenset[int] = frozenset()
    allowed_user_ids: frozenset[int] = frozenset()
    turn_policy: Literal["queue", "immediate"] = "queue"
    streaming: Literal["draft", "off"] = "draft"
    context_window: int | None = None
    compact_percent: int = DEFAULT_COMPACT_PERCENT
    compact_ceiling: int = DEFAULT_COMPACT_CEILING
    # N6′: eve's in-turn safety net as a percent of the window, when the agent sets it otherwise
    # than min(75% × window, 137 500) (C9); the [window] wall while parking is off.
    inturn_percent: float | None = None
    manual_compact_min: int = DEFAULT_MANUAL_COMPACT_MIN
    compact_ack_seconds: float = DEFAULT_COMPACT_ACK_SECONDS
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    eve_grace: float = DEFAULT_EVE_GRACE
    health_reply_seconds: float = DEFAULT_HEALTH_REPLY_SECONDS
    send_attempts: int = DEFAULT_SEND_ATTEMPTS
    send_max_age: float = DEFAULT_SEND_MAX_AGE
    lang: Literal["ru", "en"] = "ru"
    api_listen: str = DEFAULT_API_LISTEN
    api_token: str | None = field(default=None, repr=False)
    mcp_token: str | None = field(default=None, repr=False)
    # Webhook mode (O1): Telegram calls this URL (through the operator's TLS proxy) and Iva
    # serves it on webhook_listen; None: Iva polls getUpdates.
    webhook_url: str | None = None
    webhook_secret: str | None = field(default=None, repr=False)
    webhook_listen: str = DEFAULT_WEBHOOK_LISTEN
    max_turns: int = DEFAULT_MAX_TURNS
    batch_size: int = DEFAULT_BATCH
    max_file_mb: int = DEFAULT_MAX_FILE_MB
    retention_days: int | None = DEFAULT_RETENTION_DAYS  # F7; None: nothing is pruned
    # Voice, audio and video notes (I4): refused, sent as files, or transcribed by a command
    # (its argv, the audio file's path appended) within the timeout.
    voice: Literal["refuse", "file", "command"] = "refuse"
    transcribe_cmd: tuple[str, ...] = ()
    transcribe_timeout: float = DEFAULT_TRANSCRIBE_TIMEOUT
    # Voice for voice (P1-P4, S7): the command that reads an answer's text on stdin and writes
    # OGG/Opus on stdout, within the timeout; () = off.
    speak_cmd: tuple[str, ...] = ()
    speak_timeout: float = DEFAULT_SPEAK_TIMEOUT
    invite_hours: int = DEFAULT_INVITE_HOURS
    # The pacer in front of every Bot API call that posts or edits a message (bridge/telegram/pacing.py).
    send_rate: float = DEFAULT_SEND_RATE
    send_chat_burst: int = DEFAULT_SEND_CHAT_BURST
    send_chat_rate: float = DEFAULT_SEND_CHAT_RATE
    send_group_per_minute: float = DEFAULT_SEND_GROUP_PER_MINUTE
    send_group_burst: int = DEFAULT_SEND_GROUP_BURST
    draft_rate: float = DEFAULT_DRAFT_RATE
    draft_timeout: float = DEFAULT_DRAFT_TIMEOUT
    log_level: str = "info"
    notes_enabled: bool = True
    notes_connection: str = "notebook"
    notes_texts: tuple[str | None, str | None, str | None] = (None, None, None)  # window, wrap, nudge
    # The IANA zone a reminder's cron reads in when it names none (W7).
    tz: str = "UTC"
    models: Models = Models()  # IVA_MODELS and IVA_NOTES_MODEL (D1, D4)

    @property
    def db_path(self) -> Path:
        return self.state_dir / "iva.sqlite3"

    @property
    def secrets(self) -> list[str]:
        """What no log line and no `iva check` line may show (S5)."""
        return [x for x in (self.telegram_token, self.eve_token, self.api_token, self.mcp_token,
                            self.webhook_secret) if x]

    def may_talk(self, user_id: int) -> bool:
        return user_id in self.owner_ids or user_id in self.allowed_user_ids

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``IVA_*``; raise :class:`ConfigError` listing every bad or missing value."""
        env = os.environ if env is None else env
        problems: list[str] = []

        def get(name: str) -> str | None:
            value = env.get(name)
            return value.strip() if value is not None and value.strip() else None

        def integer(name: str, default: int | None, *, low: int, high: int | None = None) -> int | None:
            raw = get(name)
            if raw is None:
                return default
            try:
                value = int(raw.replace("_", ""))
            except ValueError:
                problems.append(f"{name}={raw!r} is not a whole number")
                return default
            if value < low or (high is not None and value > high):
                span = f"from {low} to {high}" if high is not None else f"at least {low}"
                problems.append(f"{name}={value} must be {span}")
                return default
            return value

        def number(name: str, default: float, *, low: float, what: str = "a number of seconds") -> float:
            """A finite number, at least ``low`` (NaN and infinity are refused too)."""
            raw = get(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                problems.append(f"{name}={raw!r} is not {what}")
                return default
            if not low <= value < float("inf"):
                problems.append(f"{name}={value} must be at least {low}")
                return default
            return value

        def rate(name: str, default: float, *, low: float) -> float:
            """A pace: how many a second (or a minute), at least ``low``."""
            return number(name, default, low=low, what="a number")

        def retention(name: str) -> int | None:
            """F7: whole days, at least 1 (Telegram keeps an unconfirmed update for 24 h, so an
            update's dedupe mark must outlive that); 0 or "off" keeps everything."""
            raw = get(name)
            if raw is None:
                return DEFAULT_RETENTION_DAYS
            if raw.lower() in ("0", "off"):
                return None
            try:
                value = int(raw.replace("_", ""))
            except ValueError:
                problems.append(f"{name}={raw!r} is not a whole number of days (or 0/off: keep everything)")
                return DEFAULT_RETENTION_DAYS
            if value < 1:
                problems.append(f"{name}={value} must be at least 1 (a day: Telegram redelivers an update for up "
                                "to 24 h and its dedupe mark must outlive that), or 0/off to keep everything")
                return DEFAULT_RETENTION_DAYS
            return value

        def ids(name: str) -> frozenset[int]:
            raw = get(name)
            if raw is None:
                return frozenset()
            out: set[int] = set()
            for part in re.split(r"[,\s]+", raw):
                if not part:
                    continue
                if not re.fullmatch(r"-?\d+", part):
                    problems.append(f"{name}: {part!r} is not a Telegram user id (a number)")
                    continue
                out.add(int(part))
            return frozenset(out)

        def url(name: str, default: str | None) -> str | None:
            raw = get(name) or default
            if raw is None:
                problems.append(f"{name} is required (for example http://127.0.0.1:3000)")
                return None
            if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", raw):
                problems.append(f"{name}={raw!r} is not an http(s) URL")
                return None
            return raw.rstrip("/")

        def command(name: str) -> tuple[str, ...]:
            """A command line, split as a shell would (but run without one); its program must exist."""
            raw = get(name)
            if raw is None:
                return ()
            try:
                argv = tuple(shlex.split(raw))
            except ValueError as exc:
                problems.append(f"{name}={raw!r} is not a command line ({exc})")
                return ()
            if not argv:
                problems.append(f"{name}={raw!r} names no program")
                return ()
            program = argv[0]
            found = (os.path.isfile(program) and os.access(program, os.X_OK)) if "/" in program \
                else shutil.which(program, path=env.get("PATH", os.defpath)) is not None
            if not found:
                problems.append(f"{name}: {program!r} is not an executable program"
                                + ("" if "/" in program else " on PATH"))
                return ()
            return argv

        token = get("IVA_TELEGRAM_TOKEN")
        if token is None:
            problems.append("IVA_TELEGRAM_TOKEN is required (the bot token from @BotFather)")
        elif (problem := token_problem(token)) is not None:
            problems.append(problem)
        eve_url = url("IVA_EVE_URL", None)
        api_url = url("IVA_TELEGRAM_API_URL", DEFAULT_TELEGRAM_API_URL)
        # Optional since P1: without it the first person to open the pairing link
        # printed at start becomes the owner, kept in the state database.
        owners = ids("IVA_OWNER_IDS")
        allowed = ids("IVA_ALLOWED_USER_IDS")

        streaming = (get("IVA_STREAMING") or "draft").lower()
        if streaming not in ("draft", "off"):
            problems.append(f"IVA_STREAMING={streaming!r} must be 'draft' or 'off'")
            streaming = "draft"
        policy = (get("IVA_TURN_POLICY") or "queue").lower()
        if policy not in ("queue", "immediate"):
            problems.append(f"IVA_TURN_POLICY={policy!r} must be 'queue' or 'immediate'")
            policy = "queue"
        lang = (get("IVA_LANG") or "ru").lower()
        if lang not in ("ru", "en"):
            problems.append(f"IVA_LANG={lang!r} must be 'ru' or 'en'")
            lang = "ru"
        voice = (get("IVA_VOICE") or "refuse").lower()
        if voice not in ("refuse", "file", "command"):
            problems.append(f"IVA_VOICE={voice!r} must be 'refuse', 'file' or 'command'")
            voice = "refuse"
        transcribe_cmd = command("IVA_TRANSCRIBE_CMD") if voice == "command" else ()  # else unused
        if voice == "command" and get("IVA_TRANSCRIBE_CMD") is None:
            problems.append("IVA_VOICE=command needs IVA_TRANSCRIBE_CMD: the command that prints a transcript "
                            "(the audio file's path is appended as its last argument)")
        speak_cmd = command("IVA_SPEAK_CMD")
        state_dir = state_dir_of(get("IVA_STATE_DIR") or get("STATE_DIRECTORY"))

        listen = get("IVA_API_LISTEN") or DEFAULT_API_LISTEN
        if not _LISTEN.fullmatch(listen):
            problems.append(f"IVA_API_LISTEN={listen!r} must be host:port, e.g. 127.0.0.1:8787")

        # Webhook mode (O1). Telegram's own Bot API refuses anything but https at setWebhook,
        # which would leave the bridge retrying a refusal: refused here, at the start. A local
        # Bot API server (IVA_TELEGRAM_API_URL elsewhere; `--local` takes plain http) or a test
        # fake may call plain http; `iva check` still says so.
        webhook_url = get("IVA_TELEGRAM_WEBHOOK_URL")
        webhook_secret = get("IVA_TELEGRAM_WEBHOOK_SECRET")
        webhook_listen = get("IVA_WEBHOOK_LISTEN") or DEFAULT_WEBHOOK_LISTEN
        if webhook_url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", webhook_url):
            problems.append(f"IVA_TELEGRAM_WEBHOOK_URL={webhook_url!r} is not an https URL (no query or fragment), "
                            "e.g. https://bot.example.org/telegram")
        elif (webhook_url is not None and webhook_url.startswith("http://")
              and (api_url or DEFAULT_TELEGRAM_API_URL).rstrip("/") == DEFAULT_TELEGRAM_API_URL):
            problems.append(f"IVA_TELEGRAM_WEBHOOK_URL={webhook_url!r} is not https: Telegram's Bot API refuses "
                            "plain http webhooks (only a local Bot API server, IVA_TELEGRAM_API_URL, takes them)")
        if webhook_url is not None and webhook_secret is None:
            problems.append("IVA_TELEGRAM_WEBHOOK_URL needs IVA_TELEGRAM_WEBHOOK_SECRET: 1-256 characters of "
                            "A-Z a-z 0-9 _ - that Telegram sends with every update (and nobody else knows)")
        if webhook_secret is not None and not _WEBHOOK_SECRET.fullmatch(webhook_secret):
            problems.append("IVA_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z a-z 0-9 _ - "
                            f"(it has {len(webhook_secret)}, or a character Telegram does not allow)")
        if webhook_secret is not None and webhook_url is None:
            problems.append("IVA_TELEGRAM_WEBHOOK_SECRET is set but IVA_TELEGRAM_WEBHOOK_URL is not: set the URL "
                            "for webhook mode, or remove the secret to poll")
        if not _LISTEN.fullmatch(webhook_listen):
            problems.append(f"IVA_WEBHOOK_LISTEN={webhook_listen!r} must be host:port, e.g. {DEFAULT_WEBHOOK_LISTEN}")
        elif webhook_url is not None and webhook_listen == listen:
            problems.append(f"IVA_WEBHOOK_LISTEN and IVA_API_LISTEN are both {listen}: give them different ports")

        level = (get("IVA_LOG_LEVEL") or "info").lower()
        if level not in ("debug", "info", "warning", "error"):
            problems.append(f"IVA_LOG_LEVEL={level!r} must be debug, info, warning or error")
            level = "info"

        enabled_raw = (get("IVA_NOTES_ENABLED") or "1").lower()
        if enabled_raw not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            problems.append(f"IVA_NOTES_ENABLED={enabled_raw!r} must be 1 or 0 (true/false)")
        notes_enabled = enabled_raw in ("1", "true", "yes", "on")
        connection = get("IVA_NOTES_CONNECTION") or "notebook"
        if not re.fullmatch(r"[A-Za-z0-9_-]+", connection):
            problems.append(f"IVA_NOTES_CONNECTION={connection!r} must be the eve connection's name (letters, digits, _ -)")
        api_token, mcp_token = get("IVA_API_TOKEN"), get("IVA_MCP_TOKEN")
        if (problem := listener_problem(listen, notes_enabled, mcp_token)) is not None:
            problems.append(problem)
        if mcp_token is not None and mcp_token == api_token:
            problems.append("IVA_MCP_TOKEN must differ from IVA_API_TOKEN: eve holds the MCP token, and it must not "
                            "open the owner API")
        texts = (get("IVA_NOTES_TEXT_WINDOW"), get("IVA_NOTES_TEXT_WRAP"), get("IVA_NOTES_TEXT_NUDGE"))
        for name, text in zip(("IVA_NOTES_TEXT_WINDOW", "IVA_NOTES_TEXT_WRAP", "IVA_NOTES_TEXT_NUDGE"), texts, strict=False):
            if text is not None:
                try:
                    text.format(used=1, wall=2, left=1, wall_name="compaction")
                except (KeyError, IndexError, ValueError) as exc:
                    problems.append(f"{name}: only {{used}}, {{wall}}, {{left}} and {{wall_name}} may be used ({exc})")

        tz = get("IVA_TZ") or "UTC"
        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "Europe" is a directory
            problems.append(f"IVA_TZ={tz!r} is not an IANA time zone, e.g. Europe/Berlin or UTC")
            tz = "UTC"

        models = _models(get("IVA_MODELS"), get("IVA_NOTES_MODEL"), problems)  # D1, D4
        settings = dict(
            context_window=integer("IVA_CONTEXT_WINDOW", None, low=1000),
            compact_percent=integer("IVA_COMPACT_PERCENT", DEFAULT_COMPACT_PERCENT, low=1, high=100),
            compact_ceiling=integer("IVA_COMPACT_CEILING", DEFAULT_COMPACT_CEILING, low=1000),
            inturn_percent=min(100.0, number("IVA_INTURN_PERCENT", 0.0, low=1, what="a percent")) or None,
            manual_compact_min=integer("IVA_MANUAL_COMPACT_MIN", DEFAULT_MANUAL_COMPACT_MIN, low=0),
            compact_ack_seconds=number("IVA_COMPACT_ACK_SECONDS", DEFAULT_COMPACT_ACK_SECONDS, low=0.1),
            busy_timeout=number("IVA_BUSY_TIMEOUT", DEFAULT_BUSY_TIMEOUT, low=1.0),
            eve_grace=number("IVA_EVE_GRACE", DEFAULT_EVE_GRACE, low=0.5),
            health_reply_seconds=number("IVA_HEALTH_REPLY_SECONDS", DEFAULT_HEALTH_REPLY_SECONDS, low=1.0),
            send_attempts=integer("IVA_EVE_SEND_ATTEMPTS", DEFAULT_SEND_ATTEMPTS, low=1, high=100),
            send_max_age=number("IVA_EVE_SEND_MAX_AGE", DEFAULT_SEND_MAX_AGE, low=1.0),
            max_turns=integer("IVA_MAX_TURNS", DEFAULT_MAX_TURNS, low=1, high=10_000),
            batch_size=integer("IVA_BATCH", DEFAULT_BATCH, low=1, high=100),
            max_file_mb=integer("IVA_MAX_FILE_MB", DEFAULT_MAX_FILE_MB, low=1, high=2000),
            retention_days=retention("IVA_RETENTION_DAYS"),
            transcribe_timeout=number("IVA_TRANSCRIBE_TIMEOUT", DEFAULT_TRANSCRIBE_TIMEOUT, low=1.0),
            invite_hours=integer("IVA_INVITE_HOURS", DEFAULT_INVITE_HOURS, low=1, high=24 * 30),
            speak_timeout=number("IVA_SPEAK_TIMEOUT", DEFAULT_SPEAK_TIMEOUT, low=1.0),
            send_rate=rate("IVA_SEND_RATE", DEFAULT_SEND_RATE, low=0.1),
            send_chat_burst=integer("IVA_SEND_CHAT_BURST", DEFAULT_SEND_CHAT_BURST, low=1, high=1000),
            send_chat_rate=rate("IVA_SEND_CHAT_RATE", DEFAULT_SEND_CHAT_RATE, low=0.01),
            send_group_per_minute=rate("IVA_SEND_GROUP_PER_MINUTE", DEFAULT_SEND_GROUP_PER_MINUTE, low=2.0),
            send_group_burst=integer("IVA_SEND_GROUP_BURST", DEFAULT_SEND_GROUP_BURST, low=1, high=1000),
            draft_rate=rate("IVA_DRAFT_RATE", DEFAULT_DRAFT_RATE, low=0.05),
            draft_timeout=number("IVA_DRAFT_TIMEOUT", DEFAULT_DRAFT_TIMEOUT, low=0.5),
        )
        if problems:
            raise ConfigError(problems)
        assert token is not None and eve_url is not None and api_url is not None
        return cls(
            telegram_token=token,
            eve_url=eve_url,
            eve_token=get("IVA_EVE_TOKEN"),
            telegram_api_url=api_url,
            state_dir=state_dir,
            owner_ids=owners,
            allowed_user_ids=allowed,
            turn_policy=policy,  # type: ignore[arg-type]
            streaming=streaming,  # type: ignore[arg-type]
            lang=lang,  # type: ignore[arg-type]
            api_listen=listen,
            api_token=api_token,
            mcp_token=mcp_token,
            webhook_url=webhook_url,
            webhook_secret=webhook_secret,
            webhook_listen=webhook_listen,
            log_level=level,
            notes_enabled=notes_enabled,
            notes_connection=connection,
            notes_texts=texts,
            tz=tz,
            voice=voice,  # type: ignore[arg-type]
            transcribe_cmd=transcribe_cmd,
            speak_cmd=speak_cmd,
            models=models,
            **settings,  # type: ignore[arg-type]
        )
