"""Telegram → the on-disk queue (T1, T2).

Our own getUpdates loop: each update is committed before the offset passes it, so an update is
confirmed to Telegram only once its message is on disk. A commit that fails is retried and the
offset does not move; a redelivered update is absorbed by the dedupe key (chat id + message id;
an edit's adds its edit date, :mod:`.edits`).
Ingest does as little as possible: decide, commit, receipt, wake the chat.
"""

from __future__ import annotations

import asyncio
import dataclasses
import mimetypes
import sqlite3
import time

import structlog
from aiogram import Bot
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramConflictError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.types import Message, Update, User

from .. import backoff, log
from ..chat.services import Services
from ..chat.worker import Scheduler
from ..clock import CLOCK
from ..metrics import METRICS
from ..people import Role
from ..storage import outbox
from ..storage.marks import AlbumHeld, AlbumMark, RefusedMark, remember
from ..storage.payloads import (
    Attachment,
    QueuedMessage,
    Spoken,
)
from ..storage.state import StateCorrupt, corrupt
from ..storage.store import Chat
from ..telegram.texts import pick_lang, t
from .addressing import Address, Inbound, classify
from .buttons import Buttons
from .commands import Commands
from .describe import describe, quoted
from .edits import commit_edit, edit_key, message_key

__all__ = ["Ingest"]

logger = log.get(__name__)

POLL_TIMEOUT = 25
BATCH_LIMIT = 100  # updates in one getUpdates answer, at most (Telegram's default limit)
EMPTY_POLL_FLOOR = 0.5  # seconds between two empty answers to a long poll, at least
ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "my_chat_member", "stopped_message_generation"]
RECEIPT_QUEUED = "👀"
RECEIPT_STEERED = "⚡"


def _album_key(chat_id: int, media_group_id: str) -> str:
    """The mark that an album of this chat was taken (its other parts need no mention)."""
    return f"album:{chat_id}:{media_group_id}"


