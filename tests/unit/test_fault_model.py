"""docs/faults.md names a test on every row (issue 11): each one it names in full exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "faults.md"


def _test_file(path: str) -> Path | None:
    """The file a row names: its path under tests/, or a bare file name found once anywhere
    under tests/ (a row written before the tests moved into packages)."""
    if (ROOT / "tests" / path).exists():
        return ROOT / "tests" / path
    found = [f for f in (ROOT / "tests").rglob(Path(path).name) if "node_modules" not in f.parts]
    return found[0] if len(found) == 1 else None


def test_every_row_names_a_test_and_every_named_test_exists() -> None:
    rows = [line for line in DOC.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| fault ") and not line.startswith("|---")]
    assert rows
    missing = []
    for row in rows:
        assert "test_" in row.split(" | ")[-1] or "bench." in row, f"a row without its test: {row[:120]}"
        for path, name in re.findall(r"`((?:\w+/)*test_\w+\.py|machine)::(test_\w+)`", row):
            file = _test_file("chat/test_chat_machine.py" if path == "machine" else path)
            if file is None or not re.search(rf"def {name}\b", file.read_text()):
                missing.append(f"{path}::{name}")
    assert missing == []
