"""Whether the state directory's disk can take a write (F2): what ``/healthz`` and ``iva status``
say when nothing can be made durable."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOW_SPACE", "free_bytes", "full"]

LOW_SPACE = 1024 * 1024  # bytes: below this SQLite's next commit (a WAL frame, a page) may not fit


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer may still use there; None when the system cannot say."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def full(directory: Path) -> str | None:
    """One line when the disk is (about) full, else None."""
    free = free_bytes(directory)
    if free is None or free >= LOW_SPACE:
        return None
    return f"the disk of {directory} is full ({free // 1024} KiB free): nothing can be made durable"
