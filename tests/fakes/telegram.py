"""A fake Telegram Bot API server that aiogram really talks to, over loopback HTTP.

It keeps updates with real ``getUpdates`` offset semantics (an update is gone only once a
later call's offset passes it), records every method call, and injects faults per method:
``fail("sendMessage", 429, retry_after=1)``, 5xx, 403 (blocked) or a dropped connection.

With a webhook set (``setWebhook``) it delivers like Telegram instead (issue 15): each update
POSTed to the URL with the secret header, one at a time and in order, the same one again after a
non-2xx answer or a connection error, the next only after a 2xx (which confirms it, as an
offset passing it would); ``getUpdates`` answers 409 meanwhile. ``deleteWebhook`` stops the
delivery and keeps what was not confirmed.

Telegram's flood limits are opt-in (``FakeTelegram(limits=FloodLimits())``, the ``tg_limited``
fixture): a call that breaks one is answered 429 with ``retry_after`` as Telegram does, and kept
in ``flood_refusals``. The limits are the Bots FAQ's, read strictly: at most 30 messages (drafts
included) in any second overall, 20 in any minute to one group, and about one a second to one
private chat with a short burst allowed (a bucket of 4, refilled once a second).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes.waiting import until

TOKEN = "123456:TEST-token-abcdefghijklmnopqrstuv"
BOT_ID = 123456
BOT_USERNAME = "iva_test_bot"

_JSON_FIELDS = {"entities", "reply_parameters", "reaction", "commands", "reply_markup", "allowed_updates",
                "link_preview_options", "scope", "caption_entities",
                "ephemeral_message_parameters"}
_INT_FIELDS = {"chat_id", "message_id", "offset", "limit", "timeout", "message_thread_id", "user_id", "draft_id"}


# Tests that are not about pacing run without Telegram's flood limits (the product's defaults are
# those limits, bridge/telegram/pacing.py): sends are never held back, drafts keep their own 0.3 s floor.
# A pacing test passes its own IVA_SEND_* / IVA_DRAFT_RATE (or PACED) to override these.
UNPACED = {"IVA_SEND_RATE": "100000", "IVA_SEND_CHAT_BURST": "1000", "IVA_SEND_CHAT_RATE": "100000",
           "IVA_SEND_GROUP_PER_MINUTE": "6000000", "IVA_DRAFT_RATE": "1000"}
# The product's defaults, spelled out: a test with Telegram's limits on.
PACED = {"IVA_SEND_RATE": "28", "IVA_SEND_CHAT_BURST": "3", "IVA_SEND_CHAT_RATE": "1",
         "IVA_SEND_GROUP_PER_MINUTE": "20", "IVA_DRAFT_RATE": "1"}


@dataclass(frozen=True)
class FloodLimits:
    """Telegram's documented flood limits (Bots FAQ), as the fake enforces them when asked."""

    per_second: int = 30  # messages (drafts included) in any one second, all chats
    group_per_minute: int = 20  # messages in any one minute, one group or forum
    group_window: float = 60.0  # the "minute" (a test may shorten it, with the pacer's rate scaled alike)
    chat_rate: float = 1.0  # messages a second, one private chat...
    chat_burst: float = 4.0  # ... with a short burst allowed


def flood_kind(method: str) -> str | None:
    """What a method counts as: "message" (every limit), "draft" (the global one), None."""
    if method == "sendMessageDraft":
        return "draft"
    if method != "sendChatAction" and method.startswith(("send", "edit", "copy", "forward")):
        return "message"
    return None


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    status: int
    description: str
    retry_after: int | None = None
    drop: bool = False
    chat_id: int | None = None  # only a call to this chat meets it (None: any)