class Ingest:
    def __init__(self, *, services: Services, me: User, scheduler: Scheduler, commands: Commands) -> None:
        self.s = services
        self.bot: Bot = services.sender.bot
        self.me = me
        self.settings = services.settings
        self.queue = services.queue
        self.store = services.store
        self.sender = services.sender
        self.transitions = services.transitions
        self.commands = commands
        self.wake = scheduler.wake
        self.spawn = services.spawn
        self.buttons = Buttons(services, commands, scheduler.wake)
        self.offset: int | None = None
        self.last_poll_ok: float | None = None
        self.alive_at = time.monotonic()  # the loop went round (the watchdog reads it)
        self.storage_error: str | None = None  # the last commit failed (disk, lock): /healthz says it

    async def leave_webhook(self) -> None:
        """O1: polling after webhook mode. A webhook still set makes getUpdates answer 409,
        so it is deleted first — without dropping what Telegram holds, which getUpdates then hands
        over (switching modes loses nothing). A server that cannot say (an emulator without
        getWebhookInfo) is logged and polled anyway: a webhook would show as poll conflicts."""
        failures = 0
        while True:
            try:
                info = await self.bot.get_webhook_info(request_timeout=30)
                if info.url:
                    await self.bot.delete_webhook(drop_pending_updates=False, request_timeout=30)
                    logger.info("telegram_webhook_deleted", pending=info.pending_update_count)
                return
            except TelegramRetryAfter as exc:
                await asyncio.sleep(exc.retry_after)
            except (TelegramNetworkError, TelegramServerError) as exc:
                failures += 1
                wait = backoff.POLL.delay(failures)
                logger.warning("telegram_webhook_check_failed", error=str(exc), wait=round(wait, 2))
                await asyncio.sleep(wait)
            except (asyncio.CancelledError, StateCorrupt):
                raise
            except Exception as exc:
                logger.warning("telegram_webhook_check_failed", error=str(exc)[:300], wait=None)
                return

    async def run(self) -> None:
        """Poll forever; only cancellation ends it."""
        await self.leave_webhook()
        failures = 0
        caught_up = False
        while True:
            self.alive_at = time.monotonic()
            asked = time.monotonic()
            try:
                # The first poll does not wait: what Telegram held while we were down comes at
                # once, and after it we know we have caught up (an album's settling counts from
                # then: a part redelivered after a restart is committed by then).
                updates: list[Update | int] = await self.bot.get_updates(  # type: ignore[assignment]
                    offset=self.offset,
                    timeout=POLL_TIMEOUT if caught_up else 0,
                    allowed_updates=ALLOWED_UPDATES,
                    request_timeout=POLL_TIMEOUT + 15,
                )
            except TelegramRetryAfter as exc:
                await asyncio.sleep(exc.retry_after)
                continue
            except ClientDecodeError as exc:
                # One update aiogram cannot validate (a newer Bot API, a broken proxy) must not
                # wedge every chat: take the batch apart and handle what can be handled.
                salvaged = self._salvage(exc)
                if salvaged is None:
                    failures += 1
                    logger.error("telegram_poll_undecodable", error=exc.message[:300])
                    await asyncio.sleep(backoff.POLL.delay(failures))
                    continue
                updates = salvaged
            except TelegramConflictError as exc:
                # Another process polls this bot, or a webhook is set: keep trying (slowly) and
                # let /healthz say polling is stale; never crash the service over it.
                failures += 1
                wait = backoff.POLL.delay(failures)
                logger.error("telegram_poll_conflict", error=exc.message[:300], wait=round(wait, 2))
                await asyncio.sleep(wait)
                continue
            except (TelegramNetworkError, TelegramServerError) as exc:
                failures += 1
                wait = backoff.POLL.delay(failures)
                logger.warning("telegram_poll_failed", error=str(exc), wait=round(wait, 2))
                await asyncio.sleep(wait)
                continue
            failures = 0
            self.last_poll_ok = CLOCK.now()  # steady (F9): a forward step is not a stale poll
            if not updates and caught_up and time.monotonic() - asked < EMPTY_POLL_FLOOR:
                # A server that answers a long poll at once (an emulator, a proxy) must not make
                # us ask thousands of times a second.
                await asyncio.sleep(EMPTY_POLL_FLOOR - (time.monotonic() - asked))
            for update in updates:
                if isinstance(update, int):  # an update we could not decode, logged by _salvage
                    self.offset = update + 1
                    continue
                await self.commit_update(update)
                self.offset = update.update_id + 1
                self.alive_at = time.monotonic()
            if not caught_up and len(updates) < BATCH_LIMIT:  # a full batch: more are waiting
                caught_up = True
                self.transitions.caught_up()

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
                self.storage_error = None
                return
            except sqlite3.DatabaseError as exc:
                if corrupt(exc):
                    # The file is bad: nothing can be stored, so nothing may be confirmed. The
                    # bridge stops; the restart's check moves the file aside, Telegram
                    # redelivers this update (before, the offset passed it: lost).
                    logger.error("state_database_corrupt", error=str(exc))
                    raise StateCorrupt(str(exc)) from exc
                if not isinstance(exc, sqlite3.OperationalError):
                    # A constraint or a misuse: a bug on one update, which must not wedge the bot.
                    logger.exception("ingest_update_failed")
                    METRICS.updates.labels(outcome="error").inc()
                    return
                # The disk or the lock: the update stays unconfirmed; we retry, and if we die
                # Telegram redelivers it.
                attempt += 1
                wait = backoff.COMMIT.delay(attempt)
                logger.error("ingest_commit_failed", error=str(exc), wait=wait)
                self.storage_error = str(exc)
                await asyncio.sleep(wait)
                # Waiting on storage is not a wedged loop (F2): the watchdog keeps being fed, so
                # a full disk is not a restart every WatchdogSec (each resending what it could
                # not record); a commit that hangs does not come back here and is still caught.
                self.alive_at = time.monotonic()
            except (asyncio.CancelledError, StateCorrupt):
                raise
            except Exception:
                # A bug on one update must not wedge the bot; the operator sees it here.
                logger.exception("ingest_update_failed")
                METRICS.updates.labels(outcome="error").inc()
                return

    async def handle(self, update: Update) -> str:
        """One update, committed; what its commits write into the outbox is sent in tasks of
        their own (the update is confirmed without waiting on Telegram)."""
        with outbox.detached():
            return await self._handle(update)

    async def _handle(self, update: Update) -> str:
        if update.message is not None:
            return await self.on_message(update.message)
        if update.edited_message is not None:
            return await self.on_edit(update.edited_message)
        if update.callback_query is not None:
            return await self.buttons.on_callback(update.callback_query)
        if update.stopped_message_generation is not None:
            return await self.buttons.on_stop_button(update)
        if update.my_chat_member is not None:
            member = update.my_chat_member
            if member.new_chat_member.status in ("kicked", "left"):
                async with self.store.db.transaction():
                    await self.transitions.bot_removed(member.chat.id, member.new_chat_member.status)
                    if self.s.notebook is not None and member.chat.type != "private":
                        # N8: the bot is out of the group: the notes go with it (the archive stays,
                        # for the owner's restore). A person blocking the bot in a private chat
                        # has not deleted the chat: the notebook waits for them (S-review).
                        await self.s.notebook.delete_chat(member.chat.id)
                logger.info("bot_removed_from_chat", chat_id=member.chat.id)
            return "member"
        return "ignored"

    async def on_message(self, message: Message) -> str:
        user = message.from_user
        if user is None or user.is_bot:
            return "ignored"
        inbound = classify(message, self.me)
        address = inbound.address
        structlog.contextvars.bind_contextvars(chat_id=address.chat_id, thread_id=address.thread_id,
                                               msg_id=message.message_id)
        album = _album_key(message.chat.id, message.media_group_id) if message.media_group_id is not None else None
        if not inbound.addressed and album is not None and \
                any(row.dedupe_key == album for row in await self.queue.history(album)):
            # A group album addresses the bot by its caption's mention, on one part only: the
            # other parts of an album we took are ours too.
            inbound = dataclasses.replace(inbound, addressed=True)
        # A part of a group album that does not (yet) address the bot is held: the mention may be
        # on a later part's caption (Telegram lets every part have one), and then it is ours too.
        hold = not inbound.addressed and album is not None and not inbound.private
        if not inbound.addressed and not hold:
            return "not_addressed"
        lang = pick_lang(user.language_code, self.settings.lang)
        key = message_key(message.chat.id, message.message_id)
        if inbound.private and inbound.command == "start" and inbound.command_args:
            # A one-time link opened (P1, P2): the only thing a stranger is answered.
            return await self.commands.redeem(message, address, lang, key, inbound.command_args)
        role = await self.s.people.role(user.id)
        if role is None:
            logger.info("stranger_ignored", user_id=user.id)
            return "stranger"
        if inbound.command in ("compact", "notes", "start", "help", "status", "new", "stop", "invite", "users",
                               "topic", "reminders", "model"):
            return await self.commands.handle(inbound.command, message, address, lang, key, inbound.command_args)
        prepared = self._prepare(message, inbound, user, lang, owner=role is Role.OWNER)
        if isinstance(prepared, str) and not hold:
            return await self._refuse(address, key, message.message_id, prepared)
        if hold:
            assert album is not None
            # Held: what it will be once the album is ours — a part, or the one line refusing it
            # (a video in the album is refused then, never dropped without a word).
            held = (AlbumHeld(message.message_id, refusal=prepared) if isinstance(prepared, str)
                    else AlbumHeld(message.message_id, item=prepared.to_payload()))
            async with self.store.db.transaction():
                await remember(self.queue, address, held, dedupe_key=f"{album}:held:{message.message_id}")
            return "album_part_held"
        assert not isinstance(prepared, str)
        async with self.store.db.transaction():
            await self.transitions.touch(str(address), address.chat_id, address.thread_id, lang)
            if album is not None and not await self.queue.history(key):
                await self._take_album(address, album)  # the parts before it go first, in order
            row = await self.queue.enqueue(str(address), prepared.to_payload(), dedupe_key=key)
            notice = await self._notice(address, key, message.message_id, lang) if row is not None else False
            chat = await self.store.chat(str(address))
        if row is None:
            logger.info("update_duplicate_ignored")
            return "duplicate"
        logger.info("message_queued", queue_id=row)
        logger.debug("message_text", text=prepared.text)
        self._received(address, message.message_id, chat, notice)
        return "queued"

    async def on_edit(self, message: Message) -> str:
        """I2: an edited message, by the rule of :mod:`bridge.intake.edits` (replaced while it
        waits, a correction once eve has it, nothing when nothing changed). Who may talk and
        what addresses the bot are the same as for a message."""
        user = message.from_user
        if user is None or user.is_bot:
            return "ignored"
        if message.location is not None:
            # A live location moves by edits every few seconds; a location is no correction.
            return "location_moved"
        inbound = classify(message, self.me)
        address = inbound.address
        structlog.contextvars.bind_contextvars(chat_id=address.chat_id, thread_id=address.thread_id,
                                               msg_id=message.message_id, edit_date=message.edit_date)
        if not inbound.addressed:
            return "not_addressed"
        role = await self.s.people.role(user.id)
        if role is None:
            logger.info("stranger_ignored", user_id=user.id)
            return "stranger"
        if inbound.command is not None:
            logger.info("edited_command_ignored", command=inbound.command)
            return "edit_ignored"
        lang = pick_lang(user.language_code, self.settings.lang)
        prepared = self._prepare(message, inbound, user, lang, owner=role is Role.OWNER)
        original = message_key(message.chat.id, message.message_id)
        if isinstance(prepared, str):
            key = f"{original}:e{message.edit_date or 0}"
            return await self._refuse(address, key, message.message_id, prepared)
        key = edit_key(message.chat.id, message.message_id, message.edit_date, prepared)
        async with self.store.db.transaction():
            await self.transitions.touch(str(address), address.chat_id, address.thread_id, lang)
            outcome, row = await commit_edit(self.queue, self.store, str(address), original=original, key=key,
                                             item=prepared)
            if row is not None and prepared.album is not None and not prepared.private:
                # A held part of a group album edited to address the bot: the album is ours now,
                # with the parts held beside it.
                album = _album_key(message.chat.id, prepared.album)
                await self._take_album(address, album, but=message.message_id)
            notice = await self._notice(address, key, message.message_id, lang) if row is not None else False
            chat = await self.store.chat(str(address))
        logger.info("message_edited", outcome=str(outcome), queue_id=row)
        if row is not None:
            self._received(address, message.message_id, chat, notice)
        return str(outcome)

    async def _take_album(self, address: Address, album: str, *, but: int | None = None) -> None:
        """Inside the caller's transaction: the album is ours (its mark: its later parts need no
        mention), and the parts of it held before anything of it addressed the bot are queued in
        their order (each under its own message's key: a redelivery of one of them is a
        duplicate), or refused in one line each (sent after the commit)."""
        await remember(self.queue, address, AlbumMark(), dedupe_key=album)
        for row in await self.queue.history(album):
            held = AlbumHeld.from_payload(row.payload)
            if held is None or row.address != str(address) or held.message_id == but:
                continue
            key = message_key(address.chat_id, held.message_id)
            if held.item is not None:
                await self.queue.enqueue(str(address), held.item, dedupe_key=key)
            elif await remember(self.queue, address, RefusedMark(), dedupe_key=key):
                await self.s.outbox.say_to(str(address), address.chat_id, address.thread_id, f"re:{key}",
                                           str(held.refusal), reply_to=held.message_id)

    def _prepare(self, message: Message, inbound: Inbound, user: User, lang: str, *,
                 owner: bool) -> QueuedMessage | str:
        """The message as it waits in the queue, or the short answer that refuses it (T8)."""
        attachment = self._attachment(message) or self._spoken(message, self.settings.voice.mode)
        # A recording or video we do not take is refused even with a caption: it is never dropped
        # silently behind its caption.
        recorded = (message.voice, message.audio, message.video_note, message.video)
        untaken = attachment is None and any(m is not None for m in recorded)
        text = inbound.text or ""
        shared = describe(message)  # a location, contact, poll… goes as text (its caption after it)
        if shared is not None:
            text = f"{shared}\n{text}" if text.strip() else shared
        reply = quoted(message, self.me)
        # A bare mention replying to a message ("@iva" under a photo) asks about that message.
        bare_reply = reply is not None and message.text is not None
        limit = self.settings.telegram.max_file_mb
        if attachment is not None and (attachment.size or 0) > limit * 1024 * 1024:
            return t("file_too_big", lang, size=round((attachment.size or 0) / 1024 / 1024, 1), limit=limit)
        if attachment is None and (untaken or (not text.strip() and not bare_reply)):
            # T8: a short clear answer, never silence
            return t("unsupported" if self.settings.voice.mode == "refuse" else "unsupported_voice", lang)
        return QueuedMessage(
            text=text,
            attachment=attachment,
            reply=reply,
            message_id=message.message_id,
            user_id=user.id,
            user_name=user.full_name,
            owner=owner,
            private=inbound.private,
            date=int(message.date.timestamp()) if message.date else None,
            album=message.media_group_id,
        )

    async def _refuse(self, address: Address, key: str, message_id: int, refusal: str) -> str:
        async with self.store.db.transaction():
            fresh = await remember(self.queue, address, RefusedMark(), dedupe_key=key)
            if fresh:  # the answer on disk with the mark: a crash cannot lose it
                await self.s.outbox.say_to(str(address), address.chat_id, address.thread_id, f"re:{key}",
                                           refusal, reply_to=message_id)
        return "refused"

    async def _notice(self, address: Address, key: str, message_id: int, lang: str) -> bool:
        """C3: once per compaction per chat, in the same transaction as the message."""
        if self.settings.chat.turn_policy != "queue" or not await self.transitions.notify_compacting(str(address)):
            return False
        await self.s.outbox.say_to(str(address), address.chat_id, address.thread_id, f"c3:{key}",
                                   t("compacting_notice", lang), reply_to=message_id)
        return True

    def _received(self, address: Address, message_id: int, chat: Chat | None, notice: bool) -> None:
        """After the commit: the receipt (unless the commit wrote the C3 notice, which it sends), and
        the chat's worker woken."""
        if (not notice and chat is not None and chat.busy and self.settings.chat.turn_policy == "queue"
                and not chat.waiting_input):
            # The receipt comes after the commit, never before: "received, waiting its turn".
            self.spawn(self.sender.react(address.chat_id, message_id, RECEIPT_QUEUED))
        self.wake(str(address))

    @staticmethod
    def _attachment(message: Message) -> Attachment | None:
        """T8: a photo (its largest size) or a document, as a reference the worker downloads."""
        if message.photo:
            photo = message.photo[-1]
            return Attachment(file_id=photo.file_id, size=photo.file_size, mime="image/jpeg",
                              name=f"photo-{message.message_id}.jpg")
        if message.document is not None:
            doc = message.document
            return Attachment(file_id=doc.file_id, size=doc.file_size,
                              mime=doc.mime_type or "application/octet-stream",
                              name=doc.file_name or f"file-{message.message_id}")
        return None

    @staticmethod
    def _spoken(message: Message, voice: str) -> Attachment | None:
        """I4: a voice message, audio file or video note, unless IVA_VOICE refuses them. Under
        ``file`` it goes to eve as a file part, like a document; under ``command`` the worker
        transcribes it when it composes the turn (the reference is queued now, so a restart loses
        nothing and this loop never waits for a transcription). A video is never taken."""
        if voice not in ("file", "command"):
            return None
        transcribe, n = voice == "command", message.message_id
        if message.voice is not None:
            v = message.voice
            return Attachment(file_id=v.file_id, size=v.file_size, mime=v.mime_type or "audio/ogg",
                              name=f"voice-{n}.ogg", spoken=Spoken.VOICE, transcribe=transcribe)
        if message.audio is not None:
            a = message.audio
            mime = a.mime_type or "audio/mpeg"
            return Attachment(file_id=a.file_id, size=a.file_size, mime=mime,
                              name=a.file_name or f"audio-{n}{mimetypes.guess_extension(mime) or ''}",
                              spoken=Spoken.AUDIO, transcribe=transcribe)
        if message.video_note is not None:
            note = message.video_note
            return Attachment(file_id=note.file_id, size=note.file_size, mime="video/mp4",
                              name=f"video-note-{n}.mp4", spoken=Spoken.VIDEO_NOTE, transcribe=transcribe)
        return None
