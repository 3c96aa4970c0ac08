"""The bot's commands: /new, /compact, /stop, /status, /notes, /start, /help (M1-M8, N9, L*), and
the people's: a one-time link opened (``/start <code>``), /invite and /users (P1, P2).

Ingest hands a command here after deciding who may talk; each command commits its dedupe mark
(and its transition, for /new and /compact) before it answers, so a redelivered update does
nothing twice.
"""

from __future__ import annotations

import difflib
import time
from typing import TYPE_CHECKING

from aiogram.exceptions import TelegramAPIError
from aiogram.types import CallbackQuery, Message

from .. import log
from ..chat import askers
from ..chat.notewrites import changes_line
from ..chat.services import Services
from ..chat.transitions import ChatState, state_of
from ..people import Redeemed, Role, link
from ..storage.marks import CommandMark, PairingMark, PeopleMark, remember
from ..storage.payloads import Kind, Origin, PeopleButton
from ..storage.store import Chat
from ..telegram.texts import number, t
from .addressing import Address
from .model_command import model_command, model_pressed
from .reminders_command import pressed, reminders_command

if TYPE_CHECKING:
    from aiogram.types import CallbackQuery

    from ..chat.worker import Scheduler
    from ..push.reminders import Reminders

__all__ = ["Commands"]

logger = log.get(__name__)


