"""aiogram parses every Bot API answer as ``Response[method.__returning__]``, a generic pydantic
model. pydantic caches a parametrized model only weakly, and the class sits in a reference cycle
of its own: each full collection of the garbage collector frees it and the next call builds the
class and its validator again (about one a turn, and its garbage for the next collection).
Holding one per method kind for the bot's life keeps pydantic's cache warm (docs/benchmarks.md
section 18)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiogram.client.session.middlewares.base import BaseRequestMiddleware, NextRequestMiddlewareType
from aiogram.methods import Response
from aiogram.methods.base import TelegramType

if TYPE_CHECKING:
    from aiogram import Bot
    from aiogram.methods import TelegramMethod

__all__ = ["ResponseTypes"]


class ResponseTypes(BaseRequestMiddleware):
    """A request middleware that holds the answer's model of each method kind it sees."""

    def __init__(self) -> None:
        self.held: dict[type[Any], Any] = {}

    async def __call__(self, make_request: NextRequestMiddlewareType[TelegramType], bot: Bot,
                       method: TelegramMethod[TelegramType]) -> Response[TelegramType]:
        kind = type(method)
        if kind not in self.held:
            self.held[kind] = Response[method.__returning__]  # type: ignore[name-defined]
        return await make_request(bot, method)
