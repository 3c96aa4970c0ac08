"""The tree's shape (issue 35): no module of ``bridge/`` over 500 lines, no ``sqlite3.Row`` out of
``bridge/storage/``, no outbox flush by hand after a transaction (the commit sends what it wrote),
and the store's table classes each own their names."""

from __future__ import annotations

import re
from pathlib import Path

from bridge.storage.store import Store

BRIDGE = Path(__file__).resolve().parents[2] / "bridge"
MAX_LINES = 500

# Modules over the limit, each with the size it may not grow past (lower it when it shrinks):
# none since the settings are read by concern (issue 35, item 3: bridge/config/).
OVER_THE_LIMIT: dict[str, int] = {}

# Calls of the outbox's flush outside the outbox: none. What a commit writes, the commit sends
# (bridge/storage/outbox.py, diskqueue's Database.after_commit); what an earlier process left
# pending, the outbox's own resend_left (the chat worker's loop start).
FLUSHES: dict[str, int] = {}


def _modules() -> dict[str, str]:
    return {str(p.relative_to(BRIDGE)): p.read_text() for p in sorted(BRIDGE.rglob("*.py"))}


def test_no_module_of_bridge_is_over_500_lines() -> None:
    """One concept a module: past 500 lines it is two (the known exceptions may only shrink)."""
    sizes = {name: len(text.splitlines()) for name, text in _modules().items()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES and n > OVER_THE_LIMIT.get(name, 0)}
    assert over == {}
    for name in OVER_THE_LIMIT:
        assert name in sizes, f"{name} is gone: drop its exception"


def test_no_function_of_bridge_is_over_80_lines() -> None:
    """A function past 80 lines does several things: each gets a name of its own."""
    import ast

    long = {f"{name}:{node.name}": node.end_lineno - node.lineno + 1
            for name, text in _modules().items() for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > 80}
    assert long == {}


def test_no_sqlite_row_outside_storage() -> None:
    """Storage hands out frozen rows; the sqlite3 row type never leaves it."""
    leaks = {name for name, text in _modules().items()
             if not name.startswith("storage/") and re.search(r"\b(sqlite3|aiosqlite)\.Row\b", text)}
    assert leaks == set()


def test_no_outbox_flush_by_hand() -> None:
    """Nobody flushes the outbox after writing to it: only the outbox itself (its after-commit
    send) and the worker's start-of-loop resend call it."""
    calls = {name: len(re.findall(r"\.flush\(", text)) for name, text in _modules().items()
             if name != "chat/outbox.py"}
    assert {name: n for name, n in calls.items() if n} == FLUSHES


def test_the_store_tables_share_no_name() -> None:
    """Store composes one class per table: a name two of them defined would silently pick one."""
    seen: dict[str, str] = {}
    clashes = []
    for base in Store.__mro__[1:-1]:
        for name in vars(base):
            if name.startswith("__"):
                continue
            if name in seen:
                clashes.append(f"{name}: {seen[name]} and {base.__name__}")
            seen[name] = base.__name__
    assert clashes == []