class Commands:
    def __init__(self, services: Services, scheduler: Scheduler, reminders: Reminders | None = None) -> None:
        self.s = services
        self.scheduler = scheduler
        self.reminders = reminders  # W8: /reminders and its cancel buttons
        self._compacting: set[str] = set()  # M4: set before the first await of a /compact

    async def handle(self, command: str, message: Message, address: Address, lang: str, key: str,
                     args: str = "") -> str:
        if command == "compact":
            return await self.compact(message, address, lang, key)
        if command == "notes":
            return await self.notes(message, address, lang, key, args)
        if command == "new":
            return await self.new(message, address, lang, key)
        if command == "stop":
            return await self.stop(message, address, lang, key)
        if command == "model":
            return await model_command(self.s, self.scheduler, message, address, lang, key, args)
        if command == "reminders" and self.reminders is not None:
            return await reminders_command(self.s, self.reminders, message, address, lang, key)
        if command == "invite":
            return await self.invite(message, address, lang, key)
        if command == "users":
            return await self.users(message, address, lang, key)
        if command == "topic":
            return await self.topic(message, address, lang, key, args)
        s, addr = self.s, str(address)
        private = message.chat.type == "private"
        # S7: in a group the eve session id (an internal) is never shown, even to an owner: the
        # answer goes to the asker alone where Telegram allows it, and to the group where not.
        owner = private and message.from_user is not None and await s.people.is_owner(message.from_user.id)
        text = await self.status_text(addr, lang, owner=owner) if command == "status" else t(command, lang)
        async with s.store.db.transaction():
            # The answer is on disk with the mark that says the update was handled.
            if not await remember(s.queue, addr, CommandMark(command), dedupe_key=key):
                return "duplicate"
            await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", text,
                                  receiver=self._asker(message) if command == "status" else None)
        return "command"

    async def model_pressed(self, query: CallbackQuery, name: str, address: str, lang: str) -> str:
        """A /model button (D1): the note to show the presser."""
        return await model_pressed(self.s, self.scheduler, query, name, address, lang)

    async def reminder_pressed(self, query: CallbackQuery, reminder_id: str, lang: str) -> str:
        """A /reminders cancel button (W8): the note to show the presser."""
        if self.reminders is None:
            return t("reminder_gone", lang)
        return await pressed(self.s, self.reminders, query, reminder_id, lang)

    # -- /new -------------------------------------------------------------------------------

    async def new(self, message: Message, address: Address, lang: str, key: str) -> str:
        """M7: the worker retires the session (cancelling what runs) and answers. In a group it
        cancels a running turn and drops everyone's waiting messages: /stop's rule (an owner, or
        a person the running turn answers; anyone while the chat is idle)."""
        addr, s = str(address), self.s
        async with s.store.db.transaction():
            # The mark commits with the refusal or with the request: a redelivery does neither twice.
            if not await remember(s.queue, addr, CommandMark("new"), dedupe_key=key):
                return "duplicate"
            allowed = await self._may_interrupt(message, await s.store.chat(addr), addr)
            if allowed:
                await s.transitions.touch(addr, address.chat_id, address.thread_id, lang)
                dropped = await s.transitions.request_new(addr, reply_to=message.message_id)
            else:
                await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", t("new_not_yours", lang),
                                      reply_to=message.message_id, receiver=self._asker(message))
        if not allowed:
            logger.info("new_refused", user_id=message.from_user.id if message.from_user is not None else 0)
            return "command"
        logger.info("new_requested", dropped=dropped)
        self.scheduler.wake(addr)
        return "command"

    # -- /stop ------------------------------------------------------------------------------

    async def stop(self, message: Message, address: Address, lang: str, key: str) -> str:
        """L*: stop the running turn (cancelled in eve, the conversation kept) or compaction (as
        C4). In a group only an owner or a person whose message the turn answers may; the
        command never reaches eve as text."""
        addr, s = str(address), self.s
        user = message.from_user.id if message.from_user is not None else 0
        stopped = None
        async with s.store.db.transaction():
            if not await remember(s.queue, addr, CommandMark("stop"), dedupe_key=key):
                return "duplicate"
            chat = await s.store.chat(addr)
            receiver = self._asker(message)  # S7: what only the asker needs, to them alone
            if chat is None or not chat.busy:
                text = t("stop_nothing", lang)
            elif not await self._may_interrupt(message, chat, addr):
                text = t("stop_not_yours", lang)
            else:
                stopped = await s.transitions.want_stop(addr)
                if chat.kind is not Kind.COMPACT:
                    text = t("stop_done", lang)
                elif (s.eve.stream_version or 27) >= 27:
                    # eve 1.x ignores a cancel during a compaction (PROTOCOL-27.md §6): it finishes
                    text = t("stop_compaction_runs_on", lang)
                else:
                    text = t("stop_compaction", lang)
                receiver = None  # a stop is everyone's news
            await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", text,
                                  reply_to=message.message_id, receiver=receiver)
        logger.info("stop_asked", stopped=stopped is not None, user_id=user)
        if stopped is not None:
            self.scheduler.wake(addr)
        return "command"

    async def _may_interrupt(self, message: Message, chat: Chat | None, address: str) -> bool:
        """/stop's and /new's rule: in private, or while the chat is idle, anyone who may talk;
        in a group while it is busy, an owner or a person whose message the running turn answers
        (of a pushed turn's or a reminder's: anyone who may talk there, F11)."""
        if message.chat.type == "private" or chat is None or not chat.busy:
            return True
        user = message.from_user.id if message.from_user is not None else 0
        return await self.s.people.is_owner(user) or (
            chat.kind is Kind.TURN and askers.may_answer(await askers.running(self.s.queue, chat), user))

    @staticmethod
    def _asker(message: Message) -> int | None:
        """In a group, the person an answer for them alone goes to (S7); None in private."""
        if message.chat.type == "private" or message.from_user is None:
            return None
        return message.from_user.id

    # -- people: a one-time link, /invite, /users (P1, P2) ------------------------------------

    async def redeem(self, message: Message, address: Address, lang: str, key: str, code: str) -> str:
        """``/start <code>`` in a private chat, from anyone: the code, its dedupe mark and the
        answer commit together (a crash before the answer is sent sends it at the restart; the
        redelivered update is a duplicate, never a second use). Too many wrong codes: silence."""
        addr, s = str(address), self.s
        assert message.from_user is not None
        user = message.from_user
        if await s.people.locked(user.id):
            # Ignored, and nothing written for it (no dedupe mark, no log line at info): a flood
            # of codes from one locked account must not grow the database or the log.
            logger.debug("pairing_code_ignored", user_id=user.id)
            return f"pairing_{Redeemed.LOCKED}"
        async with s.store.db.transaction():
            if not await remember(s.queue, addr, PairingMark(), dedupe_key=key):
                return "duplicate"
            outcome = await s.people.redeem(user.id, user.full_name, code.split()[0])
            text = {Redeemed.OWNER: "pair_owner", Redeemed.ALLOWED: "pair_allowed", Redeemed.ALREADY: "pair_already",
                    Redeemed.INVALID: "pair_invalid"}.get(outcome)
            if text is not None:
                await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", t(text, lang),
                                      reply_to=message.message_id)
        logger.info("pairing_code_used", user_id=user.id, outcome=str(outcome))
        return f"pairing_{outcome}"

    async def _owner_answer(self, message: Message, address: Address, key: str, text: str, *,
                            markup: object = None) -> str:
        """An answer committed with the command's dedupe mark, as for /status; in a group, to the
        asker alone where Telegram allows it (S7)."""
        addr, s = str(address), self.s
        async with s.store.db.transaction():
            if not await remember(s.queue, addr, CommandMark(), dedupe_key=key):
                return "duplicate"
            await s.store.put_outgoing(addr, f"re:{key}", address.chat_id, address.thread_id, text, format="plain",
                                       reply_to=message.message_id, markup=markup, receiver=self._asker(message))
        return "command"

    async def invite(self, message: Message, address: Address, lang: str, key: str) -> str:
        """P2: an owner gets a one-time link that lets one more person talk (IVA_INVITE_HOURS);
        in private only — a link shown in a group is anyone's."""
        s = self.s
        assert message.from_user is not None
        if not await s.people.is_owner(message.from_user.id):
            return await self._owner_answer(message, address, key, t("owner_only", lang))
        if message.chat.type != "private":
            return await self._owner_answer(message, address, key, t("invite_private_only", lang))
        hours = s.settings.people.invite_hours
        username = (await s.sender.bot.me()).username
        addr = str(address)
        async with s.store.db.transaction():
            if not await remember(s.queue, addr, CommandMark("invite"), dedupe_key=key):
                return "duplicate"
            code = await s.people.mint(Role.ALLOWED, created_by=message.from_user.id, seconds=hours * 3600.0)
            await s.store.put_outgoing(addr, f"re:{key}", address.chat_id, address.thread_id,
                                       t("invite_link", lang, hours=hours, link=link(username, code)),
                                       format="plain", reply_to=message.message_id)
        logger.info("invite_made", by=message.from_user.id, hours=hours)
        return "command"

    async def users(self, message: Message, address: Address, lang: str, key: str) -> str:
        """P2: the owners and allowed people, each of the database's with a remove button (the
        settings' ones are listed, not removable; nobody removes themselves)."""
        s = self.s
        assert message.from_user is not None
        me = message.from_user.id
        if not await s.people.is_owner(me):
            return await self._owner_answer(message, address, key, t("owner_only", lang))
        if message.chat.type != "private":  # who may talk is nobody else's business (S7)
            return await self._owner_answer(message, address, key, t("users_private_only", lang))
        lines, rows = [t("users_header", lang)], []
        for person in await s.people.everyone():
            name = person.name or str(person.user_id)
            notes = [t("users_owner" if person.role is Role.OWNER else "users_allowed", lang)]
            if person.from_env:
                notes.append(t("users_env", lang))
            if person.user_id == me:
                notes.append(t("users_you", lang))
            lines.append(f"• {name} ({person.user_id}) — {', '.join(notes)}")
            if not person.from_env and person.user_id != me:
                rows.append([{"text": t("users_remove", lang, name=name[:40]),
                              "callback_data": PeopleButton(person.user_id).encode()}])
        return await self._owner_answer(message, address, key, "\n".join(lines), markup=rows or None)

    async def people_button(self, query: CallbackQuery, lang: str) -> tuple[str, str | None]:
        """A /users remove button pressed: an owner's press removes (once, whatever Telegram
        redelivers); anyone else's is refused. Returns (outcome, the press's answer)."""
        s = self.s
        button = PeopleButton.parse(query.data)
        assert button is not None
        if not await s.people.is_owner(query.from_user.id):
            return "refused", t("owner_only", lang)
        chat_id = query.message.chat.id if query.message is not None else query.from_user.id
        addr = str(Address(chat_id))
        async with s.store.db.transaction():
            if not await remember(s.queue, addr, PeopleMark(button.user_id), dedupe_key=f"cb:{query.id}"):
                return "duplicate", None
            person = next((p for p in await s.people.everyone() if p.user_id == button.user_id), None)
            removed = button.user_id != query.from_user.id and await s.people.remove(button.user_id)
            if removed:
                name = (person.name if person is not None else "") or str(button.user_id)
                await s.outbox.say_to(addr, chat_id, None, f"rm:{query.id}", t("users_removed", lang, name=name),
                                      markdown=False)
        logger.info("person_removed" if removed else "person_remove_refused", user_id=button.user_id,
                    by=query.from_user.id)
        if removed:
            return "person_removed", "✓"
        return "refused", t("users_gone", lang)

    # -- /topic (P3) ---------------------------------------------------------------------------

    async def topic(self, message: Message, address: Address, lang: str, key: str, args: str) -> str:
        """``/topic <title>``: a new topic of the private chat, its own conversation (session,
        queue, notebook), greeted inside; at most once per update (the mark commits before
        Telegram is asked: a crash in between opens nothing, and the person asks again)."""
        s, addr = self.s, str(address)
        if message.chat.type != "private":
            return await self._owner_answer(message, address, key, t("topic_private_only", lang))
        if not (await s.sender.bot.me()).has_topics_enabled:
            return await self._owner_answer(message, address, key, t("topics_off", lang))
        title = " ".join(args.split())[:128] or t("topic_default", lang)
        if not await remember(s.queue, addr, CommandMark("topic"), dedupe_key=key):
            return "duplicate"
        try:
            opened = await s.sender.bot.create_forum_topic(chat_id=address.chat_id, name=title)
        except TelegramAPIError as exc:
            logger.warning("topic_open_failed", error=exc.message[:200])
            async with s.store.db.transaction():
                await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}",
                                      t("topic_failed", lang, reason=exc.message[:200]), markdown=False)
            return "command"
        topic = Address(address.chat_id, opened.message_thread_id)
        async with s.store.db.transaction():
            await s.transitions.touch(str(topic), topic.chat_id, topic.thread_id, lang)
            await s.outbox.say_to(str(topic), topic.chat_id, topic.thread_id, f"hello:{key}",
                                  t("topic_hello", lang, title=title), markdown=False)
            await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}",
                                  t("topic_opened", lang, title=title), reply_to=message.message_id, markdown=False)
        logger.info("topic_opened", topic=str(topic))
        return "command"

    # -- /compact ---------------------------------------------------------------------------

    async def compact(self, message: Message, address: Address, lang: str, key: str) -> str:
        """M1-M5: /compact takes the chat the way parking does, through eve's own route."""
        addr, s = str(address), self.s
        if addr in self._compacting:
            # M4: the mark is set before the first await. Not remembered: a redelivery asks again.
            s.spawn(s.sender.say(address.chat_id, address.thread_id, t("compact_already", lang),
                                 reply_to=message.message_id))
            return "command"
        self._compacting.add(addr)
        try:
            async with s.store.db.transaction():
                # The dedupe mark and the capture commit together: a failure leaves neither.
                if not await remember(s.queue, addr, CommandMark("compact"), dedupe_key=key):
                    return "duplicate"
                chat = await s.store.chat(addr)
                captured = None
                # "I'll say when it's done" only where it will be said: a /compact's compaction (an
                # automatic one is silent, C11).
                already = ("compact_already" if chat is not None and chat.origin is Origin.MANUAL
                           else "compact_already_auto")
                if s.requests.outstanding(addr):
                    text = t(already, lang)  # C5: eve has not answered the last request yet
                elif chat is not None and state_of(chat) is ChatState.RELEASED:
                    text = t(already, lang)  # C5: eve may still start the released one
                elif chat is not None and chat.busy:
                    text = t(already if chat.kind is Kind.COMPACT else "compact_after_answer", lang)
                elif (chat is None or not chat.eve_session or chat.reset_mark or chat.measurement is None
                      or chat.measurement < s.settings.compaction.manual_min):
                    text = t("compact_nothing", lang)  # M2: small or unknown
                else:
                    captured = await s.transitions.capture_manual(addr, before=chat.measurement,
                                                                 reply_to=message.message_id, lang=lang)
                    text = (t("compact_accepted", lang, before=number(chat.measurement)) if captured
                            else t("compact_after_answer", lang))  # M3: a turn took the chat first
                await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", text,
                                      reply_to=message.message_id)
        finally:
            self._compacting.discard(addr)
        if captured:
            self.scheduler.wake(addr)
        return "command"

    # -- /status ----------------------------------------------------------------------------

    async def status_text(self, address: str, lang: str, *, owner: bool = True) -> str:
        """M8: session, last measurement vs threshold, parking on/off, busy state, queue length,
        the notebook's size and mode. The eve session id is an internal: owners only (S2)."""
        s = self.s
        chat = await s.store.chat(address)
        queued = await s.queue.depth(address)
        threshold = number(await s.threshold(address))
        if chat is None:
            text = t("status", lang, session=t("status_no_session", lang), state=t("status_idle", lang),
                     queued=queued, measure=t("status_unknown", lang), threshold=threshold,
                     parking=t("status_parking_on", lang))
        else:
            if not chat.eve_session or chat.reset_mark:
                session = t("status_no_session", lang)
            else:
                session = chat.eve_session if owner else t("status_session_active", lang)
            if chat.busy and chat.busy_since:
                key = "status_compacting" if state_of(chat) is ChatState.COMPACTING else "status_busy"
                state = t(key, lang, seconds=int(time.time() - chat.busy_since)) + " " + t("status_stop_hint", lang)
            else:
                state = t("status_idle", lang)
            measure = number(chat.measurement) if chat.measurement is not None else t("status_unknown", lang)
            parking = t("status_parking_off" if chat.compaction_disabled else "status_parking_on", lang)
            text = t("status", lang, session=session, state=state, queued=queued, measure=measure,
                     threshold=threshold, parking=parking)
        if s.models.enabled:  # D1: which model answers here, and a choice the operator took away
            answering = await s.models.of(address)
            shown = t("model_line", lang, name=answering.model.name, id=answering.model.id,
                      window=number(answering.model.window)) if answering.model else "?"
            text += "\n" + (t("status_model_gone", lang, model=shown, chosen=answering.chosen) if answering.fallback
                            else t("status_model", lang, model=shown))
        if s.notebook is not None:
            mode = chat.notes_mode if chat else "inline"
            text += "\n" + t("status_notes", lang, n=await s.notebook.count(address), mode=mode)
        if owner:  # V1, V8: which eve answers, and a stream this Iva cannot read
            problem = s.eve.unsupported
            text += "\n" + (str(problem) if problem is not None else t(
                "status_eve", lang, version=s.eve.eve_version or "?", stream=s.eve.stream_version or "?"))
        return text

    # -- /notes -----------------------------------------------------------------------------

    async def notes(self, message: Message, address: Address, lang: str, key: str, args: str) -> str:
        """N9 in Telegram: the owner lists the notebook with what changed since the last look, or
        reads one note with its last change. The answer commits with the dedupe mark (and the
        look's mark), through the outbox: a crash after the mark still answers, once."""
        addr, s = str(address), self.s
        notebook = s.notebook
        assert message.from_user is not None
        owner = await s.people.is_owner(message.from_user.id)
        async with s.store.db.transaction():
            if not await remember(s.queue, addr, CommandMark("notes"), dedupe_key=key):
                return "duplicate"
            if notebook is None:
                text = t("notes_off", lang)
            elif not owner:
                text = t("notes_owner_only", lang)
            elif args:
                text = await self._note_text(addr, args.split()[0].lower(), lang)
            else:
                text = await self._notebook_text(addr, lang)
            # Plain text: a note is shown as written, and a diff's "-"/"+" lines are not list bullets.
            if message.chat.type != "private" and notebook is not None and owner:
                # A group's notebook is the owner's business: shown to them alone in the group (S7),
                # or, where Telegram will not, in the owner's private chat — never to the group.
                title = message.chat.title or str(address.chat_id)
                await s.store.put_outgoing(addr, f"re:{key}", address.chat_id, address.thread_id, text,
                                           format="plain", reply_to=message.message_id,
                                           receiver=message.from_user.id,
                                           fallback={"private": f"{title}\n{text}",
                                                     "sent": t("notes_sent_privately", lang),
                                                     "unsent": t("notes_start_private", lang)})
            else:
                await s.outbox.say_to(addr, address.chat_id, address.thread_id, f"re:{key}", text,
                                      reply_to=message.message_id, markdown=False, receiver=self._asker(message))
        return "command"

    async def _notebook_text(self, addr: str, lang: str) -> str:
        notebook = self.s.notebook
        assert notebook is not None
        notes = await notebook.notes(addr)
        if not notes:
            return t("notes_empty", lang)
        seen = await notebook.seen_at(addr)
        chat = await self.s.store.chat(addr)
        new = [n for n in notes if seen is None or n.created_at > seen]
        changed = [n for n in notes if n not in new and seen is not None and n.updated_at > seen]
        lines = [t("notes_header", lang, n=len(notes), chars=sum(len(n.body) for n in notes),
                   mode=chat.notes_mode if chat else "inline", new=len(new), changed=len(changed))]
        last = await notebook.last_turn(addr)  # seed 000: what the last turn wrote is marked
        touched = {name for name, _ in last}
        for n in notes:
            mark = "🆕" if n in new else "✏️" if n in changed else "•"
            pin = " 📌" if n.pinned else ""
            lines.append(f"{mark} {n.name}{pin} — {n.description}{' 📝' if n.name in touched else ''}")
        if last:
            lines.append(t("notes_last_turn", lang, what=changes_line(last, lang)))
        lines.append(t("notes_hint", lang))
        await notebook.mark_seen(addr)  # a look: every client shares this server-side mark
        return "\n".join(lines)

    async def _note_text(self, addr: str, name: str, lang: str) -> str:
        notebook = self.s.notebook
        assert notebook is not None
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
