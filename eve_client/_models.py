"""Typed answers of eve's HTTP routes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._model import Event

__all__ = ["Accepted", "AgentInfo", "Answer", "Delivery", "Health", "StreamPage"]


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    status: str | None


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What ``/eve/v1/info`` says about the agent; the raw answer stays available."""

    model_id: str | None
    context_window_tokens: int | None
    raw: Mapping[str, Any] = field(repr=False)
    eve_version: str | None = None

    @property
    def stream_version(self) -> int | None:
        """The stream version eve's own version implies (see :func:`implied_stream_version`)."""
        return implied_stream_version(self.eve_version)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AgentInfo:
        agent_raw = raw.get("agent")
        agent: Mapping[str, Any] = agent_raw if isinstance(agent_raw, Mapping) else {}
        model_raw = agent.get("model")
        model: Mapping[str, Any] = model_raw if isinstance(model_raw, Mapping) else {}
        window = model.get("contextWindowTokens")
        return cls(
            model_id=model.get("id") if isinstance(model.get("id"), str) else None,
            # not a bool, not NaN or ±Infinity (which Python's JSON reader accepts): int() of those raises
            context_window_tokens=int(window) if isinstance(window, int | float) and not isinstance(window, bool)
            and math.isfinite(window) and window >= 1 else None,
            raw=raw,
            eve_version=_eve_version(raw),
        )


def implied_stream_version(eve_version: str | None) -> int | None:
    """The stream version an eve version speaks (0.84 began version 27); None when unknown or past
    what this client knows (a 2.x: its stream's header decides)."""
    if eve_version is None:
        return None
    parts = eve_version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None
    if major == 0:
        return 26 if minor < 84 else 27
    return 27 if major == 1 else None


def _eve_version(raw: Mapping[str, Any]) -> str | None:
    """eve's version where ``/info`` names it (at the top, or under runtime, agent or build)."""
    for holder in (raw, *(raw.get(k) for k in ("runtime", "agent", "build", "eve"))):
        if isinstance(holder, Mapping):
            for key in ("eveVersion", "version"):
                value = holder.get(key)
                if isinstance(value, str) and value[:1].isdigit() and "." in value:
                    return value
    return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message eve accepted: ``delivery_id`` shows up in the events of its turn."""

    session_id: str
    delivery_id: str | None


@dataclass(frozen=True, slots=True)
class Accepted:
    """The answer of cancel/compact/clear/end: ``accepted`` (with eve 1.x's receipt), or 0.80's
    ``no_active_turn``, ``no_active_session``."""

    status: str
    delivery_id: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


@dataclass(frozen=True, slots=True)
class Answer:
    """A person's answer to what a turn waits on: an option, or free text."""

    question_id: str
    option_id: str | None = None
    text: str | None = None


@dataclass(frozen=True, slots=True)
class StreamPage:
    """A finite read of the stream (``follow=false``)."""

    events: tuple[Event, ...]
    tail_index: int | None
    version: int = 0

    @property
    def next_index(self) -> int | None:
        return None if self.tail_index is None else self.tail_index + 1