class FakeTelegram:
    def __init__(self, *, limits: FloodLimits | None = None) -> None:
        self.limits = limits  # None: no flood limits (every existing test)
        self.flood_refusals: list[Call] = []  # the calls answered 429 by a limit
        self._flood_all: deque[float] = deque()  # receipt times within the last second
        self._flood_groups: dict[int, deque[float]] = {}
        self._flood_chats: dict[int, tuple[float, float]] = {}  # private chat → (bucket level, at)
        self.updates: list[dict[str, Any]] = []
        self.confirmed = 0  # every update_id below this was confirmed by an offset
        self.calls: list[Call] = []
        self.faults: dict[str, list[Fault]] = {}
        self.handed: list[int] = []  # update ids handed out by getUpdates, in order
        self.handed_at: dict[int, float] = {}  # update id → monotonic time first handed out
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(1)
        self._edit_dates: dict[tuple[int, int], int] = {}  # (chat, message) → its last edit_date
        self._changed = asyncio.Condition()
        self.blocked_chats: set[int] = set()
        # Called (and awaited) inside a method's handler before it answers: crash tests use it
        # to hold a request, or to act at the exact moment Telegram has done the work.
        self.hooks: dict[str, Any] = {}
        self.instant_polls = False  # getUpdates answers at once, whatever its timeout (an emulator)
        self.garble: dict[str, int] = {}  # method → the next N answers are ok:true but undecodable
        self.unreadable: set[str] = set()  # file ids whose download fails (getFile still answers)
        self.local_files: dict[str, Any] = {}  # file id → Path, served as a local Bot API server does
        self.files: dict[str, bytes] = {}  # file_id → bytes, served by getFile and /file/
        self.sizeless: set[str] = set()  # file ids whose getFile answer leaves out file_size (it is optional)
        self.storm: Any = None  # a random.Random when a fault storm is on
        self.storm_rate = 0.0
        self.storm_methods: set[str] = set()
        self.storm_hits = 0
        self.sent_count = 0
        self.sent_texts: dict[str, float] = {}  # text → first time it was sent (benchmarks)
        self._sent_event = asyncio.Event()
        self._open: list[tuple[str, web.Request]] = []  # calls being answered, getUpdates aside
        self.runner: web.AppRunner | None = None
        self.url = ""
        # Webhook mode: the setWebhook parameters, the delivery task, what each POST got.
        self.webhook: dict[str, Any] | None = None
        self.webhook_retry = 0.2  # seconds between two tries of an update that was not taken
        self.webhook_timeout = 30.0  # seconds a delivery waits for its answer
        self.deliveries: list[tuple[int, int | None]] = []  # (update id, HTTP status or None: no answer)
        self.webhook_error: tuple[int, str] | None = None  # (unix time, message) of the last failure
        self._delivery: asyncio.Task[None] | None = None
        # Topics in private chats (Bot API 9.3/9.4): the bot's topic mode (getMe's
        # has_topics_enabled), the topics of each private chat (created by the bot with
        # createForumTopic or by the person), and those deleted since.
        self.private_topics_enabled = False
        self.private_topics: dict[int, dict[int, str]] = {}  # chat id → {message_thread_id: name}
        self.deleted_topics: set[tuple[int, int]] = set()
        self._thread_ids = itertools.count(100)
        # Ephemeral messages (Bot API 10.2): a group message shown to one person alone; with
        # refuse_ephemeral set, Telegram answers 400 with that description instead.
        self.refuse_ephemeral: str | None = None
        self._ephemeral_ids = itertools.count(1)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._handle)
        app.router.add_get("/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        # What is still being answered when a test ends is a held long poll: nothing to wait for, so
        # the stop cancels it at once (aiohttp waits shutdown_timeout for a handler first; 0 is "forever").
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.01)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        await self._stop_delivery()
        if self.runner is not None:
            await self.runner.cleanup()

    # -- what a test does -------------------------------------------------------------------

    def fail(self, method: str, status: int, description: str = "", *, retry_after: int | None = None,
             times: int = 1, drop: bool = False, chat_id: int | None = None) -> None:
        desc = description or {429: f"Too Many Requests: retry after {retry_after}",
                               403: "Forbidden: bot was blocked by the user",
                               500: "Internal Server Error", 502: "Bad Gateway"}.get(status, "Bad Request")
        self.faults.setdefault(method, []).extend(Fault(status, desc, retry_after, drop, chat_id)
                                                  for _ in range(times))

    def _fault_for(self, method: str, params: dict[str, Any]) -> Fault | None:
        """The next fault queued for this call (one for its chat, or for any chat)."""
        queue = self.faults.get(method)
        for i, fault in enumerate(queue or ()):
            if fault.chat_id is None or fault.chat_id == params.get("chat_id"):
                assert queue is not None
                return queue.pop(i)
        return None

    def _flood(self, method: str, params: dict[str, Any]) -> Fault | None:
        """A 429 when this call breaks one of the flood limits (and it is not counted), else None."""
        kind = flood_kind(method)
        if self.limits is None or kind is None:
            return None
        limits, now = self.limits, time.monotonic()
        while self._flood_all and now - self._flood_all[0] >= 1.0:
            self._flood_all.popleft()
        wait = 1 if len(self._flood_all) >= limits.per_second else 0
        chat = params.get("chat_id")
        level: float | None = None
        window: deque[float] | None = None
        if kind == "message" and isinstance(chat, int) and chat < 0:
            window = self._flood_groups.setdefault(chat, deque())
            while window and now - window[0] >= limits.group_window:
                window.popleft()
            if len(window) >= limits.group_per_minute:
                wait = max(wait, math.ceil(limits.group_window - (now - window[0])))
        elif kind == "message" and isinstance(chat, int):
            last, at = self._flood_chats.get(chat, (0.0, now))
            level = max(0.0, last - (now - at) * limits.chat_rate)
            if level + 1 > limits.chat_burst:
                wait = max(wait, math.ceil((level + 1 - limits.chat_burst) / limits.chat_rate))
        if wait:
            return Fault(429, f"Too Many Requests: retry after {wait}", max(1, wait))
        self._flood_all.append(now)
        if window is not None:
            window.append(now)
        if level is not None:
            self._flood_chats[int(chat)] = (level + 1, now)  # type: ignore[arg-type]
        return None

    def start_storm(self, rate: float, methods: set[str], seed: int = 7) -> None:
        """Fail that share of calls to ``methods`` with 5xx, 429 or a dropped connection."""
        import random

        self.storm, self.storm_rate, self.storm_methods = random.Random(seed), rate, methods

    async def add_updates(self, updates: list[dict[str, Any]]) -> list[int]:
        """Several updates at once, so one getUpdates answer carries them all."""
        async with self._changed:
            ids = []
            for update in updates:
                update_id = next(self._update_ids)
                self.updates.append({"update_id": update_id, **update})
                ids.append(update_id)
            self._changed.notify_all()
        return ids

    def make_message(self, text: str, *, user_id: int = 1, language_code: str = "en") -> dict[str, Any]:
        """A private message from ``user_id``, not yet delivered (for add_updates)."""
        message_id = next(self._message_ids)
        message: dict[str, Any] = {
            "message_id": message_id, "date": int(time.time()),
            "chat": {"id": user_id, "type": "private", "first_name": "Ann"},
            "from": {"id": user_id, "is_bot": False, "first_name": "Ann", "language_code": language_code},
            "text": text,
        }
        if text.startswith("/"):
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
        return {"message": message}

    async def add_update(self, update: dict[str, Any]) -> int:
        update_id = next(self._update_ids)
        update = {"update_id": update_id, **update}
        async with self._changed:
            self.updates.append(update)
            self._changed.notify_all()
        return update_id

    async def message(
        self,
        text: str | None,
        *,
        user_id: int = 1,
        chat_id: int | None = None,
        chat_type: str = "private",
        first_name: str = "Ann",
        language_code: str = "en",
        thread_id: int | None = None,
        is_topic: bool = False,
        reply_to_bot: bool = False,
        entities: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
        _add: bool = True,
    ) -> dict[str, Any]:
        """Make a user write a message; returns the message as the bot will see it."""
        chat_id = user_id if chat_id is None else chat_id
        message_id = next(self._message_ids)
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
        else:
            chat["title"] = "Group"
            if is_topic or thread_id:
                chat["is_forum"] = True
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": chat,
            "from": {"id": user_id, "is_bot": False, "first_name": first_name, "language_code": language_code},
        }
        if text is not None:
            message["text"] = text
            if entities is None and text.startswith("/"):
                command = text.split()[0]
                entities = [{"type": "bot_command", "offset": 0, "length": len(command)}]
            if entities:
                message["entities"] = entities
        if thread_id is not None:
            message["message_thread_id"] = thread_id
        if is_topic:
            message["is_topic_message"] = True
        if reply_to_bot:
            message["reply_to_message"] = {
                "message_id": 999_000 + message_id, "date": int(time.time()), "chat": chat,
                "from": {"id": BOT_ID, "is_bot": True, "first_name": "Iva", "username": BOT_USERNAME},
                "text": "earlier answer",
            }
        if extra:
            message.update(extra)
        if _add:
            await self.add_update({"message": message})
        return message

    async def edit(self, message: dict[str, Any], text: str | None = None, *, caption: str | None = None,
                   extra: dict[str, Any] | None = None, edit_date: int | None = None) -> dict[str, Any]:
        """The author edits ``message`` (as :meth:`message` returned it): an ``edited_message``
        update with the whole message as it now reads and a later ``edit_date`` (each edit of a
        message a second after the one before, unless given). Returns the edited message."""
        edited = json.loads(json.dumps(message))
        if text is not None:
            edited["text"] = text
        if caption is not None:
            edited["caption"] = caption
        edited.update(extra or {})
        key = (edited["chat"]["id"], edited["message_id"])
        last = self._edit_dates.get(key, int(edited["date"]))
        edited["edit_date"] = edit_date if edit_date is not None else max(int(time.time()), last + 1)
        self._edit_dates[key] = edited["edit_date"]
        await self.add_update({"edited_message": edited})
        return edited

    async def album(self, file_ids: list[str], *, captions: dict[int, str] | None = None,
                    media_group_id: str | None = None, batch: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
        """The user sends photos as one album: a message per photo sharing a ``media_group_id``
        (the files served from :attr:`files`, which gets a few bytes for any id it lacks);
        ``captions`` by part index. Each part is its own update, as Telegram sends them — in one
        getUpdates answer with ``batch``. ``kwargs`` as for :meth:`message`."""
        group = media_group_id or f"album{next(self._message_ids)}"
        common = kwargs.pop("extra", None) or {}
        parts = []
        for i, file_id in enumerate(file_ids):
            self.files.setdefault(file_id, f"photo {file_id}".encode())
            extra = {"media_group_id": group, "photo": [
                {"file_id": file_id, "file_unique_id": file_id, "width": 800, "height": 600,
                 "file_size": len(self.files[file_id])}]}
            if captions and i in captions:
                extra["caption"] = captions[i]
            parts.append(await self.message(None, extra={**common, **extra}, _add=not batch,
                                            **kwargs))
        if batch:
            await self.add_updates([{"message": p} for p in parts])
        return parts

    async def press(self, sent: dict[str, Any], label: str, *, user_id: int = 1) -> dict[str, Any]:
        """The user presses an inline button of a message the bot sent."""
        rows = (sent.get("reply_markup") or {}).get("inline_keyboard") or []
        button = next(b for row in rows for b in row if b["text"] == label)
        query = {
            "id": f"cbq{next(self._message_ids)}",
            "from": {"id": user_id, "is_bot": False, "first_name": "Ann", "language_code": "en"},
            "chat_instance": "ci",
            "data": button["callback_data"],
            "message": {"message_id": sent["_message_id"], "date": int(time.time()),
                        "chat": {"id": int(sent["chat_id"]),
                                 **({"type": "private"} if int(sent["chat_id"]) > 0
                                    else {"type": "supergroup", "title": "Group"})},
                        "text": sent["text"]},
        }
        await self.add_update({"callback_query": query})
        return query

    def sent(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        """Every sendMessage that succeeded, in order."""
        return [c.params for c in self.calls if c.method == "sendMessage" and c.params.get("_ok")
                and (chat_id is None or c.params.get("chat_id") == chat_id)]

    def texts(self, chat_id: int | None = None) -> list[str]:
        return [p["text"] for p in self.sent(chat_id)]

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        return [c.params for c in self.calls if c.method == method]

    def in_flight(self, method: str | None = None) -> int:
        """Calls being answered right now (a held hook, a slow handler); getUpdates never counts."""
        return sum(1 for m, _ in self._open if method is None or m == method)

    def callers_gone(self, method: str) -> int:
        """Calls still being answered whose caller has gone (killed): they will not be done."""
        return sum(1 for m, r in self._open if m == method and (r.transport is None or r.transport.is_closing()))

    def all_confirmed(self) -> bool:
        """The daemon confirmed every update (its offset passed them): each was handled to the end."""
        return not self.updates or self.confirmed > self.updates[-1]["update_id"]

    async def nudge(self, timeout: float = 15.0) -> None:
        """An update the bot has nothing to do with, and wait until the daemon confirms it: its
        polling loop went round after this point (and every earlier update was handled)."""
        update_id = await self.add_update({})
        await self.wait_for(lambda: self.confirmed > update_id, timeout, "the daemon to poll past a nudge")

    async def wait_for(self, predicate: Any, timeout: float = 15.0, what: str = "condition") -> Any:
        return await until(predicate, timeout, what, detail=lambda: f"sent={self.texts()!r}")

    async def wait_sent(self, predicate: Any, timeout: float = 30.0) -> None:
        """Wait, without polling, until ``predicate()`` holds; re-checked after every sendMessage."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._sent_event.clear()
                await self._sent_event.wait()

    async def wait_texts(self, count: int, chat_id: int | None = None, timeout: float = 15.0) -> list[str]:
        await self.wait_for(lambda: len(self.texts(chat_id)) >= count, timeout, f"{count} messages")
        return self.texts(chat_id)

    # -- the Bot API ------------------------------------------------------------------------

    async def _params(self, request: web.Request) -> dict[str, Any]:
        if request.content_type == "application/json":
            raw = await request.json()
        else:
            raw = dict(await request.post())
        params: dict[str, Any] = {}
        for key, value in raw.items():
            if isinstance(value, web.FileField):  # an upload (sendVoice): its bytes, as Telegram stores them
                value = {"filename": value.filename, "content_type": value.content_type, "data": value.file.read()}
            elif isinstance(value, str) and key in _JSON_FIELDS:
                value = json.loads(value)
            elif isinstance(value, str) and key in _INT_FIELDS:
                value = int(value)
            params[key] = value
        return params

    def _error(self, fault: Fault) -> web.Response:
        body: dict[str, Any] = {"ok": False, "error_code": fault.status, "description": fault.description}
        if fault.retry_after is not None:
            body["parameters"] = {"retry_after": fault.retry_after}
        return web.json_response(body, status=fault.status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        if request.match_info["token"] != TOKEN:
            return web.json_response({"ok": False, "error_code": 401, "description": "Unauthorized"}, status=401)
        if method == "getUpdates":
            return await self._answer(request, method)
        entry = (method, request)
        self._open.append(entry)
        try:
            return await self._answer(request, method)
        finally:
            self._open.remove(entry)

    async def _answer(self, request: web.Request, method: str) -> web.StreamResponse:
        params = await self._params(request)
        call = Call(method, params)
        self.calls.append(call)
        if self.storm is not None and method in self.storm_methods and self.storm.random() < self.storm_rate:
            kind = self.storm.choice(["500", "502", "drop", "429"])
            fault = (Fault(429, "Too Many Requests: retry after 1", 1) if kind == "429"
                     else Fault(500, "Internal Server Error", drop=kind == "drop") if kind != "502"
                     else Fault(502, "Bad Gateway"))
            self.storm_hits += 1
            if fault.drop:
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)
            return self._error(fault)
        fault = self._fault_for(method, params)
        if fault is None and (fault := self._flood(method, params)) is not None:
            self.flood_refusals.append(call)
        if fault is not None:
            if fault.drop:
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)
            return self._error(fault)
        hook = self.hooks.get(method)
        if hook is not None:
            await hook(params)
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # the caller is gone: nothing was done
        handler = getattr(self, f"_m_{method}", None)
        result = await handler(params) if handler else True
        if isinstance(result, Fault):
            return self._error(result)
        params["_ok"] = True
        if method == "sendMessage":
            self.sent_count += 1
            self.sent_texts.setdefault(params.get("text", ""), call.at)
            self._sent_event.set()
        if self.garble.get(method):
            # Done, but the answer is one aiogram cannot validate (an emulator, a newer Bot API).
            self.garble[method] -= 1
            return web.json_response({"ok": True, "result": {"message_id": "m-1", "chat": "?"}})
        return web.json_response({"ok": True, "result": result})

    async def _file(self, request: web.Request) -> web.Response:
        file_id = request.match_info["path"].rsplit("/", 1)[-1]
        if request.match_info["token"] != TOKEN or file_id not in self.files:
            return web.Response(status=404)
        if file_id in self.unreadable:
            return web.Response(status=502)  # getFile knows it; its download fails
        return web.Response(body=self.files[file_id])

    async def _m_getFile(self, params: dict[str, Any]) -> dict[str, Any] | Fault:
        file_id = str(params["file_id"])
        if file_id in self.local_files:  # a local Bot API server (--local): an absolute path
            path = self.local_files[file_id]
            return {"file_id": file_id, "file_unique_id": file_id, "file_size": path.stat().st_size,
                    "file_path": str(path)}
        if file_id not in self.files:
            return Fault(400, "Bad Request: invalid file_id")
        if file_id in self.sizeless:
            return {"file_id": file_id, "file_unique_id": file_id, "file_path": f"documents/{file_id}"}
        return {"file_id": file_id, "file_unique_id": file_id, "file_size": len(self.files[file_id]),
                "file_path": f"documents/{file_id}"}

    async def _m_getMe(self, _: dict[str, Any]) -> dict[str, Any]:
        me = {"id": BOT_ID, "is_bot": True, "first_name": "Iva", "username": BOT_USERNAME,
              "can_join_groups": True, "can_read_all_group_messages": False, "supports_inline_queries": False}
        if self.private_topics_enabled:
            me["has_topics_enabled"] = True
            me["allows_users_to_create_topics"] = True
        return me

    # -- topics in private chats (Bot API 9.3) ---------------------------------------------

    def open_topic(self, chat_id: int, name: str) -> int:
        """The person creates a topic in their private chat with the bot; its message_thread_id."""
        assert self.private_topics_enabled, "the bot's topic mode is off"
        thread = next(self._thread_ids)
        self.private_topics.setdefault(chat_id, {})[thread] = name
        return thread

    def delete_topic(self, chat_id: int, thread_id: int) -> None:
        """The person deletes a topic (with its messages): sends into it fail from now on."""
        self.private_topics.get(chat_id, {}).pop(thread_id, None)
        self.deleted_topics.add((chat_id, thread_id))

    def _thread_problem(self, params: dict[str, Any]) -> Fault | None:
        """A private chat's message_thread_id must name a topic that exists (Telegram: 400
        "message thread not found"); groups are not checked here beyond the General topic."""
        thread = params.get("message_thread_id")
        if thread is None:
            return None
        chat_id, thread = int(params["chat_id"]), int(thread)
        if chat_id > 0 and (not self.private_topics_enabled or thread not in self.private_topics.get(chat_id, {})):
            return Fault(400, "Bad Request: message thread not found")
        return None

    async def _m_createForumTopic(self, params: dict[str, Any]) -> dict[str, Any] | Fault:
        chat_id, name = int(params["chat_id"]), str(params.get("name") or "")
        if not 1 <= len(name) <= 128:
            return Fault(400, "Bad Request: TOPIC_TITLE_EMPTY" if not name else "Bad Request: TOPIC_TITLE_INVALID")
        if chat_id > 0 and not self.private_topics_enabled:
            return Fault(400, "Bad Request: the chat is not a forum")
        thread = next(self._thread_ids)
        self.private_topics.setdefault(chat_id, {})[thread] = name
        return {"message_thread_id": thread, "name": name, "icon_color": 7322096}

    async def _m_getUpdates(self, params: dict[str, Any]) -> list[dict[str, Any]] | Fault:
        if self.webhook is not None:
            return Fault(409, "Conflict: can't use getUpdates method while webhook is active; "
                              "use deleteWebhook to delete the webhook first")
        offset = params.get("offset")
        if offset:
            self.confirmed = max(self.confirmed, int(offset))
        limit = int(params.get("limit") or 100)
        timeout = 0.0 if self.instant_polls else float(params.get("timeout") or 0)
        deadline = time.monotonic() + timeout
        async with self._changed:
            while True:
                ready = [u for u in self.updates if u["update_id"] >= self.confirmed][:limit]
                if ready or time.monotonic() >= deadline:
                    break
                try:
                    await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
                except TimeoutError:
                    pass
        now = time.monotonic()
        for u in ready:
            self.handed.append(u["update_id"])
            self.handed_at.setdefault(u["update_id"], now)
        return ready

    async def _m_sendMessage(self, params: dict[str, Any]) -> dict[str, Any] | Fault:
        chat_id = int(params["chat_id"])
        if chat_id in self.blocked_chats:
            return Fault(403, "Forbidden: bot was blocked by the user")
        if params.get("message_thread_id") == 1:
            return Fault(400, "Bad Request: message thread not found")
        if (problem := self._thread_problem(params)) is not None:
            return problem
        ephemeral = params.get("ephemeral_message_parameters")
        if ephemeral:
            if chat_id > 0:
                return Fault(400, "Bad Request: ephemeral messages can be sent only to group chats")
            if self.refuse_ephemeral is not None:
                return Fault(400, self.refuse_ephemeral)
        text = params.get("text", "")
        if not text.strip():
            return Fault(400, "Bad Request: message text is empty")
        if len(text.encode("utf-16-le")) // 2 > 4096:
            return Fault(400, "Bad Request: message is too long")
        message_id = next(self._message_ids)
        params["_message_id"] = message_id
        if ephemeral:  # message_id 0; the ephemeral id names it, for its receiver alone
            receiver = int(ephemeral["receiver_user_id"])
            return {"message_id": 0, "ephemeral_message_id": next(self._ephemeral_ids), "date": int(time.time()),
                    "chat": {"id": chat_id, "type": "supergroup", "title": "Group"}, "text": text,
                    "from": {"id": BOT_ID, "is_bot": True, "first_name": "Iva"},
                    "receiver_user": {"id": receiver, "is_bot": False, "first_name": "Ann"}}
        return {"message_id": message_id, "date": int(time.time()),
                "chat": {"id": chat_id, "type": "private"}, "text": text,
                "from": {"id": BOT_ID, "is_bot": True, "first_name": "Iva"}}

    async def _m_sendMessageDraft(self, params: dict[str, Any]) -> bool | Fault:
        """Bot API 10.3: a private chat's ephemeral preview; replaced by the next frame of the
        same draft_id, gone when the bot sends a message."""
        if int(params["chat_id"]) < 0:
            return Fault(400, "Bad Request: drafts can be sent only to private chats")
        if not int(params.get("draft_id") or 0):
            return Fault(400, "Bad Request: draft_id must be non-zero")
        if len(str(params.get("text", "")).encode("utf-16-le")) // 2 > 4096:
            return Fault(400, "Bad Request: text is too long")
        if (problem := self._thread_problem(params)) is not None:
            return problem
        return True

    def drafts(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        """Every sendMessageDraft that succeeded, in order (with ``at``, its monotonic time)."""
        return [{**c.params, "at": c.at} for c in self.calls if c.method == "sendMessageDraft" and c.params.get("_ok")
                and (chat_id is None or c.params.get("chat_id") == chat_id)]

    async def stop_generation(self, chat_id: int, draft_id: int, *, thread_id: int | None = None) -> int:
        """The person pressed the stop button of a draft (update ``stopped_message_generation``)."""
        stopped: dict[str, Any] = {"chat": {"id": chat_id, "type": "private", "first_name": "Ann"},
                                   "draft_id": draft_id}
        if thread_id is not None:
            stopped["message_thread_id"] = thread_id
        return await self.add_update({"stopped_message_generation": stopped})

    async def _m_sendVoice(self, params: dict[str, Any]) -> dict[str, Any] | Fault:
        """An OGG/Opus voice message (Telegram shows other audio as a file, or refuses it)."""
        chat_id = int(params["chat_id"])
        if chat_id in self.blocked_chats:
            return Fault(403, "Forbidden: bot was blocked by the user")
        if (problem := self._thread_problem(params)) is not None:
            return problem
        voice = params.get("voice")
        if isinstance(voice, str) and voice.startswith("attach://"):  # the upload in its own part
            voice = params.get(voice.removeprefix("attach://"))
            params["voice"] = voice
        data = voice.get("data", b"") if isinstance(voice, dict) else b""
        if not data.startswith(b"OggS"):
            return Fault(400, "Bad Request: VOICE_MESSAGES_FORBIDDEN" if not data else "Bad Request: wrong file type")
        message_id = next(self._message_ids)
        params["_message_id"] = message_id
        file_id = f"voice-{message_id}"
        self.files[file_id] = data
        return {"message_id": message_id, "date": int(time.time()), "chat": {"id": chat_id, "type": "private"},
                "from": {"id": BOT_ID, "is_bot": True, "first_name": "Iva"},
                "voice": {"file_id": file_id, "file_unique_id": file_id, "duration": 1, "mime_type": "audio/ogg",
                          "file_size": len(data)}}

    def voices(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        """Every sendVoice that succeeded, in order (``voice["data"]``: the audio's bytes)."""
        return [c.params for c in self.calls if c.method == "sendVoice" and c.params.get("_ok")
                and (chat_id is None or c.params.get("chat_id") == chat_id)]

    async def _m_setMessageReaction(self, params: dict[str, Any]) -> bool:
        return True

    async def _m_sendChatAction(self, params: dict[str, Any]) -> bool:
        return True

    async def _m_setMyCommands(self, params: dict[str, Any]) -> bool:
        return True

    async def _m_answerCallbackQuery(self, params: dict[str, Any]) -> bool:
        return True

    # -- webhook mode (issue 15) ------------------------------------------------------------

    async def _m_setWebhook(self, params: dict[str, Any]) -> bool | Fault:
        url = str(params.get("url") or "")
        if not url:
            await self._stop_delivery()
            self.webhook = None
            return True
        if not url.startswith(("http://", "https://")):
            return Fault(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        if params.get("drop_pending_updates") in (True, "true", "True"):
            self.confirmed = (self.updates[-1]["update_id"] + 1) if self.updates else self.confirmed
        self.webhook = params
        self.webhook_error = None
        if self._delivery is None or self._delivery.done():
            self._delivery = asyncio.create_task(self._deliver())
        return True

    async def _m_deleteWebhook(self, params: dict[str, Any]) -> bool:
        await self._stop_delivery()
        self.webhook = None
        if params.get("drop_pending_updates") in (True, "true", "True"):
            self.confirmed = (self.updates[-1]["update_id"] + 1) if self.updates else self.confirmed
        return True

    async def _m_getWebhookInfo(self, _: dict[str, Any]) -> dict[str, Any]:
        pending = sum(1 for u in self.updates if u["update_id"] >= self.confirmed)
        info: dict[str, Any] = {"url": (self.webhook or {}).get("url", ""), "has_custom_certificate": False,
                                "pending_update_count": pending}
        if self.webhook is not None:
            info["max_connections"] = int(self.webhook.get("max_connections") or 40)
            info["allowed_updates"] = self.webhook.get("allowed_updates")
            if self.webhook_error is not None:
                info["last_error_date"], info["last_error_message"] = self.webhook_error
        return info

    async def _stop_delivery(self) -> None:
        task, self._delivery = self._delivery, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def delivered(self, update_id: int) -> int:
        """How many times that update was POSTed to the webhook (whatever the answer)."""
        return sum(1 for u, _ in self.deliveries if u == update_id)

    async def _deliver(self) -> None:
        """Telegram's side of a webhook with max_connections=1: the oldest unconfirmed update,
        again and again until it gets a 2xx, then the next."""
        async with aiohttp.ClientSession() as session:
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda: any(u["update_id"] >= self.confirmed for u in self.updates))
                    update = next(u for u in self.updates if u["update_id"] >= self.confirmed)
                hook = self.webhook
                assert hook is not None
                headers = {"content-type": "application/json"}
                if hook.get("secret_token"):
                    headers["X-Telegram-Bot-Api-Secret-Token"] = str(hook["secret_token"])
                update_id = update["update_id"]
                self.handed.append(update_id)
                self.handed_at.setdefault(update_id, time.monotonic())
                status: int | None = None
                try:
                    async with session.post(hook["url"], data=json.dumps(update), headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=self.webhook_timeout)) as answer:
                        status = answer.status
                        await answer.read()
                    error = f"Wrong response from the webhook: {status} {answer.reason}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = "Connection refused" if isinstance(exc, aiohttp.ClientConnectorError) \
                        else f"Connection failed: {type(exc).__name__}"
                self.deliveries.append((update_id, status))
                if status is not None and 200 <= status < 300:
                    self.confirmed = max(self.confirmed, update_id + 1)
                    continue
                self.webhook_error = (int(time.time()), error)
                await asyncio.sleep(self.webhook_retry)
