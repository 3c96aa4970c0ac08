"""Iva: the daemon that puts an eve agent behind a Telegram bot."""

__version__ = "0.1.0"
