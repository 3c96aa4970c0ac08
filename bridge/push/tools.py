"""The reminder tools the assistant has on the notebook's MCP connection (W9), in the owner's turns
only (the same gate as the notes, :mod:`bridge.web.mcp`). Errors are text the model can act
on: which field, what to send instead."""

from __future__ import annotations

from typing import Any

from ..storage.payloads import PushedTurn, QueuedMessage, decode
from ..storage.store import Chat
from ..toolschema import tool as _tool
from .reminders import ASSISTANT_MAX, ASSISTANT_RECURRING, MAX_TEXT, Reminders
from .turns import PushError, iso

__all__ = ["REMINDER_TOOLS", "run_tool"]



REMINDER_TOOLS: dict[str, dict[str, Any]] = {t["name"]: t for t in (
    _tool("chat_reminder_set",
          "Set a reminder in this chat: when it falls due you get a turn of this chat with its text as the "
          "prompt (the person sees your answer), so write the text as an instruction to yourself, e.g. \"Tell "
          "Ann her train leaves at 9:40\". Give exactly one of at (once) or cron (recurring). "
          f"You may have at most {ASSISTANT_MAX} of your own per chat, {ASSISTANT_RECURRING} of them recurring, "
          f"each falling due at most hourly; text at most {MAX_TEXT} characters. When it fires you are told "
          "you set it.",
          {"text": {"type": "string", "description": "What to do when it falls due."},
           "at": {"type": "string", "description": "Once, at this time: ISO 8601 with its offset, e.g. "
                  "2026-12-24T09:00:00+01:00."},
           "cron": {"type": "string", "description": "Recurring: five cron fields (minute hour day-of-month month "
                    "day-of-week), e.g. \"0 9 * * 1-5\"; at most once a minute."},
           "tz": {"type": "string", "description": "The IANA time zone the cron is read in, e.g. Europe/Berlin "
                  "(default: the bridge's IVA_TZ, else UTC)."}},
          ["text"]),
    _tool("chat_reminder_list", "List this chat's reminders: id, text, at or cron, tz, the next time, paused.",
          {}, [], read_only=True),
    _tool("chat_reminder_cancel", "Cancel one of this chat's reminders by its id (from chat_reminder_list).",
          {"id": {"type": "string", "description": "The reminder's id."}}, ["id"], destructive=True),
)}


async def run_tool(reminders: Reminders, chat: Chat, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call; :class:`PushError` says what is wrong with it."""
    address = chat.address
    if name == "chat_reminder_set":
        unknown = sorted(set(args) - {"text", "at", "cron", "tz"})
        if unknown:
            raise PushError(unknown[0], f"Unknown argument {unknown[0]!r}: give text, and at or cron (and tz).")
        made = await reminders.set(address, args.get("text"), at=args.get("at"), cron=args.get("cron"),
                                   tz=args.get("tz"), author="assistant", set_in=await _turn(reminders, chat))
        return {"set": made.id, "next_at": made.as_record()["next_at"], "tz": made.tz}
    if name == "chat_reminder_list":
        return {"reminders": [r.as_record() for r in await reminders.active(address)]}
    reminder_id = args.get("id")
    if not isinstance(reminder_id, str) or not reminder_id:
        raise PushError("id", "Give the reminder's id (chat_reminder_list shows them).")
    if not await reminders.cancel(address, reminder_id):
        raise PushError("id", f"This chat has no active reminder {reminder_id!r} (chat_reminder_list shows them).")
    return {"cancelled": reminder_id}


async def _turn(reminders: Reminders, chat: Chat) -> str:
    """S9: the turn the assistant sets a reminder in, in words for its fire: when, and what started
    it (the owner's message, a pushed turn, another reminder's fire)."""
    items = [decode(m.payload) for m in await reminders.pushes.queue.inflight(chat.address) if m.claim == chat.claim]
    pushed = next((i for i in items if isinstance(i, PushedTurn)), None)
    if pushed is not None and pushed.source == "reminder":
        what = f"the reminder {pushed.reminder}'s fire" + (" (one you had set)" if pushed.set_by == "assistant" else "")
    elif pushed is not None:
        what = "a turn pushed through the owner API" + (f" by {pushed.by!r}" if pushed.by else "")
    elif any(isinstance(i, QueuedMessage) for i in items):
        what = "a message in the chat"
    else:
        what = "a turn"
    return f"in a turn at {iso(reminders.clock())} started by {what}"
