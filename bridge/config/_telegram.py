"""Telegram's side: the bot and its Bot API server, the pacer in front of it, webhook mode."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._env import Env, is_listen

__all__ = [
    "DEFAULT_DRAFT_RATE", "DEFAULT_DRAFT_TIMEOUT", "DEFAULT_MAX_FILE_MB", "DEFAULT_SEND_CHAT_BURST",
    "DEFAULT_SEND_CHAT_RATE", "DEFAULT_SEND_GROUP_BURST", "DEFAULT_SEND_GROUP_PER_MINUTE", "DEFAULT_SEND_RATE",
    "DEFAULT_TELEGRAM_API_URL", "DEFAULT_WEBHOOK_LISTEN", "PacingConfig", "TelegramConfig", "WebhookConfig",
    "read_pacing", "read_telegram", "read_webhook", "token_problem",
]

DEFAULT_TELEGRAM_API_URL = "https://api.telegram.org"
DEFAULT_MAX_FILE_MB = 20  # the Bot API's getFile limit
DEFAULT_WEBHOOK_LISTEN = "127.0.0.1:8443"  # webhook mode (O1): TLS is the reverse proxy's job
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
_WEBHOOK_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")  # what setWebhook's secret_token allows


@dataclass(frozen=True, slots=True)
class TelegramConfig:
    """The bot (IVA_TELEGRAM_TOKEN), the Bot API server it calls (IVA_TELEGRAM_API_URL) and the
    largest file it fetches (IVA_MAX_FILE_MB)."""

    token: str = field(repr=False)
    api_url: str = DEFAULT_TELEGRAM_API_URL
    max_file_mb: int = DEFAULT_MAX_FILE_MB


@dataclass(frozen=True, slots=True)
class PacingConfig:
    """The pacer in front of every Bot API call that posts or edits a message
    (bridge/telegram/pacing.py, docs/pacing.md): IVA_SEND_*, IVA_DRAFT_*."""

    rate: float = DEFAULT_SEND_RATE
    chat_burst: int = DEFAULT_SEND_CHAT_BURST
    chat_rate: float = DEFAULT_SEND_CHAT_RATE
    group_per_minute: float = DEFAULT_SEND_GROUP_PER_MINUTE
    group_burst: int = DEFAULT_SEND_GROUP_BURST
    draft_rate: float = DEFAULT_DRAFT_RATE
    draft_timeout: float = DEFAULT_DRAFT_TIMEOUT


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Webhook mode (O1): Telegram calls ``url`` (through the operator's TLS proxy) with ``secret``
    and Iva serves it on ``listen``; no ``url``: Iva polls getUpdates."""

    url: str | None = None
    secret: str | None = field(default=None, repr=False)
    listen: str = DEFAULT_WEBHOOK_LISTEN


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


def read_telegram(env: Env) -> TelegramConfig:
    token = env.get("IVA_TELEGRAM_TOKEN")
    if token is None:
        env.problem("IVA_TELEGRAM_TOKEN is required (the bot token from @BotFather)")
    elif (problem := token_problem(token)) is not None:
        env.problem(problem)
    return TelegramConfig(
        token=token or "",
        api_url=env.url("IVA_TELEGRAM_API_URL", DEFAULT_TELEGRAM_API_URL) or DEFAULT_TELEGRAM_API_URL,
        max_file_mb=env.integer("IVA_MAX_FILE_MB", DEFAULT_MAX_FILE_MB, low=1, high=2000),
    )


def read_pacing(env: Env) -> PacingConfig:
    return PacingConfig(
        rate=env.rate("IVA_SEND_RATE", DEFAULT_SEND_RATE, low=0.1),
        chat_burst=env.integer("IVA_SEND_CHAT_BURST", DEFAULT_SEND_CHAT_BURST, low=1, high=1000),
        chat_rate=env.rate("IVA_SEND_CHAT_RATE", DEFAULT_SEND_CHAT_RATE, low=0.01),
        group_per_minute=env.rate("IVA_SEND_GROUP_PER_MINUTE", DEFAULT_SEND_GROUP_PER_MINUTE, low=2.0),
        group_burst=env.integer("IVA_SEND_GROUP_BURST", DEFAULT_SEND_GROUP_BURST, low=1, high=1000),
        draft_rate=env.rate("IVA_DRAFT_RATE", DEFAULT_DRAFT_RATE, low=0.05),
        draft_timeout=env.number("IVA_DRAFT_TIMEOUT", DEFAULT_DRAFT_TIMEOUT, low=0.5),
    )


def read_webhook(env: Env, *, api_url: str, api_listen: str) -> WebhookConfig:
    """Telegram's own Bot API refuses anything but https at setWebhook, which would leave the
    bridge retrying a refusal: refused here, at the start. A local Bot API server (``api_url``
    elsewhere; ``--local`` takes plain http) or a test fake may call plain http; `iva check`
    still says so. The webhook's port is not the local API's (``api_listen``)."""
    url, secret = env.get("IVA_TELEGRAM_WEBHOOK_URL"), env.get("IVA_TELEGRAM_WEBHOOK_SECRET")
    listen = env.get("IVA_WEBHOOK_LISTEN") or DEFAULT_WEBHOOK_LISTEN
    if url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
        env.problem(f"IVA_TELEGRAM_WEBHOOK_URL={url!r} is not an https URL (no query or fragment), "
                    "e.g. https://bot.example.org/telegram")
    elif url is not None and url.startswith("http://") and api_url.rstrip("/") == DEFAULT_TELEGRAM_API_URL:
        env.problem(f"IVA_TELEGRAM_WEBHOOK_URL={url!r} is not https: Telegram's Bot API refuses "
                    "plain http webhooks (only a local Bot API server, IVA_TELEGRAM_API_URL, takes them)")
    if url is not None and secret is None:
        env.problem("IVA_TELEGRAM_WEBHOOK_URL needs IVA_TELEGRAM_WEBHOOK_SECRET: 1-256 characters of "
                    "A-Z a-z 0-9 _ - that Telegram sends with every update (and nobody else knows)")
    if secret is not None and not _WEBHOOK_SECRET.fullmatch(secret):
        env.problem("IVA_TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z a-z 0-9 _ - "
                    f"(it has {len(secret)}, or a character Telegram does not allow)")
    if secret is not None and url is None:
        env.problem("IVA_TELEGRAM_WEBHOOK_SECRET is set but IVA_TELEGRAM_WEBHOOK_URL is not: set the URL "
                    "for webhook mode, or remove the secret to poll")
    if not is_listen(listen):
        env.problem(f"IVA_WEBHOOK_LISTEN={listen!r} must be host:port, e.g. {DEFAULT_WEBHOOK_LISTEN}")
    elif url is not None and listen == api_listen:
        env.problem(f"IVA_WEBHOOK_LISTEN and IVA_API_LISTEN are both {api_listen}: give them different ports")
    return WebhookConfig(url=url, secret=secret, listen=listen)
