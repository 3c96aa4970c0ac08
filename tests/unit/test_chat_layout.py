"""The tree follows the message, and the chat's state machine is written in one module.

The layers, from the top (an import may only go down, or stay inside its own package):
``cli`` → ``app`` → ``web`` → ``intake`` → ``chat`` → the domain (``notebook``, ``push``,
``people``, ``models``) → ``telegram`` → ``storage`` → the base (config, log, metrics, systemd, backoff, …)."""

from __future__ import annotations

import ast
import gc
import inspect
import re
from pathlib import Path

import bridge.chat
from bridge.chat.transitions import Transitions

BRIDGE = Path(__file__).resolve().parents[2] / "bridge"
STATE_FIELDS = (
    "status", "kind", "origin", "eve_session", "cursor", "claim", "deliveries", "busy_since", "progress_at",
    "measurement", "compaction_disabled", "reset_mark", "reset_requested", "reset_dropped", "blocked",
    "compact_phase", "compact_cancel", "compact_notified", "after_pending", "after_report", "waiting_input",
    "owner_turn", "compact_failures", "compact_retry_at",
)
# the only bridge modules with SQL (and diskqueue): storage's table modules, and the notebook's own
STORAGE = {"storage/store.py", "storage/schema.py", "storage/chats.py", "storage/outbox.py", "storage/prompts.py",
           "storage/people.py", "storage/spend.py", "storage/status.py", "storage/pushes.py", "storage/models.py",
           "storage/stranded.py", "notebook/service.py"}


def _modules() -> dict[str, str]:
    return {str(p.relative_to(BRIDGE)): p.read_text() for p in BRIDGE.rglob("*.py")}


def test_only_the_transitions_write_a_chats_state() -> None:
    writers = {name for name, text in _modules().items()
               if name != "storage/chats.py"
               and re.search(r"\.(update_chat|update_chat_if|touch_chat|block_chat)\(", text)}
    assert writers <= {f"chat/transitions/{part}" for part in ("record.py", "turns.py", "compactions.py")}
    assert writers


def test_sql_lives_only_in_the_storage_modules() -> None:
    sql = re.compile(r"\b(SELECT \S.*? FROM|UPDATE \w+ SET|INSERT INTO|DELETE FROM)\b")
    raw = re.compile(r"\bdb\.(execute|executemany|fetchall|fetchone|executescript)\(")
    offenders = {name for name, text in _modules().items()
                 if name not in STORAGE and (raw.search(text) or sql.search(text))}
    assert offenders == set()


def test_the_notebook_writes_only_its_own_columns_of_a_chat() -> None:
    text = (BRIDGE / "notebook" / "service.py").read_text()
    for statement in re.findall(r"UPDATE chats SET ([^\"]+?) WHERE", text):
        columns = {part.split("=")[0].strip() for part in statement.split(",")}
        assert columns <= {"notes_version", "notes_rebuild_failed"}, columns
        assert not columns & set(STATE_FIELDS)


def _parse(text: str) -> ast.Module:
    """ast.parse with the cyclic GC held off: on CPython 3.11.7 a collection during the parse that runs
    a finalizer (an earlier test's abandoned asyncio task logging "exception was never retrieved")
    fails the parse with "SystemError: AST constructor recursion depth mismatch"; the CPython the CI runs is 3.11.7."""
    gc.disable()
    try:
        return ast.parse(text)
    finally:
        gc.enable()


def _imports(name: str, text: str) -> set[str]:
    """bridge-internal modules imported anywhere in the module: at module level, under
    ``TYPE_CHECKING`` and inside functions alike — a type-only import is still a dependency."""
    package = ["bridge", *Path(name).with_suffix("").parts]
    package.pop()  # the package a relative import starts from (an __init__'s is its own)
    found: set[str] = set()
    for sub in ast.walk(_parse(text)):
        if isinstance(sub, ast.ImportFrom) and sub.level:
            base = package[: len(package) - sub.level + 1]
            target = ".".join([*base, *(sub.module.split(".") if sub.module else [])])
            found.add(target)
            if not sub.module:
                found.update(f"{target}.{a.name}" for a in sub.names)
        elif isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("bridge"):
            found.add(sub.module)
        elif isinstance(sub, ast.Import):
            found.update(a.name for a in sub.names if a.name.startswith("bridge"))
    return found


LAYERS = (  # from the bottom; a module not named here is of the base layer (which may import itself)
    ("storage",), ("telegram",), ("notebook", "push", "people", "models"), ("chat",), ("intake",), ("web",), ("app",),
    ("state_commands",), ("cli",), ("__main__",),
)


def _layer(module: str) -> tuple[int, str]:
    """(rank, package) of a bridge module: ``bridge.chat.worker`` → (3, "chat")."""
    top = module.split(".")[1] if module.count(".") else ""
    for rank, names in enumerate(LAYERS, start=1):
        if top in names:
            return rank, top
    return 0, top


def test_imports_only_go_down_the_layers() -> None:
    modules = _modules()
    names = {".".join(["bridge", *Path(n).with_suffix("").parts]).removesuffix(".__init__") for n in modules}
    upward = []
    for name, text in modules.items():
        module = ".".join(["bridge", *Path(name).with_suffix("").parts]).removesuffix(".__init__")
        rank, package = _layer(module)
        for target in _imports(name, text) & names:
            their_rank, their_package = _layer(target)
            if target != "bridge" and their_package != package and (their_rank > rank or their_rank == rank > 0):
                upward.append(f"{module} → {target}")
    assert sorted(upward) == []


def test_no_import_cycle_inside_bridge() -> None:
    graph: dict[str, set[str]] = {}
    modules = _modules()
    names = {".".join(["bridge", *Path(n).with_suffix("").parts]).removesuffix(".__init__") for n in modules}
    for name, text in modules.items():
        module = ".".join(["bridge", *Path(name).with_suffix("").parts]).removesuffix(".__init__")
        graph[module] = {m for m in _imports(name, text) if m in names and m != module}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " → ".join([*path[path.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert graph["bridge.chat.consumer"] and "bridge.chat.worker" not in graph["bridge.chat.consumer"]


def test_the_docstring_names_every_transition() -> None:
    doc = bridge.chat.__doc__ or ""
    public = [n for n, f in inspect.getmembers(Transitions, inspect.iscoroutinefunction) if not n.startswith("_")]
    assert len(public) > 20
    missing = [n for n in public if n not in doc]
    assert missing == []
