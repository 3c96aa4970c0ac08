"""Issue 35: a log line leads to its file. Every logger of bridge/ is named by its module
(``log.get(__name__)``), so the phases log as themselves; a logger named by a string must name a
module that exists (eve_client's and diskqueue's are their packages: one subsystem each)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bridge", "eve_client", "diskqueue")


def _loggers() -> list[tuple[str, str]]:
    """(module, the name its logger is made with: ``__name__`` or the string)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                    continue
                owner = node.func.value
                made = (node.func.attr == "get" and isinstance(owner, ast.Name) and owner.id == "log") or \
                    (node.func.attr == "getLogger" and isinstance(owner, ast.Name) and owner.id == "logging")
                if not made:
                    continue
                arg = node.args[0]
                if isinstance(arg, ast.Name) and arg.id == "__name__":
                    found.append((module, "__name__"))
                elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((module, arg.value))
    return found


def test_every_logger_of_bridge_is_named_by_its_module() -> None:
    loggers = _loggers()
    assert len([m for m, _ in loggers if m.startswith("bridge.")]) > 25
    named = [(m, name) for m, name in loggers if m.startswith("bridge.") and name != "__name__"
             and m != "bridge.log"]  # bridge/log.py tunes third-party loggers by their own names
    assert named == []


def test_a_logger_named_by_a_string_names_an_existing_module() -> None:
    strings = {name for m, name in _loggers() if name != "__name__" and m != "bridge.log"}
    assert strings, "eve_client and diskqueue log as their packages"
    missing = sorted(name for name in strings if importlib.util.find_spec(name) is None)
    assert missing == []
