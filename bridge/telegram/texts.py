"""Everything the bot says, per language. No user-facing string lives in logic code."""

from __future__ import annotations

from typing import Literal

__all__ = ["DEFAULT_LANG", "LANGS", "Lang", "number", "pick_lang", "t"]

Lang = Literal["ru", "en"]
LANGS: tuple[Lang, ...] = ("ru", "en")
DEFAULT_LANG: Lang = "ru"  # IVA_LANG's default, and t()'s for a language we do not speak

_TEXTS: dict[str, dict[Lang, str]] = {
    "start": {
        "en": (
            "Hi! I'm your assistant. Just write to me — every message is kept until it is answered, "
            "even if I'm busy or restarting.\n\n/help shows what I can do."
        ),
        "ru": (
            "Привет! Я ваш ассистент. Просто пишите — каждое сообщение сохраняется, пока на него не "
            "отвечу, даже если я занят или перезапускаюсь.\n\n/help — что я умею."
        ),
    },
    "help": {
        "en": (
            "Write as you would to a person. While I'm answering, new messages wait their turn "
            "(👀 means: received, in the queue).\n\n"
            "/new — start a new conversation\n"
            "/stop — stop the answer being written (the ■ button on it does the same)\n"
            "/compact — compact a long conversation now (I also do it by myself between answers)\n"
            "/status — the conversation's state\n"
            "/model — which model answers in this conversation, and switch it (owner only)\n"
            "/notes — the notebook I keep for myself in this chat (owner only)\n"
            "/reminders — the reminders set in this chat, to cancel one (owner only)\n"
            "/topic <title> — open another conversation as a topic of this chat (when topics are on)\n"
            "/invite, /users — a one-time link for another person; who may talk to me (owner, in private)\n"
            "/help — this text"
        ),
        "ru": (
            "Пишите, как написали бы человеку. Пока я отвечаю, новые сообщения ждут очереди "
            "(👀 значит: получено, в очереди).\n\n"
            "/new — начать новый разговор\n"
            "/stop — остановить ответ, который я пишу (кнопка ■ на нём делает то же)\n"
            "/compact — сжать длинный разговор сейчас (между ответами я делаю это и сам)\n"
            "/status — состояние разговора\n"
            "/model — какая модель отвечает в этом разговоре, и сменить её (только владельцу)\n"
            "/notes — блокнот, который я веду для себя в этом чате (только владельцу)\n"
            "/reminders — напоминания этого чата, чтобы отменить (только владельцу)\n"
            "/topic <название> — открыть ещё один разговор темой этого чата (если темы включены)\n"
            "/invite, /users — одноразовая ссылка для другого человека; кто может со мной говорить "
            "(владельцу, в личке)\n"
            "/help — эта справка"
        ),
    },
    "cmd_new": {"en": "Start a new conversation", "ru": "Начать новый разговор"},
    "cmd_compact": {"en": "Compact the conversation now", "ru": "Сжать разговор сейчас"},
    "compacting_notice": {
        "en": "Compacting the conversation, I'll answer soon.",
        "ru": "Сжимаю разговор, скоро отвечу.",
    },
    "compact_nothing": {
        "en": "Nothing to compact yet — the conversation is still small.",
        "ru": "Сжимать пока нечего — разговор ещё небольшой.",
    },
    "compact_after_answer": {
        "en": "I'm still answering. Send /compact again after the answer.",
        "ru": "Я ещё отвечаю. Повторите /compact после ответа.",
    },
    "compact_already": {
        "en": "Already compacting — I'll say when it's done.",
        "ru": "Уже сжимаю — скажу, когда закончу.",
    },
    "compact_already_auto": {
        "en": "I'm compacting the conversation already, on my own; your next message is answered right after.",
        "ru": "Я уже сама сжимаю разговор; на следующее сообщение отвечу сразу после этого.",
    },
    "compact_accepted": {
        "en": "Compacting the conversation ({before} tokens). If I restart meanwhile, send /compact again.",
        "ru": "Сжимаю разговор ({before} токенов). Если я перезапущусь, повторите /compact.",
    },
    "compact_done": {
        "en": "Done: the conversation is compacted. I'll tell you its new size after the next answer.",
        "ru": "Готово: разговор сжат. Новый размер скажу после следующего ответа.",
    },
    "compact_failed": {
        "en": "Compaction didn't work; the conversation is unchanged. You can try /compact later.",
        "ru": "Сжать не получилось; разговор не изменился. Можно повторить /compact позже.",
    },
    "compact_after": {
        "en": "After compaction: {after} tokens (was {before}).",
        "ru": "После сжатия: {after} токенов (было {before}).",
    },
    "compact_again": {
        "en": "The compaction was interrupted. Please send /compact again.",
        "ru": "Сжатие прервалось. Пожалуйста, отправьте /compact ещё раз.",
    },
    "cmd_status": {"en": "State of the conversation", "ru": "Состояние разговора"},
    "cmd_help": {"en": "What this bot can do", "ru": "Что умеет бот"},
    "cmd_stop": {"en": "Stop the answer being written", "ru": "Остановить ответ"},
    "stop_done": {"en": "Stopped. Send your next message when you are ready.",
                  "ru": "Остановлено. Пишите, когда будете готовы."},
    "stop_compaction": {"en": "Stopped the compaction; the conversation stays as it was.",
                        "ru": "Сжатие остановлено; разговор остался как был."},
    "stop_compaction_runs_on": {"en": "The conversation is being compacted, which cannot be stopped midway; it takes a "
                                      "moment, and then I answer what you sent meanwhile.",
                                "ru": "Сейчас разговор сжимается, и это нельзя прервать на середине; это займёт "
                                      "немного времени, потом я отвечу на то, что вы прислали."},
    "eve_upgraded_cut": {
        "en": ("The assistant was upgraded while answering, so our conversation starts afresh (your notebook "
               "came along). Please repeat your last request."),
        "ru": ("Ассистента обновили, пока он отвечал, поэтому разговор начинается заново (блокнот сохранён). "
               "Пожалуйста, повторите последний запрос."),
    },
    "eve_upgraded": {"en": "The assistant was upgraded, so our conversation starts afresh (your notebook came along).",
                     "ru": "Ассистента обновили, поэтому разговор начинается заново (ваш блокнот сохранился)."},
    "status_eve": {"en": "eve: {version}, stream version {stream}", "ru": "eve: {version}, версия потока {stream}"},
    "stop_nothing": {"en": "Nothing is running right now.", "ru": "Сейчас ничего не выполняется."},
    "stop_not_yours": {"en": "Only the person I'm answering (or an owner) can stop this.",
                       "ru": "Остановить может только тот, кому я отвечаю (или владелец)."},
    "stopped_mark": {"en": "⏹ stopped", "ru": "⏹ остановлено"},
    "status_stop_hint": {"en": "/stop stops it.", "ru": "/stop — остановить."},
    "new_not_yours": {"en": "Only the person I'm answering (or an owner) can start a new conversation now.",
                      "ru": "Начать новый разговор сейчас может только тот, кому я отвечаю (или владелец)."},
    "new_done": {
        "en": "New conversation started.",
        "ru": "Начат новый разговор.",
    },
    "cmd_notes": {"en": "The assistant's notebook for this chat", "ru": "Блокнот ассистента в этом чате"},
    "notes_off": {"en": "The notebook is turned off on this bot.", "ru": "Блокнот на этом боте выключен."},
    "notes_owner_only": {"en": "Only the bot's owner can look into the notebook.",
                         "ru": "Заглянуть в блокнот может только владелец бота."},
    "notes_empty": {"en": "📓 The notebook of this chat is empty.", "ru": "📓 Блокнот этого чата пуст."},
    "notes_header": {
        "en": "📓 Notebook: {n} note(s), {chars} characters ({mode} mode). "
              "Since your last look: {new} new, {changed} changed.",
        "ru": "📓 Блокнот: заметок {n}, символов {chars} (режим {mode}). "
              "С прошлого взгляда: новых {new}, изменённых {changed}.",
    },
    "notes_hint": {"en": "/notes <name> shows a note with its last change.",
                   "ru": "/notes <имя> покажет заметку и её последнее изменение."},
    "notes_missing": {"en": "There is no note named “{name}”.", "ru": "Заметки «{name}» нет."},
    "notes_sent_privately": {"en": "I've sent you this chat's notebook in private.",
                             "ru": "Блокнот этого чата отправила вам в личку."},
    "notes_start_private": {"en": "The notebook is only shown in private: open a chat with me, press Start, "
                                  "then ask again.",
                            "ru": "Блокнот показываю только в личке: откройте чат со мной, нажмите «Старт» и "
                                  "спросите снова."},
    "notes_changed": {"en": "Last change:", "ru": "Последнее изменение:"},
    "notes_unchanged": {"en": "(no earlier version)", "ru": "(прежней версии нет)"},
    "notes_written": {"en": "📝 Notebook: {what}", "ru": "📝 Блокнот: {what}"},
    "notes_written_group": {"en": "📝 Notebook of chat {chat}: {what}", "ru": "📝 Блокнот чата {chat}: {what}"},
    "notes_last_turn": {"en": "📝 The last answer changed: {what}", "ru": "📝 Последний ответ изменил: {what}"},
    "notes_did_new": {"en": "new", "ru": "новая"},
    "notes_did_changed": {"en": "changed", "ru": "изменена"},
    "notes_did_pinned": {"en": "pinned", "ru": "закреплена"},
    "notes_did_unpinned": {"en": "unpinned", "ru": "откреплена"},
    "notes_did_deleted": {"en": "deleted", "ru": "удалена"},
    "notes_pinned": {"en": "pinned", "ru": "закреплена"},
    "notes_updated": {"en": "updated", "ru": "изменена"},
    "status_notes": {"en": "Notebook: {n} note(s), {mode} mode", "ru": "Блокнот: заметок {n}, режим {mode}"},
    "new_notes_kept": {
        "en": "The notebook kept its {n} note(s).",
        "ru": "Блокнот сохранил заметки: {n}.",
    },
    "new_dropped": {
        "en": "New conversation started. {n} waiting message(s) were dropped.",
        "ru": "Начат новый разговор. Ожидавших сообщений отброшено: {n}.",
    },
    "eve_server_error": {
        "en": "the assistant's server kept failing on it",
        "ru": "сервер ассистента раз за разом отвечал ошибкой",
    },
    "turn_failed": {
        "en": "Sorry, I couldn't answer that ({reason}). Please try again.",
        "ru": "Не получилось ответить ({reason}). Попробуйте ещё раз.",
    },
    "session_lost_after_answer": {
        "en": "I lost the thread of our conversation after that answer; your next message starts a new one.",
        "ru": "После этого ответа я потерял нить разговора; следующее сообщение начнёт новый.",
    },
    "session_lost": {
        "en": "I lost the thread of our conversation and started a new one. Please repeat your last request.",
        "ru": "Я потерял нить разговора и начал новый. Пожалуйста, повторите последний запрос.",
    },
    "input_needed": {"en": "I need your answer to go on.", "ru": "Чтобы продолжить, мне нужен ваш ответ."},
    "input_closed": {"en": "This question is closed.", "ru": "Этот вопрос уже закрыт."},
    "budget_prompt": {
        "en": ("The assistant has used up its usage budget for this conversation (a guardrail of the "
               "agent's). Let it go on?"),
        "ru": "Ассистент израсходовал лимит использования в этом разговоре (защита агента). Продолжить?",
    },
    "budget_prompt_for": {
        "en": ("The assistant has used up its usage budget in the chat {chat} (a guardrail of the agent's). "
               "Let it go on?"),
        "ru": "Ассистент израсходовал лимит использования в чате {chat} (защита агента). Продолжить?",
    },
    "budget_continue": {"en": "Continue", "ru": "Продолжить"},
    "budget_stop": {"en": "Stop", "ru": "Остановить"},
    "budget_waiting_owner": {
        "en": "The assistant has used up its usage budget; I asked the owner whether it may go on.",
        "ru": "Ассистент израсходовал лимит использования; я спросил владельца, можно ли продолжать.",
    },
    "budget_given_up": {
        "en": ("Nobody allowed the assistant more usage in time, so this message was not answered. "
               "Ask the bot's owner to continue it."),
        "ru": ("Никто вовремя не разрешил ассистенту продолжить, поэтому на это сообщение нет ответа. "
               "Попросите владельца бота разрешить."),
    },
    "budget_stopped": {
        "en": "The owner stopped the assistant here: its usage budget is spent. This message was not answered.",
        "ru": "Владелец остановил ассистента: лимит использования исчерпан. На это сообщение нет ответа.",
    },
    "sign_in_needed": {"en": "The assistant needs you to sign in to go on.",
                       "ru": "Чтобы продолжить, ассистенту нужно, чтобы вы вошли в аккаунт."},
    "sign_in_button": {"en": "Sign in", "ru": "Войти"},
    "input_unknown_kind": {
        "en": "The assistant asked for something I cannot show here ({kind}), so I stopped this answer.",
        "ru": "Ассистент попросил то, что я не умею здесь показать ({kind}), поэтому я остановил этот ответ.",
    },
    "input_not_yours": {"en": "This question is for the person who asked.",
                        "ru": "Этот вопрос — для того, кто спрашивал."},
    "state_quarantined": {
        "en": (
            "Iva: the state database failed its check at start. It was moved aside to {path} (not "
            "deleted) and a fresh one was made. Messages that were waiting may need to be sent again. "
            "The notebooks are in that file too: the operator brings them back with "
            "`iva restore-notes {path}`."
        ),
        "ru": (
            "Iva: база состояния не прошла проверку при запуске. Она отложена в {path} (не удалена), "
            "создана новая. Ожидавшие сообщения, возможно, придётся отправить ещё раз. Блокноты тоже "
            "в том файле: оператор вернёт их командой `iva restore-notes {path}`."
        ),
    },
    "state_quarantined_no_fresh": {
        "en": (
            "Iva: the state database failed its check at start. It was moved aside to {path} (not "
            "deleted), but a fresh one could not be made ({error}): Iva cannot work until its disk "
            "has room again."
        ),
        "ru": (
            "Iva: база состояния не прошла проверку при запуске. Она отложена в {path} (не удалена), "
            "но новую создать не удалось ({error}): Iva не сможет работать, пока на диске нет места."
        ),
    },
    "unsupported": {
        "en": "I can read text, photos and documents — not this kind of message, sorry.",
        "ru": "Я понимаю текст, фото и документы — такое сообщение, увы, нет.",
    },
    "unsupported_voice": {  # IVA_VOICE=file or command: voice is read too
        "en": "I can read text, photos, documents and voice messages — not this kind of message, sorry.",
        "ru": "Я понимаю текст, фото, документы и голосовые — такое сообщение, увы, нет.",
    },
    "voice_unheard": {
        "en": "I couldn't transcribe that recording — please send it again or write it down.",
        "ru": "Не получилось расшифровать эту запись — отправьте её ещё раз или напишите текстом.",
    },
    "file_too_big": {
        "en": "That file is too big for me ({size} MB; the limit is {limit} MB).",
        "ru": "Этот файл слишком большой ({size} МБ; предел — {limit} МБ).",
    },
    "status": {
        "en": (
            "Conversation: {session}\n"
            "State: {state}\n"
            "Waiting messages: {queued}\n"
            "Last size: {measure} of {threshold} tokens (compaction threshold)\n"
            "Automatic compaction: {parking}"
        ),
        "ru": (
            "Разговор: {session}\n"
            "Состояние: {state}\n"
            "Сообщений в очереди: {queued}\n"
            "Последний размер: {measure} из {threshold} токенов (порог сжатия)\n"
            "Автосжатие: {parking}"
        ),
    },
    "status_parking_on": {"en": "on", "ru": "включено"},
    "status_parking_off": {
        "en": "off for this conversation (the last compaction did not shrink it enough; /new starts afresh)",
        "ru": "выключено для этого разговора (прошлое сжатие не помогло; /new начнёт заново)",
    },
    "status_compacting": {"en": "compacting (for {seconds} s)", "ru": "сжимаю (уже {seconds} с)"},
    "status_no_session": {"en": "not started yet", "ru": "ещё не начат"},
    "status_session_active": {"en": "going on", "ru": "идёт"},
    "status_idle": {"en": "free", "ru": "свободен"},
    "status_busy": {"en": "answering (for {seconds} s)", "ru": "отвечаю (уже {seconds} с)"},
    "status_unknown": {"en": "unknown", "ru": "неизвестно"},
    # The assistant writes first (W1-W9)
    "pushed_failed": {
        "en": "⚠️ I could not carry out “{what}” ({reason}); it will not be retried.",
        "ru": "⚠️ Не получилось выполнить «{what}» ({reason}); повтора не будет.",
    },
    "pushed_lost_reason": {"en": "the assistant's session was lost", "ru": "сессия ассистента потеряна"},
    "cmd_reminders": {"en": "Reminders in this chat", "ru": "Напоминания в этом чате"},
    # D1: /model
    "cmd_model": {"en": "Choose the model", "ru": "Выбрать модель"},
    "model_header": {"en": "Models for this conversation:", "ru": "Модели для этого разговора:"},
    "model_line": {"en": "{name} — {id}, window {window} tokens", "ru": "{name} — {id}, окно {window} токенов"},
    "model_hint": {
        "en": "/model <name> (or a button) switches from the next answer on.",
        "ru": "/model <название> (или кнопка) — сменить со следующего ответа.",
    },
    "model_gone": {
        "en": "“{chosen}”, chosen here, is no longer offered: the default, {name}, answers.",
        "ru": "Выбранной здесь «{chosen}» больше нет в списке: отвечает модель по умолчанию, {name}.",
    },
    "model_switched": {
        "en": "From the next answer on, this conversation answers on {model}.",
        "ru": "Со следующего ответа в этом разговоре отвечает {model}.",
    },
    "model_same": {
        "en": "This conversation already answers on {model}.",
        "ru": "В этом разговоре уже отвечает {model}.",
    },
    "model_unknown": {
        "en": "There is no model “{name}” here. Choose one of: {names}.",
        "ru": "Модели «{name}» здесь нет. Можно выбрать: {names}.",
    },
    "model_none": {
        "en": "There are no models to choose from here: the operator lists them in IVA_MODELS.",
        "ru": "Выбирать здесь не из чего: список моделей задаёт оператор (IVA_MODELS).",
    },
    "model_owner_only": {"en": "Only an owner can choose the model.", "ru": "Модель может выбрать только владелец."},
    "model_compact_first": {
        "en": "Its window is smaller than this conversation fills ({size} of {threshold} tokens): "
              "I'll compact the conversation first.",
        "ru": "Её окно меньше, чем занимает разговор ({size} из {threshold} токенов): сначала сожму разговор.",
    },
    "status_model": {"en": "Model: {model}", "ru": "Модель: {model}"},
    "status_model_gone": {
        "en": "Model: {model} (the default: “{chosen}”, chosen here, is no longer offered)",
        "ru": "Модель: {model} (по умолчанию: выбранной здесь «{chosen}» больше нет в списке)",
    },
    "reminders_none": {"en": "No reminders in this chat.", "ru": "В этом чате нет напоминаний."},
    "reminders_header": {"en": "Reminders in this chat ({n}); a button cancels one:",
                         "ru": "Напоминания в этом чате ({n}); кнопка отменяет:"},
    "reminders_owner_only": {"en": "Only the owner can see the reminders.",
                             "ru": "Напоминания видит только владелец."},
    "reminders_sent_privately": {"en": "I've sent you this chat's reminders in private.",
                                 "ru": "Напоминания этого чата отправила вам в личку."},
    "reminders_start_private": {"en": "The reminders are only shown to you: open a chat with me, press Start, "
                                      "then ask again.",
                                "ru": "Напоминания показываю только вам: откройте чат со мной, нажмите «Старт» и "
                                      "спросите снова."},
    "reminders_paused": {"en": "paused: the chat is blocked or gone", "ru": "на паузе: чат заблокирован или удалён"},
    "reminders_next": {"en": "next {at}", "ru": "следующее {at}"},
    "reminders_cancel": {"en": "✖ {what}", "ru": "✖ {what}"},
    "reminder_cancelled": {"en": "Reminder cancelled.", "ru": "Напоминание отменено."},
    "reminder_gone": {"en": "This reminder is already gone.", "ru": "Этого напоминания уже нет."},
    # -- people (pairing, invitations, /users: P1, P2) -------------------------------------
    "pair_owner": {
        "en": ("You are my owner now. Just write to me.\n\n/invite makes a one-time link for another person; "
               "/users shows who may talk to me."),
        "ru": ("Теперь вы мой владелец. Просто пишите.\n\n/invite — одноразовая ссылка для другого человека; "
               "/users — кто может со мной говорить."),
    },
    "pair_allowed": {
        "en": "Welcome! You can talk to me now — just write.\n\n/help shows what I can do.",
        "ru": "Добро пожаловать! Теперь можно со мной говорить — просто пишите.\n\n/help — что я умею.",
    },
    "pair_already": {"en": "You can already talk to me — just write.",
                     "ru": "Вы уже можете со мной говорить — просто пишите."},
    "pair_invalid": {
        "en": "This link does not work: it was used already, or it expired. Ask for a new one.",
        "ru": "Эта ссылка не работает: ею уже воспользовались, или её срок истёк. Попросите новую.",
    },
    "cmd_invite": {"en": "A one-time link for another person", "ru": "Одноразовая ссылка для другого человека"},
    "cmd_users": {"en": "Who may talk to me", "ru": "Кто может со мной говорить"},
    "owner_only": {"en": "Only an owner can do this.", "ru": "Это может только владелец."},
    "invite_link": {
        "en": ("A one-time link for one person, good for {hours} h:\n{link}\n\nWhoever opens it first can talk "
               "to me; /users shows who can, and removes."),
        "ru": ("Одноразовая ссылка для одного человека, действует {hours} ч:\n{link}\n\nКто откроет её первым, "
               "сможет со мной говорить; /users — кто может, и удаление."),
    },
    "invite_private_only": {"en": "I give invitation links in private only: send /invite to me there.",
                            "ru": "Ссылки-приглашения даю только в личке: отправьте /invite мне туда."},
    "users_header": {"en": "Who may talk to me:", "ru": "Кто может со мной говорить:"},
    "users_owner": {"en": "owner", "ru": "владелец"},
    "users_allowed": {"en": "allowed", "ru": "допущен"},
    "users_env": {"en": "from the settings, not removable here", "ru": "из настроек, здесь не удалить"},
    "users_you": {"en": "you", "ru": "вы"},
    "users_remove": {"en": "Remove {name}", "ru": "Убрать {name}"},
    "users_removed": {"en": "{name} can no longer talk to me.", "ru": "{name} больше не может со мной говорить."},
    "users_gone": {"en": "Already removed.", "ru": "Уже удалён."},
    "users_private_only": {"en": "I list who may talk to me in private only: send /users to me there.",
                           "ru": "Кто может со мной говорить, показываю только в личке: отправьте /users мне туда."},
    # -- topics in private chats (P3) ---------------------------------------------------
    "cmd_topic": {"en": "Open a new conversation as a topic", "ru": "Открыть новый разговор темой"},
    "topic_opened": {"en": "Opened the topic “{title}”: a conversation of its own. Write there.",
                     "ru": "Открыла тему «{title}» — отдельный разговор. Пишите туда."},
    "topic_hello": {"en": "A new conversation: “{title}”. /new, /compact, /status, /stop and /notes here act "
                          "on this topic only.",
                    "ru": "Новый разговор: «{title}». /new, /compact, /status, /stop и /notes здесь действуют "
                          "только на эту тему."},
    "topic_default": {"en": "New conversation", "ru": "Новый разговор"},
    "topics_off": {"en": "Topics are off for this bot: its owner can turn on topic mode in @BotFather.",
                   "ru": "Темы у этого бота выключены: владелец может включить режим тем в @BotFather."},
    "topic_private_only": {"en": "I open topics in our private chat only.",
                           "ru": "Темы открываю только в нашей личной переписке."},
    "topic_failed": {"en": "Telegram would not open the topic ({reason}).",
                     "ru": "Telegram не открыл тему ({reason})."},
    "topic_gone": {"en": "A topic of ours is gone, so I answer its messages here.",
                   "ru": "Одной из наших тем больше нет, поэтому отвечаю на её сообщения здесь."},
    "reminders_cancel_owner_only": {"en": "Only the owner can cancel reminders.",
                                    "ru": "Отменять напоминания может только владелец."},
}


def _as_lang(code: str) -> Lang | None:
    """``code`` as one of our languages, or None when we do not speak it."""
    for lang in LANGS:
        if code == lang:
            return lang
    return None


def number(value: int | None) -> str:
    """A token count as the person reads it: ``120 000``; ``?`` when unknown."""
    return "?" if value is None else f"{value:,}".replace(",", " ")


def t(key: str, lang: str, /, **values: object) -> str:
    """The text ``key`` in ``lang``: a plain ``str``, as the store gives it back; one we do not
    speak (never written by :func:`pick_lang` or the settings) falls back to :data:`DEFAULT_LANG`."""
    text = _TEXTS[key][_as_lang(lang) or DEFAULT_LANG]
    return text.format(**values) if values else text


def pick_lang(language_code: str | None, default: Lang) -> Lang:
    """The user's Telegram language when we speak it, else the operator's default."""
    if language_code:
        code = _as_lang(language_code.split("-")[0].lower())
        if code is not None:
            return code
    return default
