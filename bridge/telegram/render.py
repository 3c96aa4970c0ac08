"""Markdown → Telegram text + entities, split into messages of at most 4096 UTF-16 units.

Rendering to entities (not parse_mode) means Telegram never sees markup it could fail to parse;
the split happens after rendering, clipping entities at the cut, so no chunk breaks mid-entity.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import telegramify_markdown
from aiogram.types import MessageEntity

__all__ = ["MAX_MESSAGE", "Chunk", "render"]

MAX_MESSAGE = 4096


def _config() -> telegramify_markdown.RenderConfig:
    """Headings stay bold text (no emoji badges); bullets are plain dots."""
    config = telegramify_markdown.RenderConfig.isolated()
    symbols = config.markdown_symbol
    for level in range(1, 7):
        setattr(symbols, f"heading_level_{level}", "")
    symbols.unordered_list_item = "•"
    return config


_CONFIG = _config()


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str
    entities: tuple[MessageEntity, ...]

    def plain(self) -> Chunk:
        return Chunk(self.text, ())


def render(text: str, *, markdown: bool = True, limit: int = MAX_MESSAGE) -> list[Chunk]:
    """The messages to send for ``text``; plain text when ``markdown`` is off or it fails."""
    if markdown:
        try:
            body, entities = telegramify_markdown.convert(text, config=_CONFIG)
        except Exception:  # a renderer bug must not cost the reply: fall back to plain text
            body, entities = text, []
    else:
        body, entities = text, []
    return [
        Chunk(part, tuple(MessageEntity(**e.to_dict()) for e in part_entities))
        for part, part_entities in _split(body, entities, limit)
    ]


def _u16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _split(
    text: str, entities: list[telegramify_markdown.MessageEntity], limit: int
) -> list[tuple[str, list[telegramify_markdown.MessageEntity]]]:
    """Cut at a paragraph, else a line, else a space, else hard; entities are clipped per part."""
    parts: list[tuple[int, int]] = []  # python index ranges
    start = 0
    while start < len(text):
        end = len(text)
        if _u16(text[start:end]) > limit:
            # the longest prefix within the limit
            lo, hi = start, len(text)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if _u16(text[start:mid]) <= limit:
                    lo = mid
                else:
                    hi = mid - 1
            end = lo
            window = text[start:end]
            for sep in ("\n\n", "\n", " "):
                cut = window.rfind(sep)
                if cut > len(window) // 3:
                    end = start + cut + len(sep)
                    break
        parts.append((start, end))
        start = end
    out: list[tuple[str, list[telegramify_markdown.MessageEntity]]] = []
    for begin, end in parts:
        piece = text[begin:end]
        if not piece.strip():
            continue
        u_begin, u_end = _u16(text[:begin]), _u16(text[:end])
        clipped: list[telegramify_markdown.MessageEntity] = []
        for e in entities:
            lo, hi = max(e.offset, u_begin), min(e.offset + e.length, u_end)
            if hi > lo:
                clipped.append(dataclasses.replace(e, offset=lo - u_begin, length=hi - lo))
        out.append((piece, clipped))
    return out
