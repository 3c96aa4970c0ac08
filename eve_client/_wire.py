"""What both wire readers share: a line's JSON, typed reads of a loose ``data`` mapping, and the
two things a line can be besides events (a malformed line, a transport record)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._model import QuestionOption

__all__ = ["Malformed", "Transport", "load", "mapping", "number", "options", "text"]


@dataclass(frozen=True, slots=True)
class Malformed:
    """A stream line that is not a record of the stream's version: reported and skipped, never
    fatal, and not counted as a line (F6, R6)."""

    number: int
    line: str
    error: str


@dataclass(frozen=True, slots=True)
class Transport:
    """A record about the connection, not the session (version 27's ``{"$eve": …}``): not a line."""

    kind: str  # heartbeat | stream.lease-ended | stream.ended | position | a newer word
    next: int | None = None


def load(raw_line: bytes, number: int) -> dict[str, Any] | Malformed:
    """The line as a JSON object, or why it is not one."""
    try:
        raw = json.loads(raw_line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return Malformed(number, raw_line[:300].decode("utf-8", "replace"), f"not JSON: {exc}")
    except RecursionError:
        return Malformed(number, raw_line[:300].decode("utf-8", "replace"), "nested past the parser's depth")
    if not isinstance(raw, dict):
        return Malformed(number, raw_line[:300].decode("utf-8", "replace"), "not a JSON object")
    return raw


_EMPTY: Mapping[str, Any] = {}


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


def text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def number(value: Any) -> int | None:
    """A token count, or None for anything that is not a finite number (F6)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value)


def options(listed: Any) -> tuple[QuestionOption, ...]:
    """A question's options (``[{id, label?}]``, both wires); a non-list or a bad entry is no
    option, never an error (F6)."""
    return tuple(QuestionOption(str(o["id"]), str(o.get("label") or o["id"]))
                 for o in (listed if isinstance(listed, list) else [])
                 if isinstance(o, Mapping) and isinstance(o.get("id"), str))
