"""The buttons of the bot's messages, as updates (T5, S3, L*): a live draft's stop button, and an
inline button pressed — a question's option (an answer for the waiting turn), a budget prompt's
Continue / Stop (owners only, V6), a /reminders cancel, a /model choice, a /users action. Every
press is answered, never with a blocking call in ingest's loop."""

from __future__ import annotations

from collections.abc import Callable

from aiogram.types import CallbackQuery, Message, Update

from .. import log
from ..chat import askers
from ..chat.services import Services
from ..storage.marks import StopMark, remember
from ..storage.payloads import InputAnswer, PeopleButton, PromptButton
from ..telegram.texts import pick_lang, t
from .addressing import Address
from .commands import Commands
from .model_command import button as model_button
from .reminders_command import button as reminder_button

__all__ = ["Buttons"]

logger = log.get(__name__)


class Buttons:
    def __init__(self, services: Services, commands: Commands, wake: Callable[[str], None]) -> None:
        self.s = services
        self.bot = services.sender.bot
        self.settings = services.settings
        self.queue = services.queue
        self.store = services.store
        self.sender = services.sender
        self.transitions = services.transitions
        self.commands = commands
        self.wake = wake
        self.spawn = services.spawn

    async def on_stop_button(self, update: Update) -> str:
        """L*: the stop button of a live draft (private chats only, so the person whose answer it
        is): the running turn is stopped like /stop, durably; the partial answer stays, marked."""
        stopped = update.stopped_message_generation
        assert stopped is not None
        if stopped.chat.type != "private" or not await self.s.people.may_talk(stopped.chat.id):
            return "ignored"
        address = Address(stopped.chat.id, stopped.message_thread_id)
        if await self.store.chat(str(address)) is None:
            address = Address(stopped.chat.id)
        async with self.store.db.transaction():
            if not await remember(self.queue, address, StopMark(), dedupe_key=f"stop:{update.update_id}"):
                return "duplicate"
            # A press on a draft of a turn that is over (it crossed the answer) stops nothing.
            chat = await self.transitions.want_stop(str(address), draft=stopped.draft_id)
        logger.info("stop_button", draft_id=stopped.draft_id, stopped=chat is not None)
        if chat is not None:
            self.wake(str(address))
        return "stop"

    async def on_callback(self, query: CallbackQuery) -> str:
        """T5: a pressed option button becomes an inputResponse for the waiting turn — only in the
        prompt's own chat, and only from the people whose turn asked or an owner (S3). Every press
        is answered, never with a blocking call in this loop."""
        note: str | None = None
        outcome = "callback"
        try:
            lang = pick_lang(query.from_user.language_code, self.settings.lang)
            if (reminder := reminder_button(query.data)) is not None:  # W8: a /reminders cancel button
                note = await self.commands.reminder_pressed(query, reminder, lang)
                return "reminder"
            if (chosen := model_button(query.data)) is not None:  # D1: a /model button
                note = await self.commands.model_pressed(query, *chosen, lang)
                return "model"
            button = PromptButton.parse(query.data)
            if button is None and PeopleButton.parse(query.data) is not None:
                outcome, note = await self.commands.people_button(query, lang)
                return outcome
            if button is None or not await self.s.people.may_talk(query.from_user.id):
                return "ignored"
            prompt = await self.store.prompt(button.prompt_id)
            where = query.message.chat.id if query.message is not None else None
            if prompt is None or (prompt.chat_id is not None and prompt.chat_id != where):
                logger.warning("callback_foreign_prompt", user_id=query.from_user.id, chat_id=where)
                note = t("input_closed", lang)
                return "refused"
            user = query.from_user.id
            asked = prompt.askers
            # a prompt shown in several chats (a budget prompt in the owners' private chats) has
            # no chat of its own, and its askers say who may press it (V6)
            if not await self.s.people.is_owner(user) and not askers.may_answer(asked, user) \
                    and (prompt.chat_id is not None or askers.OWNERS in asked):
                note = t("input_not_yours", lang)
                return "refused"
            if prompt.state != "open":
                note = t("input_closed", lang)
                return "closed"
            option = str(prompt.options[button.index])
            message_id = query.message.message_id if query.message is not None else 0
            answer = InputAnswer(request_id=prompt.request_id, option_id=option, message_id=message_id,
                                 user_id=query.from_user.id)
            row = await self.queue.enqueue(prompt.address, answer.to_payload(), dedupe_key=f"cb:{query.id}")
            if row is not None:
                self.wake(prompt.address)
            note = "✓"
            return outcome
        except (ValueError, IndexError):
            return "ignored"
        finally:
            self.spawn(self._answer_callback(query.id, note))
            chat = query.message.chat if query.message is not None else None
            if note not in (None, "✓") and chat is not None and chat.type != "private":
                # S7: in a group a refusal is also shown to the presser alone, where Telegram
                # allows it; never to the group (the press's own answer has said it already).
                assert note is not None
                pressed = query.message
                thread = pressed.message_thread_id if isinstance(pressed, Message) and pressed.is_topic_message \
                    and pressed.message_thread_id != 1 else None
                self.spawn(self.sender.say(chat.id, thread, note, receiver=query.from_user.id,
                                           callback_query_id=query.id, fallback=False, markdown=False))

    async def _answer_callback(self, query_id: str, note: str | None) -> None:
        try:
            await self.bot.answer_callback_query(query_id, text=note)
        except Exception as exc:
            logger.info("callback_answer_failed", error=str(exc))
