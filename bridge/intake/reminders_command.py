"""``/reminders`` in the chat (W8): the owner sees the chat's reminders, each with a button that
cancels it; anyone else is told that only the owner can. Both languages (bridge/telegram/texts.py).

In a group both answers are the asker's alone (S7): the list is shown to the owner alone in the
group (ephemeral), or, where Telegram will not, in the owner's private chat with one line in the
group saying so — never to the group. Its buttons name the group (``rm:<id>@<address>``), so a
press in that private chat cancels the group's reminder; a refusal is shown to the asker alone,
or plainly where Telegram refuses that (it says nothing of the list)."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, tzinfo
from typing import Any

from aiogram.types import CallbackQuery, Message

from .. import log
from ..chat.services import Services
from ..push.reminders import Reminder, Reminders
from ..storage.marks import CommandMark, remember
from ..telegram.texts import t
from .addressing import Address

__all__ = ["PREFIX", "button", "pressed", "reminders_command", "reminders_text"]

logger = log.get(__name__)

PREFIX = "rm:"  # a cancel button's callback data: rm:<reminder id>, rm:<reminder id>@<address> in a group


def button(data: str | None) -> str | None:
    """What one of our cancel buttons names (``<id>`` or ``<id>@<address>``), or None for any
    other callback data."""
    if not data or not data.startswith(PREFIX) or len(data) > 64:
        return None
    return data[len(PREFIX):] or None


def _short(text: str, limit: int) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _local(r: Reminder) -> str:
    """The next instant as the person set it: a cron's in its zone (named on the line), a one-time
    one's in the offset it was given."""
    if r.next_at is None:
        return "—"
    if r.at is not None:
        shown = datetime.fromtimestamp(r.next_at, datetime.fromisoformat(r.at).tzinfo)
        offset = shown.strftime("%z")
        zone = "UTC" if offset in ("+0000", "") else f"UTC{offset[:3]}:{offset[3:5]}"
        return f"{shown:%Y-%m-%d %H:%M} ({zone})"
    try:
        zone_info: tzinfo = zoneinfo.ZoneInfo(r.tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        zone_info = UTC
    return f"{datetime.fromtimestamp(r.next_at, zone_info):%Y-%m-%d %H:%M}"


def _line(r: Reminder, lang: str) -> str:
    when = f" — {r.cron} ({r.tz})" if r.at is None else (f" — {_local(r)}" if r.paused else "")
    state = t("reminders_paused", lang) if r.paused else t("reminders_next", lang, at=_local(r))
    return f"• {_short(r.text, 80)}{when} — {state}"


def reminders_text(reminders: list[Reminder], lang: str, *,
                   group: str | None = None) -> tuple[str, list[list[dict[str, Any]]] | None]:
    """The list and its cancel buttons (one a row); a group's buttons name it (``group``)."""
    if not reminders:
        return t("reminders_none", lang), None
    lines = [t("reminders_header", lang, n=len(reminders)), *(_line(r, lang) for r in reminders)]
    suffix = f"@{group}" if group is not None else ""
    rows = [[{"text": t("reminders_cancel", lang, what=_short(r.text, 40)),
              "callback_data": f"{PREFIX}{r.id}{suffix}"}] for r in reminders]
    return "\n".join(lines), rows


async def reminders_command(s: Services, reminders: Reminders, message: Message, address: Address, lang: str,
                            key: str) -> str:
    addr = str(address)
    private = message.chat.type == "private"
    asker = message.from_user.id if message.from_user is not None else None
    owner = asker is not None and await s.people.is_owner(asker)
    fallback = None
    if owner:
        text, rows = reminders_text(await reminders.active(addr), lang, group=None if private else addr)
        if not private:  # S7: the owner's business, never the group's (in private, where not ephemeral)
            title = message.chat.title or str(address.chat_id)
            fallback = {"private": f"{title}\n{text}", "sent": t("reminders_sent_privately", lang),
                        "unsent": t("reminders_start_private", lang)}
    else:
        text, rows = t("reminders_owner_only", lang), None
    async with s.store.db.transaction():
        # The answer is on disk with the mark that says the update was handled.
        if not await remember(s.queue, addr, CommandMark("reminders"), dedupe_key=key):
            return "duplicate"
        await s.store.put_outgoing(addr, f"re:{key}", address.chat_id, address.thread_id, text, format="plain",
                                   reply_to=message.message_id, markup=rows,
                                   receiver=None if private else asker, fallback=fallback)
    return "command"


async def pressed(s: Services, reminders: Reminders, query: CallbackQuery, named: str, lang: str) -> str:
    """A cancel button: only an owner may, only in the reminder's own chat — or in the owner's
    private chat, the copy of a group's list (S7), for that group's reminder. The note to show."""
    if not await s.people.is_owner(query.from_user.id):
        return t("reminders_cancel_owner_only", lang)
    reminder_id, _, group = named.partition("@")
    where = query.message.chat.id if query.message is not None else None
    thread = getattr(query.message, "message_thread_id", None) if query.message is not None else None
    places = [Address(where, thread) if where is not None else None, Address(where) if where else None]
    if group and where == query.from_user.id:
        try:
            places.append(Address.parse(group))
        except ValueError:
            pass
    for address in places:
        if address is not None and await reminders.cancel(str(address), reminder_id):
            logger.info("reminder_cancelled_by_button", reminder=reminder_id)
            return t("reminder_cancelled", lang)
    return t("reminder_gone", lang)
