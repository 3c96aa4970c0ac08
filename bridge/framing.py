"""How text that is not Iva's rides among Iva's own lines (S4, S8): a note's body, a relayed
notification. Iva's own lines are headings ('## name | description'), section brackets
('[state]', '[notes]'), rulers ('=== … ==='), and index entries ('- name — description'); a line
of someone else's text that begins like one of them (after any blanks or invisible characters,
lookalike forms included) is shown with a backslash in front, and so is one that begins with a
backslash, which makes the escape reversible. Every other line is shown exactly as written."""

from __future__ import annotations

import re
import unicodedata

__all__ = ["BREAK", "ESCAPE", "frame_body", "unframe_body"]

BREAK = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")  # what str.splitlines() breaks on
_MARKUP_STARTS = frozenset("[#=\\")
ESCAPE = "\\"


def _first_visible(line: str) -> str:
    """The line from its first character that is neither blank nor invisible (zero-width, BOM)."""
    for i, ch in enumerate(line):
        if not ch.isspace() and unicodedata.category(ch) != "Cf":
            return line[i:]
    return ""


def _looks_like_markup(line: str) -> bool:
    rest = _first_visible(line)
    if not rest:
        return False
    first = unicodedata.normalize("NFKC", rest[0])[:1]  # a fullwidth '［' or '＃' reads the same
    return first in _MARKUP_STARTS or (first == "-" and "\u2014" in rest)


def frame_body(body: str) -> str:
    """A note's body as it rides in Iva's text: every line break is a plain newline, and a line
    that could pass for Iva's own markup (or starts with the escape) gets a backslash in front."""
    return "\n".join(ESCAPE + line if _looks_like_markup(line) else line for line in BREAK.split(body))


def unframe_body(text: str) -> str:
    """The inverse of :func:`frame_body` (for a body that used plain newlines)."""
    return "\n".join(line[1:] if line.startswith(ESCAPE) and _looks_like_markup(line[1:]) else line
                     for line in text.split("\n"))


