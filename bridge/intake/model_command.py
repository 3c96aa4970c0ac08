"""``/model`` in the chat (D1): an owner sees the models the operator allows (``IVA_MODELS``), the
one this conversation answers on, and a button per model; ``/model <name>`` (or a button) switches
this conversation — a private chat, one of its topics, a group or a forum topic: its address —
from its next turn on. Anyone else is told that only an owner can. In a group the answers are the
asker's alone (S7).

A name the operator does not allow is one line naming the ones it does, never a turn. A switch to
a model whose parking threshold the conversation no longer fits under (a smaller window, D3)
compacts it before its next turn, as parking would have."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiogram.types import CallbackQuery, Message

from .. import log
from ..chat.services import Services
from ..config import Model
from ..telegram.texts import number, t
from .addressing import Address

if TYPE_CHECKING:
    from ..chat.worker import Scheduler

__all__ = ["PREFIX", "button", "model_command", "model_pressed", "model_text"]

logger = log.get(__name__)

PREFIX = "md:"  # a button's callback data: md:<name>@<address>


def button(data: str | None) -> tuple[str, str] | None:
    """(name, address) of one of our buttons, or None for any other callback data."""
    if not data or not data.startswith(PREFIX) or len(data) > 64:
        return None
    name, at, address = data[len(PREFIX):].partition("@")
    return (name, address) if name and at and address else None


def _shown(model: Model, lang: str) -> str:
    return t("model_line", lang, name=model.name, id=model.id, window=number(model.window))


async def model_text(s: Services, address: str, lang: str) -> tuple[str, list[list[dict[str, Any]]] | None]:
    """The list, the current model marked, and a button per model (one row of up to three)."""
    answering = await s.models.of(address)
    current = answering.model
    lines = [t("model_header", lang)]
    for model in s.models.models.entries:
        mark = "✓" if current is not None and model.name == current.name else "•"
        lines.append(f"{mark} {_shown(model, lang)}")
    if answering.fallback:
        lines.append(t("model_gone", lang, chosen=answering.chosen, name=current.name if current else "?"))
    lines.append(t("model_hint", lang))
    buttons = [{"text": ("✓ " if current is not None and m.name == current.name else "") + m.name,
                "callback_data": f"{PREFIX}{m.name}@{address}"} for m in s.models.models.entries]
    rows = [buttons[i:i + 3] for i in range(0, len(buttons), 3)]
    return "\n".join(lines), rows or None


async def switch(s: Services, address: str, name: str, user: int, lang: str) -> tuple[str, bool]:
    """The chat answers on ``name`` from its next turn (in the caller's transaction, with its
    dedupe mark): the line to say, and whether a compaction was captured (the caller wakes the
    chat once it committed). D3: a conversation that no longer fits the new model's threshold is
    compacted before its next turn."""
    before = (await s.models.of(address)).model
    model = await s.models.choose(address, name, set_by=user)
    if model is None:
        return t("model_unknown", lang, name=name[:40], names=", ".join(s.models.models.names)), False
    text = t("model_same" if before == model else "model_switched", lang, model=_shown(model, lang))
    chat = await s.store.chat(address)
    threshold = await s.threshold(address)
    if chat is None or chat.measurement is None or chat.measurement < threshold or s.requests.outstanding(address):
        return text, False  # fits; or a compact request of ours is in flight already (C5)
    if await s.transitions.capture_for_window(address, before=chat.measurement, threshold=threshold) is None:
        return text, False  # busy: the turn's parking measures against the new threshold
    logger.info("model_switch_compacts_first", measurement=chat.measurement, threshold=threshold)
    return text + "\n" + t("model_compact_first", lang, size=number(chat.measurement),
                           threshold=number(threshold)), True


async def model_command(s: Services, scheduler: Scheduler, message: Message, address: Address, lang: str,
                        key: str, args: str) -> str:
    addr = str(address)
    private = message.chat.type == "private"
    asker = message.from_user.id if message.from_user is not None else 0
    rows = None
    if not await s.people.is_owner(asker):
        text = t("model_owner_only", lang)
    elif not s.models.enabled:
        text = t("model_none", lang)
    elif args.split():
        async with s.store.db.transaction():
            # The switch, its answer and the mark commit together: done once, whatever Telegram redelivers.
            if not await s.queue.remember(addr, {"kind": "command", "command": "model"}, dedupe_key=key):
                return "duplicate"
            text, captured = await switch(s, addr, args.split()[0].lower(), asker, lang)
            await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", text,
                                  reply_to=message.message_id, markdown=False,
                                  receiver=None if private else asker)
        if captured:
            scheduler.wake(addr)
        return "command"
    else:
        text, rows = await model_text(s, addr, lang)
    async with s.store.db.transaction():
        # The answer is on disk with the mark that says the update was handled.
        if not await s.queue.remember(addr, {"kind": "command", "command": "model"}, dedupe_key=key):
            return "duplicate"
        await s.store.put_outgoing(addr, f"re:{key}", address.chat_id, address.thread_id, text, format="plain",
                                   reply_to=message.message_id, markup=rows, receiver=None if private else asker)
    return "command"


async def model_pressed(s: Services, scheduler: Scheduler, query: CallbackQuery, name: str, address: str,
                        lang: str) -> str:
    """A model's button: an owner's press switches the conversation the list was for (once,
    whatever Telegram redelivers); anyone else's is refused. The note to show the presser."""
    if not await s.people.is_owner(query.from_user.id):
        return t("model_owner_only", lang)
    if not s.models.enabled:
        return t("model_none", lang)
    try:
        address = str(Address.parse(address))
    except ValueError:
        return t("model_none", lang)
    async with s.store.db.transaction():
        if not await s.queue.remember(address, {"kind": "model", "name": name}, dedupe_key=f"cb:{query.id}"):
            return "✓"
        text, captured = await switch(s, address, name, query.from_user.id, lang)
    if captured:
        scheduler.wake(address)
    return text[:190]  # a press's answer holds 200 characters
