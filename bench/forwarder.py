"""The baseline of benchmarks 4 and 5 (issue 23): a minimal aiogram + httpx forwarder, without
durability — no queue, no outbox, no state database, no pacer, no drafts, no typing. A message
from Telegram goes to eve (a session per chat, kept in a dict) as it comes, the handler reads the
session's stream until ``message.completed`` and sends its text back with ``sendMessage``.

Run by the benchmarks in place of the daemon, against the same fakes, with the same environment
(``IVA_TELEGRAM_TOKEN``, ``IVA_TELEGRAM_API_URL``, ``IVA_EVE_URL``, ``IVA_EVE_TOKEN``):
``python -m bench.forwarder`` (``bench.latency --versus``). It is also the minimal aiogram bot
of benchmark 4's RSS figure, holding the same turns in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message


async def main() -> None:
    session = AiohttpSession(api=TelegramAPIServer.from_base(os.environ["IVA_TELEGRAM_API_URL"]))
    bot = Bot(os.environ["IVA_TELEGRAM_TOKEN"], session=session)
    eve = httpx.AsyncClient(base_url=os.environ["IVA_EVE_URL"], timeout=None,
                            headers={"authorization": f"Bearer {os.environ['IVA_EVE_TOKEN']}"},
                            limits=httpx.Limits(max_connections=None, max_keepalive_connections=2000))
    sessions: dict[int, tuple[str, int]] = {}  # chat → (eve session, the stream's next index)
    dp = Dispatcher()

    @dp.message()
    async def forward(message: Message) -> None:
        chat = message.chat.id
        if chat not in sessions:
            created = (await eve.post("/eve/v1/session", json={})).json()
            sessions[chat] = (created["sessionId"], 0)
        sid, index = sessions[chat]
        await eve.post(f"/eve/v1/session/{sid}", json={"message": message.text or ""})
        reply: str | None = None
        async with eve.stream("GET", f"/eve/v1/session/{sid}/stream", params={"startIndex": index}) as stream:
            async for line in stream.aiter_lines():
                if not line.strip():
                    continue
                event: dict[str, Any] = json.loads(line)
                index += 1
                if event["type"] == "message.completed":
                    reply = event["data"].get("message") or ""
                    break
        sessions[chat] = (sid, index)
        if reply:
            await bot.send_message(chat, reply)

    try:
        await dp.start_polling(bot, handle_signals=True, polling_timeout=25)
    finally:
        await eve.aclose()
        await bot.session.close()


if __name__ == "__main__":
    asyncio.run(main())
