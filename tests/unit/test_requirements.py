"""The repository defines the vocabulary its code speaks, and its docs are one place.

Every requirement code the packages cite in a comment or docstring (``C6``, ``F4``, ``L*``, a
range ``C1-C7``, ``PROTOCOL.md §9``, ``seed 004``) has a line in ``docs/requirements.md``; no
``issue N`` is cited there (issue numbers are not defined in the repository); every SPEC id is
defined; every page of ``docs/`` is linked from the README; every ``IVA_*`` variable the
settings read has a row in ``docs/configuration.md``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bridge", "eve_client", "diskqueue")
REQUIREMENTS = ROOT / "docs" / "requirements.md"
SPEC = ROOT.parent / "shared" / "SPEC.md"

# A code: one capital letter, one or two digits, an optional prime (C8′), standing alone — not
# part of a word, a path or a number (``ID3``, ``0xA1``, ``x/T1`` are not codes). Any letter
# counts, so a code of a letter SPEC does not use (Z9) is caught as undefined, not skipped.
CODE = re.compile(r"(?<![\w./$#@:′'-])([A-Z])(\d{1,2})(′?)(?![\w′])")
# A range of codes: C1-C7, N1–N9, C1–7 (every code in it must be defined).
RANGE = re.compile(r"(?<![\w./$#@:′'-])([A-Z])(\d{1,2})\s?[-–]\s?\1?(\d{1,2})(?![\w′])")
# A whole section: L*, I* (the shorthand for every code of one letter's section).
WILDCARD = re.compile(r"(?<![\w*\\])([A-Z])\*(?![\w*])")
# A section of a document: PROTOCOL.md §9, SPEC §4, DESIGN §1, §3-§7 (a range after one).
SECTION = re.compile(r"§\s?(\d{1,2})(?:\s?[-–]\s?§?\s?(\d{1,2}))?")
DOCUMENT = re.compile(r"\b(PROTOCOL|SPEC|DESIGN)\b")
SEED = re.compile(r"\bseed (\d{3})\b")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
# How a definition reads in docs/requirements.md: a list item opening with the key in backticks.
DEFINITION = re.compile(r"^- `([^`]+)` — \S", re.MULTILINE)


def _prose(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of one module, with their line numbers."""
    text = path.read_text()
    found: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.append((body[0].lineno, body[0].value.value))
    return found


def citations(text: str) -> set[str]:
    """Every key ``text`` cites, as ``docs/requirements.md`` spells it: ``C6``, ``L*``,
    ``PROTOCOL §9``, ``seed 004``. A ``§`` with no document before it on its line is cited
    as ``? §N``, which nothing defines."""
    keys: set[str] = set()
    for line in text.splitlines():
        for letter, first, last in RANGE.findall(line):
            keys.update(f"{letter}{n}" for n in range(int(first), int(last) + 1))
        keys.update(f"{letter}{number}{prime}" for letter, number, prime in CODE.findall(line))
        keys.update(f"{letter}*" for letter in WILDCARD.findall(line))
        keys.update(f"seed {number}" for number in SEED.findall(line))
        for match in SECTION.finditer(line):
            documents = DOCUMENT.findall(line[:match.start()])
            document = documents[-1] if documents else "?"
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            keys.update(f"{document} §{n}" for n in range(first, last + 1))
    return keys


def _defined() -> set[str]:
    return set(DEFINITION.findall(REQUIREMENTS.read_text()))


def _package_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_the_citation_pattern_finds_what_it_must() -> None:
    """The pattern itself: codes, primes, ranges, sections, seeds — and an undefined code."""
    assert citations("a late ack (C6), held (C1-C3), C8′ and N1–N2; L* (the stop)") == \
        {"C6", "C1", "C2", "C3", "C8′", "N1", "N2", "L*"}
    assert citations("eve restarted (PROTOCOL.md §9), §3-§5 of PROTOCOL; SPEC §4, seed 004") == \
        {"PROTOCOL §9", "PROTOCOL §3", "PROTOCOL §4", "PROTOCOL §5", "SPEC §4", "seed 004"}
    assert citations("UTF-16, ID3 tags, 0xA1, bridge/T1.py, sha256, x2, a §7 of nothing") == {"? §7"}
    assert "Z9" in citations("a made-up code (Z9) is still a citation")
    assert not {"Z9", "? §7"} <= _defined()


def test_every_code_cited_in_the_packages_is_defined() -> None:
    defined = _defined()
    undefined = sorted(
        f"{path.relative_to(ROOT)}:{line}: {key}"
        for path in _package_files() for line, text in _prose(path) for key in citations(text)
        if key not in defined
    )
    assert undefined == []


def test_the_packages_cite_no_issue_numbers() -> None:
    """Issue numbers are not defined in the repository: say the requirement or the plain words."""
    cited = sorted(f"{path.relative_to(ROOT)}:{line}: {match.group(0)}"
                   for path in _package_files() for line, text in _prose(path)
                   for match in ISSUE.finditer(text))
    assert cited == []


def test_every_spec_id_is_defined() -> None:
    if not SPEC.exists():
        pytest.skip("../shared/SPEC.md is not beside the repository")
    ids = set(re.findall(r"^- ([A-Z]\d{1,2}′?) ", SPEC.read_text(), re.MULTILINE))
    assert len(ids) > 80
    assert sorted(ids - _defined()) == []


def test_each_code_is_defined_once() -> None:
    keys = DEFINITION.findall(REQUIREMENTS.read_text())
    assert sorted({k for k in keys if keys.count(k) > 1}) == []


def test_every_doc_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert "requirements.md" in pages and "architecture.md" in pages
    assert [p for p in pages if f"](docs/{p})" not in readme] == []


def test_every_setting_has_a_row_in_the_configuration_page() -> None:
    config = "\n".join(p.read_text() for p in sorted((ROOT / "bridge" / "config").glob("*.py")))
    read = set(re.findall(r"\"(IVA_[A-Z0-9_]+)\"", config))
    assert len(read) > 30
    rows = "\n".join(line for line in (ROOT / "docs" / "configuration.md").read_text().splitlines()
                     if line.startswith("| `IVA_"))
    assert sorted(v for v in read if f"`{v}`" not in rows) == []
