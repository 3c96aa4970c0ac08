"""Markdown → Telegram text + entities, split into messages of at most 4096 UTF-16 units.

Rendering to entities (not parse_mode) means Telegram never sees markup it could fail to parse;
the split happens after rendering, clipping entities at the cut, so no chunk breaks mid-entity.
"""

from __future__ import annotations

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
    chunks = telegramify_markdown.split_entities(body, entities, limit)
    return [
        Chunk(part, tuple(MessageEntity(**e.to_dict()) for e in part_entities))
        for part, part_entities in chunks
    ]
