"""Telegram → the on-disk queue (T1, T2).

Our own getUpdates loop: each update is committed before the offset passes it, so an update is
confirmed to Telegram only once its message is on disk. A commit that fails is retried and the
offset does not move; a redelivered update is absorbed by the dedupe key (chat id + message id).
Ingest does as little as possible: decide, commit, receipt, wake the chat.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import json
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from aiogram import Bot
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.types import CallbackQuery, Message, Update, User

from diskqueue import DiskQueue

from . import log
from .addressing import Address, classify
from .config import Settings
from .metrics import METRICS
from .notebook import Notebook
from .sender import Sender
from .store import Store
from .texts import pick_lang, t
from .worker import ManualCompaction, Scheduler

__all__ = ["Ingest"]

logger = log.get("bridge.ingest")

POLL_TIMEOUT = 25
ALLOWED_UPDATES = ["message", "callback_query", "my_chat_member"]
RECEIPT_QUEUED = "👀"
RECEIPT_STEERED = "⚡"


class Ingest:
    def __init__(
        self,
        *,
        bot: Bot,
        me: User,
        settings: Settings,
        queue: DiskQueue,
        store: Store,
        sender: Sender,
        scheduler: Scheduler,
        status_text: Callable[[str, str], Any],
        spawn: Callable[..., Any],
        heartbeat: Callable[[], None] = lambda: None,
        notebook: Notebook | None = None,
    ) -> None:
        self.notebook = notebook
        self.bot = bot
        self.me = me
        self.settings = settings
        self.queue = queue
        self.store = store
        self.sender = sender
        self.scheduler = scheduler
        self.wake = scheduler.wake
        self.status_text = status_text
        self.spawn = spawn
        self.heartbeat = heartbeat
        self.offset: int | None = None
        self.last_poll_ok: float | None = None
        self.alive_at = time.monotonic()  # the loop went round (the watchdog reads it)

    async def run(self) -> None:
        """Poll forever; only cancellation ends it."""
        failures = 0
        while True:
            self.alive_at = time.monotonic()
            try:
                updates = await self.bot.get_updates(
                    offset=self.offset,
                    timeout=POLL_TIMEOUT,
                    allowed_updates=ALLOWED_UPDATES,
                    request_timeout=POLL_TIMEOUT + 15,
                )
            except TelegramRetryAfter as exc:
                await asyncio.sleep(exc.retry_after)
                continue
            except ClientDecodeError as exc:
                # One update aiogram cannot validate (a newer Bot API, a broken proxy) must not
                # wedge every chat: take the batch apart and handle what can be handled.
                updates = self._salvage(exc)
                if updates is None:
                    failures += 1
                    logger.error("telegram_poll_undecodable", error=exc.message[:300])
                    await asyncio.sleep(min(30.0, 0.5 * 1.6**failures))
                    continue
            except (TelegramNetworkError, TelegramServerError) as exc:
                failures += 1
                wait = min(30.0, 0.5 * 1.6**failures) + random.uniform(0, 0.3)
                logger.warning("telegram_poll_failed", error=str(exc), wait=round(wait, 2))
                await asyncio.sleep(wait)
                continue
            failures = 0
            self.last_poll_ok = time.time()
            self.heartbeat()
            for update in updates:
                if isinstance(update, int):  # an update we could not decode, logged by _salvage
                    self.offset = update + 1
                    continue
                await self.commit_update(update)
                self.offset = update.update_id + 1
                self.alive_at = time.monotonic()

    def _salvage(self, exc: ClientDecodeError) -> list[Update | int] | None:
        """The updates of a batch that failed validation, one by one; an undecodable one stays
        as its bare update_id so the offset can pass it (it is logged, never silently)."""
        data = exc.data
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            return None
        out: list[Update | int] = []
        for raw in data["result"]:
            update_id = raw.get("update_id") if isinstance(raw, dict) else None
            if not isinstance(update_id, int):
                continue
            try:
                out.append(Update.model_validate(raw, context={"bot": self.bot}))
            except ValueError as error:
                logger.error("telegram_update_undecodable", update_id=update_id, error=str(error)[:300])
                METRICS.updates.labels(outcome="undecodable").inc()
                out.append(update_id)
        return out

    async def commit_update(self, update: Update) -> None:
        """Handle one update until it is durable; only then may the offset pass it."""
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(update_id=update.update_id)
        attempt = 0
        while True:
            try:
                outcome = await self.handle(update)
                METRICS.updates.labels(outcome=outcome).inc()
                return
            except sqlite3.OperationalError as exc:
                # The disk or the lock: the update stays unconfirmed; we retry, and if we die
                # Telegram redelivers it. (Other sqlite3 errors are bugs, handled below.)
                attempt += 1
                wait = min(10.0, 0.2 * 2**attempt)
                logger.error("ingest_commit_failed", error=str(exc), wait=wait)
                await asyncio.sleep(wait)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug on one update must not wedge the bot; the operator sees it here.
                logger.exception("ingest_update_failed")
                METRICS.updates.labels(outcome="error").inc()
                return

    async def handle(self, update: Update) -> str:
        if update.message is not None:
            return await self.on_message(update.message)
        if update.callback_query is not None:
            return await self.on_callback(update.callback_query)
        if update.my_chat_member is not None:
            member = update.my_chat_member
            if member.new_chat_member.status in ("kicked", "left"):
                async with self.store.db.transaction():
                    await self.store.db.execute(
                        "UPDATE chats SET blocked = 1, blocked_reason = ? WHERE chat_id = ?",
                        (member.new_chat_member.status, member.chat.id),
                    )
                    if self.notebook is not None and self.notebook.enabled:
                        await self.notebook.delete_chat(member.chat.id)  # N8: the notes go with the chat
                logger.info("bot_removed_from_chat", chat_id=member.chat.id)
            return "member"
        return "ignored"

    async def on_callback(self, query: CallbackQuery) -> str:
        """T5: a pressed option button becomes an inputResponse for the waiting turn."""
        note: str | None = None
        outcome = "callback"
        try:
            kind, _, rest = (query.data or "").partition(":")
            if kind != "in" or not self.settings.may_talk(query.from_user.id):
                return "ignored"
            prompt_id, _, index = rest.partition(":")
            prompt = await self.store.prompt(int(prompt_id))
            lang = pick_lang(query.from_user.language_code, self.settings.lang)
            if prompt is None or prompt["state"] != "open":
                note = t("input_closed", lang)
                return "closed"
            option = json.loads(prompt["options"])[int(index)]
            message_id = query.message.message_id if query.message is not None else 0
            row = await self.queue.enqueue(
                prompt["address"],
                {"kind": "input", "request_id": prompt["request_id"], "option_id": option, "message_id": message_id,
                 "user_id": query.from_user.id},
                dedupe_key=f"cb:{query.id}",
            )
            if row is not None:
                self.wake(prompt["address"])
            note = "✓"
            return outcome
        except (ValueError, IndexError):
            return "ignored"
        finally:
            try:
                await self.bot.answer_callback_query(query.id, text=note)
            except Exception as exc:
                logger.info("callback_answer_failed", error=str(exc))

    async def on_message(self, message: Message) -> str:
        user = message.from_user
        if user is None or user.is_bot:
            return "ignored"
        inbound = classify(message, self.me)
        address = inbound.address
        structlog.contextvars.bind_contextvars(chat_id=address.chat_id, thread_id=address.thread_id, msg_id=message.message_id)
        if not inbound.addressed:
            return "not_addressed"
        if not self.settings.may_talk(user.id):
            logger.info("stranger_ignored", user_id=user.id)
            return "stranger"
        lang = pick_lang(user.language_code, self.settings.lang)
        key = f"tg:{message.chat.id}:{message.message_id}"
        if inbound.command == "compact":
            return await self.on_compact(message, address, lang, key)
        if inbound.command == "notes":
            return await self.on_notes(message, address, lang, key, inbound.command_args)
        if inbound.command in ("start", "help", "status", "new"):
            return await self.on_command(inbound.command, message, address, lang, key)
        attachment = self._attachment(message)
        limit = self.settings.max_file_mb
        refusal = None
        if attachment is not None and (attachment["size"] or 0) > limit * 1024 * 1024:
            refusal = t("file_too_big", lang, size=round(attachment["size"] / 1024 / 1024, 1), limit=limit)
        elif attachment is None and (not inbound.text or not inbound.text.strip()):
            refusal = t("unsupported", lang)  # T8: a short clear answer, never silence
        if refusal is not None:
            if await self.queue.remember(str(address), {"kind": "refused"}, dedupe_key=key):
                self.spawn(self.sender.say(address.chat_id, address.thread_id, refusal, reply_to=message.message_id))
            return "refused"
        payload = {
            "kind": "message",
            "text": inbound.text or "",
            "attachment": attachment,
            "message_id": message.message_id,
            "user_id": user.id,
            "user_name": user.full_name,
            "owner": user.id in self.settings.owner_ids,
            "private": inbound.private,
            "date": int(message.date.timestamp()) if message.date else None,
        }
        notice = False
        async with self.store.db.transaction():
            await self.store.touch_chat(str(address), address.chat_id, address.thread_id, lang)
            row = await self.queue.enqueue(str(address), payload, dedupe_key=key)
            chat = await self.store.chat(str(address))
            queue_policy = self.settings.turn_policy == "queue"
            if row is not None and chat is not None and chat.busy and chat.kind == "compact" and queue_policy \
                    and not chat.compact_notified:
                # C3: once per compaction per chat, in the same transaction as the message.
                await self.store.update_chat(str(address), compact_notified=1)
                notice = True
        if row is None:
            logger.info("update_duplicate_ignored")
            return "duplicate"
        logger.info("message_queued", queue_id=row)
        logger.debug("message_text", text=inbound.text)
        if notice:
            self.spawn(self.sender.say(address.chat_id, address.thread_id, t("compacting_notice", lang),
                                       reply_to=message.message_id))
        elif chat is not None and chat.busy and queue_policy and not chat.waiting_input:
            # The receipt comes after the commit, never before: "received, waiting its turn".
            self.spawn(self.sender.react(address.chat_id, message.message_id, RECEIPT_QUEUED))
        self.wake(str(address))
        return "queued"

    @staticmethod
    def _attachment(message: Message) -> dict[str, Any] | None:
        """T8: a photo (its largest size) or a document, as a reference the worker downloads."""
        if message.photo:
            photo = message.photo[-1]
            return {"file_id": photo.file_id, "size": photo.file_size, "mime": "image/jpeg",
                    "name": f"photo-{message.message_id}.jpg"}
        if message.document is not None:
            doc = message.document
            return {"file_id": doc.file_id, "size": doc.file_size, "mime": doc.mime_type or "application/octet-stream",
                    "name": doc.file_name or f"file-{message.message_id}"}
        return None

    async def on_compact(self, message: Message, address: Address, lang: str, key: str) -> str:
        """M1-M5: /compact takes the chat the way parking does, through eve's own route."""
        addr = str(address)
        scheduler = self.scheduler
        reply = functools.partial(self.sender.say, address.chat_id, address.thread_id, reply_to=message.message_id)
        if addr in scheduler.manual_marks:
            # M4: the mark is set before the first await, so a second /compact sees it.
            self.spawn(reply(t("compact_already", lang)))
            return "command"
        scheduler.manual_marks.add(addr)
        captured = False
        try:
            minimum = self.settings.manual_compact_min
            async with self.store.db.transaction():
                # The dedupe mark and the capture commit together: a failure leaves neither.
                if not await self.queue.remember(addr, {"kind": "command", "command": "compact"}, dedupe_key=key):
                    return "duplicate"
                chat = await self.store.chat(addr)
                worker = scheduler.workers.get(addr)
                if worker is not None and worker.compact_outstanding:
                    text = t("compact_already", lang)  # C5: eve has not answered the last request yet
                elif chat is not None and chat.busy:
                    text = t("compact_already" if chat.kind == "compact" else "compact_after_answer", lang)
                elif (chat is None or not chat.eve_session or chat.reset_mark or chat.measurement is None
                      or chat.measurement < minimum):
                    text = t("compact_nothing", lang)  # M2: small or unknown
                else:
                    before = chat.measurement
                    captured = await self.store.capture(
                        addr, kind="compact", origin="manual", claim=uuid.uuid4().hex, deliveries=[],
                        compact_notified=0, compact_before=before,
                    )
                    text = (t("compact_accepted", lang, before=f"{before:,}".replace(",", " ")) if captured
                            else t("compact_after_answer", lang))  # M3: a turn took the chat first
            if captured:
                scheduler.manual[addr] = ManualCompaction(lang=lang, reply_to=message.message_id, before=before)
                self.wake(addr)
            self.spawn(reply(text))
            return "command"
        finally:
            if not captured:
                scheduler.manual_marks.discard(addr)

    async def on_notes(self, message: Message, address: Address, lang: str, key: str, args: str) -> str:
        """N9 in Telegram: the owner lists the notebook with what changed since the last look, or
        reads one note with its last change."""
        addr = str(address)
        if not await self.queue.remember(addr, {"kind": "command", "command": "notes"}, dedupe_key=key):
            return "duplicate"
        notebook = self.notebook
        assert message.from_user is not None
        if notebook is None or not notebook.enabled:
            text = t("notes_off", lang)
        elif message.from_user.id not in self.settings.owner_ids:
            text = t("notes_owner_only", lang)
        elif args:
            text = await self._note_text(notebook, addr, args.split()[0].lower(), lang)
        else:
            text = await self._notebook_text(notebook, addr, lang)
        if message.chat.type != "private" and notebook is not None and notebook.enabled \
                and message.from_user.id in self.settings.owner_ids:
            # A group's notebook is the owner's business: it goes to the owner's private chat.
            self.spawn(self._notes_privately(message, address, lang, text))
            return "command"
        # Plain text: a note is shown as written, and a diff's "-"/"+" lines are not list bullets.
        self.spawn(self.sender.say(address.chat_id, address.thread_id, text, reply_to=message.message_id,
                                   markdown=False))
        return "command"

    async def _notes_privately(self, message: Message, address: Address, lang: str, text: str) -> None:
        assert message.from_user is not None
        title = message.chat.title or str(address.chat_id)
        sent = await self.sender.say(message.from_user.id, None, f"{title}\n{text}", markdown=False)
        note = t("notes_sent_privately" if sent else "notes_start_private", lang)
        await self.sender.say(address.chat_id, address.thread_id, note, reply_to=message.message_id)

    async def _notebook_text(self, notebook: Notebook, addr: str, lang: str) -> str:
        notes = await notebook.notes(addr)
        if not notes:
            return t("notes_empty", lang)
        seen = await notebook.seen_at(addr)
        chat = await self.store.chat(addr)
        new = [n for n in notes if seen is None or n.created_at > seen]
        changed = [n for n in notes if n not in new and seen is not None and n.updated_at > seen]
        lines = [t("notes_header", lang, n=len(notes), chars=sum(len(n.body) for n in notes),
                   mode=chat.notes_mode if chat else "inline", new=len(new), changed=len(changed))]
        for n in notes:
            mark = "🆕" if n in new else "✏️" if n in changed else "•"
            pin = " 📌" if n.pinned else ""
            lines.append(f"{mark} {n.name}{pin} — {n.description}")
        lines.append(t("notes_hint", lang))
        await notebook.mark_seen(addr)  # a look: every client shares this server-side mark
        return "\n".join(lines)

    async def _note_text(self, notebook: Notebook, addr: str, name: str, lang: str) -> str:
        note = await notebook.note(addr, name)
        if note is None:
            return t("notes_missing", lang, name=name)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(note.updated_at))
        pin = f" · {t('notes_pinned', lang)}" if note.pinned else ""
        lines = [f"📝 {note.name} — {note.description}{pin} · {t('notes_updated', lang)} {when}", "", note.body, "",
                 t("notes_changed", lang)]
        if note.prev_body is None:
            lines.append(t("notes_unchanged", lang))
        else:
            diff = [d for d in difflib.ndiff(note.prev_body.splitlines(), note.body.splitlines()) if d[:1] in "+-"]
            lines.extend(diff[:60] or [t("notes_unchanged", lang)])
        return "\n".join(lines)

    async def on_command(self, command: str, message: Message, address: Address, lang: str, key: str) -> str:
        addr = str(address)
        if command == "new":
            async with self.store.db.transaction():
                if not await self.queue.remember(addr, {"kind": "command", "command": "new"}, dedupe_key=key):
                    return "duplicate"
                await self.store.touch_chat(addr, address.chat_id, address.thread_id, lang)
                dropped = await self.queue.drop_queued(addr)
                chat = await self.store.chat(addr)
                assert chat is not None
                await self.store.update_chat(
                    addr, reset_requested=1, reset_reply_to=message.message_id,
                    reset_dropped=chat.reset_dropped + dropped,
                )
            logger.info("new_requested", dropped=dropped)
            self.wake(addr)
            return "command"
        if not await self.queue.remember(addr, {"kind": "command", "command": command}, dedupe_key=key):
            return "duplicate"
        if command == "status":
            text = await self.status_text(addr, lang)
        else:
            text = t(command, lang)
        self.spawn(self.sender.say(address.chat_id, address.thread_id, text))
        return "command"
