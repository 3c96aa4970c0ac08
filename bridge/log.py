"""structlog: one configure() call, JSON to stdout for journald, stdlib loggers routed through it."""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["configure", "get"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Configure logging once per process. ``json`` defaults to "stdout is not a terminal"."""
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
