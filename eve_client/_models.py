"""Typed answers of eve's HTTP routes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._events import Event

__all__ = ["Accepted", "AgentInfo", "Delivery", "Health", "ResetResult", "StreamPage"]


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
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message eve accepted: ``delivery_id`` shows up in the events of its turn."""

    session_id: str
    delivery_id: str | None


@dataclass(frozen=True, slots=True)
class Accepted:
    """The answer of cancel/compact/clear: ``accepted``, ``no_active_turn``, ``no_active_session``."""

    status: str

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


@dataclass(frozen=True, slots=True)
class ResetResult:
    status: str
    previous_session_id: str | None


@dataclass(frozen=True, slots=True)
class StreamPage:
    """A finite read of the stream (``follow=false``)."""

    events: tuple[Event, ...]
    tail_index: int | None

    @property
    def next_index(self) -> int | None:
        return None if self.tail_index is None else self.tail_index + 1
