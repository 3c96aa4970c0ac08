"""The environment as the readers see it, and the one error they raise together.

Each concern's reader (``read_eve``, ``read_voice``…) takes an :class:`Env`: it reads its
variables through the helpers below, which say what is wrong with a bad value on a line of its
own and give the default instead, so that every bad value of every concern is found in one
start (:meth:`bridge.config.Settings.from_env` raises them together as :class:`ConfigError`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from ..errors import BridgeError

__all__ = ["ConfigError", "Env", "state_dir_of"]

T = TypeVar("T")
S = TypeVar("S", bound=str)

_LISTEN = re.compile(r"(\[[0-9a-fA-F:]+\]|[\w.-]+):\d{1,5}")


class ConfigError(BridgeError):
    """Every problem found in the environment, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def state_dir_of(value: str | None) -> Path:
    """The state directory from IVA_STATE_DIR or systemd's STATE_DIRECTORY (its first, when it
    names several), else ./var."""
    return Path(value.split(":")[0]) if value else Path("./var")


def is_listen(value: str) -> bool:
    """``host:port``, e.g. ``127.0.0.1:8787`` or ``[::1]:8787``."""
    return _LISTEN.fullmatch(value) is not None


class Env:
    """The variables (each stripped; empty is unset) and the problems found in them so far."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self.mapping = mapping
        self.problems: list[str] = []

    def get(self, name: str) -> str | None:
        value = self.mapping.get(name)
        return value.strip() if value is not None and value.strip() else None

    def problem(self, line: str) -> None:
        self.problems.append(line)

    def collect(self, read: Callable[[], T], fallback: T) -> T:
        """A reader that raises :class:`ConfigError` itself (:func:`read_models`): its problems
        joined to the others', the fallback instead."""
        try:
            return read()
        except ConfigError as exc:
            self.problems.extend(exc.problems)
            return fallback

    def choice(self, name: str, options: tuple[S, ...], default: S, *, quoted: bool = True) -> S:
        """One of ``options`` (case-insensitive)."""
        raw = (self.get(name) or default).lower()
        chosen = next((o for o in options if o == raw), None)
        if chosen is None:
            shown = [repr(o) if quoted else o for o in options]
            self.problem(f"{name}={raw!r} must be {', '.join(shown[:-1])} or {shown[-1]}")
            return default
        return chosen

    def integer(self, name: str, default: int, *, low: int, high: int | None = None) -> int:
        value = self.whole(name, default, low=low, high=high)
        assert value is not None  # whole() gives the default back, never None for an int default
        return value

    def whole(self, name: str, default: int | None, *, low: int, high: int | None = None) -> int | None:
        """A whole number (``_`` allowed) from ``low`` to ``high``; the default when unset."""
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = int(raw.replace("_", ""))
        except ValueError:
            self.problem(f"{name}={raw!r} is not a whole number")
            return default
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"at least {low}"
            self.problem(f"{name}={value} must be {span}")
            return default
        return value

    def number(self, name: str, default: float, *, low: float, what: str = "a number of seconds") -> float:
        """A finite number, at least ``low`` (NaN and infinity are refused too)."""
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            self.problem(f"{name}={raw!r} is not {what}")
            return default
        if not low <= value < float("inf"):
            self.problem(f"{name}={value} must be at least {low}")
            return default
        return value

    def rate(self, name: str, default: float, *, low: float) -> float:
        """A pace: how many a second (or a minute), at least ``low``."""
        return self.number(name, default, low=low, what="a number")

    def flag(self, name: str, default: bool) -> bool:
        raw = (self.get(name) or ("1" if default else "0")).lower()
        if raw not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            self.problem(f"{name}={raw!r} must be 1 or 0 (true/false)")
        return raw in ("1", "true", "yes", "on")

    def ids(self, name: str) -> frozenset[int]:
        """Telegram user ids, comma- or space-separated."""
        raw = self.get(name)
        if raw is None:
            return frozenset()
        out: set[int] = set()
        for part in re.split(r"[,\s]+", raw):
            if not part:
                continue
            if not re.fullmatch(r"-?\d+", part):
                self.problem(f"{name}: {part!r} is not a Telegram user id (a number)")
                continue
            out.add(int(part))
        return frozenset(out)

    def url(self, name: str, default: str | None) -> str | None:
        """An http(s) URL without its trailing ``/``; None (and a problem) when it is required or bad."""
        raw = self.get(name) or default
        if raw is None:
            self.problem(f"{name} is required (for example http://127.0.0.1:3000)")
            return None
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", raw):
            self.problem(f"{name}={raw!r} is not an http(s) URL")
            return None
        return raw.rstrip("/")

    def listen(self, name: str, default: str) -> str:
        """``host:port`` (kept as given when it is not, the problem said)."""
        listen = self.get(name) or default
        if not is_listen(listen):
            self.problem(f"{name}={listen!r} must be host:port, e.g. {default}")
        return listen

    def command(self, name: str) -> tuple[str, ...]:
        """A command line, split as a shell would (but run without one); its program must exist."""
        raw = self.get(name)
        if raw is None:
            return ()
        try:
            argv = tuple(shlex.split(raw))
        except ValueError as exc:
            self.problem(f"{name}={raw!r} is not a command line ({exc})")
            return ()
        if not argv:
            self.problem(f"{name}={raw!r} names no program")
            return ()
        program = argv[0]
        found = (os.path.isfile(program) and os.access(program, os.X_OK)) if "/" in program \
            else shutil.which(program, path=self.mapping.get("PATH", os.defpath)) is not None
        if not found:
            self.problem(f"{name}: {program!r} is not an executable program" + ("" if "/" in program else " on PATH"))
            return ()
        return argv
