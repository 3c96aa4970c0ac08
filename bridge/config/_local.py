"""What Iva serves and runs beside the chat: the local HTTP API, the notebook, voice."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

from ._env import Env

__all__ = [
    "DEFAULT_API_LISTEN", "DEFAULT_HEALTH_REPLY_SECONDS", "DEFAULT_SPEAK_TIMEOUT", "DEFAULT_TRANSCRIBE_TIMEOUT",
    "ApiConfig", "NotesConfig", "VoiceConfig", "is_loopback", "listener_problem", "read_api", "read_notes",
    "read_voice",
]

DEFAULT_API_LISTEN = "127.0.0.1:8787"
DEFAULT_HEALTH_REPLY_SECONDS = 120.0
DEFAULT_TRANSCRIBE_TIMEOUT = 60.0
DEFAULT_SPEAK_TIMEOUT = 60.0

VoiceMode = Literal["refuse", "file", "command"]
_NOTES_TEXTS = ("IVA_NOTES_TEXT_WINDOW", "IVA_NOTES_TEXT_WRAP", "IVA_NOTES_TEXT_NUDGE")


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """The local HTTP listener (IVA_API_LISTEN): the owner API behind ``token``, the notebook's
    /mcp behind ``mcp_token`` (S1), and /healthz, which turns 503 when a reply has waited
    ``health_reply_seconds`` to go out."""

    listen: str = DEFAULT_API_LISTEN
    token: str | None = field(default=None, repr=False)
    mcp_token: str | None = field(default=None, repr=False)
    health_reply_seconds: float = DEFAULT_HEALTH_REPLY_SECONDS


@dataclass(frozen=True, slots=True)
class NotesConfig:
    """The notebook (IVA_NOTES_*): on or off, eve's connection to its /mcp by name, and the
    operator's own wording of its window, wrap and nudge lines (None: Iva's)."""

    enabled: bool = True
    connection: str = "notebook"
    texts: tuple[str | None, str | None, str | None] = (None, None, None)  # window, wrap, nudge


@dataclass(frozen=True, slots=True)
class VoiceConfig:
    """Voice, audio and video notes (I4): refused, sent as files, or transcribed by a command (its
    argv, the audio file's path appended) within its timeout; and voice for voice (P1-P4, S7):
    the command that reads an answer's text on stdin and writes OGG/Opus on stdout, within its
    timeout (() = off)."""

    mode: VoiceMode = "refuse"
    transcribe_cmd: tuple[str, ...] = ()
    transcribe_timeout: float = DEFAULT_TRANSCRIBE_TIMEOUT
    speak_cmd: tuple[str, ...] = ()
    speak_timeout: float = DEFAULT_SPEAK_TIMEOUT


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


def read_api(env: Env, *, notes_enabled: bool) -> ApiConfig:
    listen = env.listen("IVA_API_LISTEN", DEFAULT_API_LISTEN)
    token, mcp_token = env.get("IVA_API_TOKEN"), env.get("IVA_MCP_TOKEN")
    if (problem := listener_problem(listen, notes_enabled, mcp_token)) is not None:
        env.problem(problem)
    if mcp_token is not None and mcp_token == token:
        env.problem("IVA_MCP_TOKEN must differ from IVA_API_TOKEN: eve holds the MCP token, and it must not "
                    "open the owner API")
    return ApiConfig(listen=listen, token=token, mcp_token=mcp_token, health_reply_seconds=env.number(
        "IVA_HEALTH_REPLY_SECONDS", DEFAULT_HEALTH_REPLY_SECONDS, low=1.0))


def read_notes(env: Env) -> NotesConfig:
    enabled = env.flag("IVA_NOTES_ENABLED", True)
    connection = env.get("IVA_NOTES_CONNECTION") or "notebook"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", connection):
        env.problem(f"IVA_NOTES_CONNECTION={connection!r} must be the eve connection's name (letters, digits, _ -)")
    window, wrap, nudge = (env.get(name) for name in _NOTES_TEXTS)
    for name, text in zip(_NOTES_TEXTS, (window, wrap, nudge), strict=True):
        if text is not None:
            try:
                text.format(used=1, wall=2, left=1, wall_name="compaction")
            except (KeyError, IndexError, ValueError) as exc:
                env.problem(f"{name}: only {{used}}, {{wall}}, {{left}} and {{wall_name}} may be used ({exc})")
    return NotesConfig(enabled=enabled, connection=connection, texts=(window, wrap, nudge))


def read_voice(env: Env) -> VoiceConfig:
    mode: VoiceMode = env.choice("IVA_VOICE", ("refuse", "file", "command"), "refuse")
    transcribe_cmd = env.command("IVA_TRANSCRIBE_CMD") if mode == "command" else ()  # else unused
    if mode == "command" and env.get("IVA_TRANSCRIBE_CMD") is None:
        env.problem("IVA_VOICE=command needs IVA_TRANSCRIBE_CMD: the command that prints a transcript "
                    "(the audio file's path is appended as its last argument)")
    return VoiceConfig(
        mode=mode, transcribe_cmd=transcribe_cmd,
        transcribe_timeout=env.number("IVA_TRANSCRIBE_TIMEOUT", DEFAULT_TRANSCRIBE_TIMEOUT, low=1.0),
        speak_cmd=env.command("IVA_SPEAK_CMD"),
        speak_timeout=env.number("IVA_SPEAK_TIMEOUT", DEFAULT_SPEAK_TIMEOUT, low=1.0),
    )
