"""structlog: one configure() call, JSON to stdout for journald, stdlib loggers routed through it."""

from __future__ import annotations

import logging
import sys
import urllib.parse
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import structlog

__all__ = ["LINE_LIMIT", "Redactor", "configure", "get", "one_line"]

REDACTED = "***"


class Redactor:
    """A structlog processor that removes secrets from every value of an event, exception texts
    included (it runs after they are formatted): a library's error text can hold a URL with the
    bot token in it (``/file/bot<token>/…``)."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= 8:
                forms.update({secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret)})
                _, sep, tail = secret.partition(":")
                if sep and len(tail) >= 8:
                    forms.add(tail)  # a bot token's secret part alone
        self.forms = sorted(forms, key=len, reverse=True)

    def scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for form in self.forms:
                if form in value:
                    value = value.replace(form, REDACTED)
            return value
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.scrub(v) for v in value)
        if isinstance(value, BaseException):
            return self.scrub(str(value))
        return value

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not self.forms:
            return event
        for key, value in event.items():
            event[key] = self.scrub(value)
        return event

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", *, json: bool | None = None, secrets: Iterable[str | None] = ()) -> None:
    """Configure logging once per process. ``json`` defaults to "stdout is not a terminal";
    every ``secrets`` value is replaced by ``***`` in every line."""
    json = (not sys.stdout.isatty()) if json is None else json
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.ExtraAdder(),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(ensure_ascii=False) if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                Redactor(secrets),
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    # Libraries talk at warning and above unless we debug; aiohttp/httpx access lines are noise.
    for noisy in ("aiogram", "httpx", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.INFO if level == "debug" else logging.WARNING)
    for chatty in ("httpcore", "aiogram.event"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def get(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)  # structlog.get_logger, typed for our wrapper_class


LINE_LIMIT = 400  # characters of a problem line; a server's long answer is cut to it


def one_line(text: str, limit: int = LINE_LIMIT, *, secrets: Sequence[str] = ()) -> str:
    """A problem as one line: whatever a server put in its answer (line breaks, a page of HTML,
    a 5 000-character description) is folded and cut, so each problem stays one line; a secret
    it echoes (S5) shows as ``***``, as in the logs (URL-encoded, or a bot token's secret part)."""
    text = " ".join(str(Redactor(secrets).scrub(text)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
