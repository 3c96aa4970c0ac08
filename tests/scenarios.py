"""Scenario helpers shared by the in-process tests (the harness, the fakes): what the owner
writes, what eve was sent, the states a scenario waits for, a kill armed mid-scenario. Test
modules import these from here, never from one another."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bridge.chat.transitions import ChatState, Transitions, state_of
from bridge.storage.payloads import QueuedMessage
from bridge.storage.store import CompactPhase
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import BOT_USERNAME, FakeTelegram
from tests.harness import OWNER, Harness

GROUP = -100500
MENTION = [{"type": "mention", "offset": 0, "length": len(BOT_USERNAME) + 1}]


# -- what the owner writes, what eve took ---------------------------------------------------------


async def write(tg: FakeTelegram, text: str | None, *, group: bool, mention: bool = False,
                **kwargs: Any) -> None:
    """The owner writes, in private or in the group (mentioning the bot when asked)."""
    if group and mention:
        text = f"@{BOT_USERNAME} {text}".rstrip()
        kwargs["entities"] = MENTION
    where = {"chat_id": GROUP, "chat_type": "supergroup"} if group else {}
    await tg.message(text, user_id=OWNER, **where, **kwargs)


def replied(author: dict[str, Any], chat_id: int, **fields: Any) -> dict[str, Any]:
    """A ``reply_to_message`` written by ``author`` in the chat ``chat_id``."""
    chat = {"id": chat_id, "type": "private", "first_name": "Ann"} if chat_id > 0 else \
        {"id": chat_id, "type": "supergroup", "title": "Group"}
    return {"message_id": 500, "date": int(time.time()), "chat": chat, "from": author, **fields}


def said(fake_eve: FakeEve) -> list[str]:
    """The text of every message eve took, in order (file parts left out)."""
    out = []
    for session in fake_eve.sessions.values():
        for body in session.sends:
            message = body.get("message")
            out.append(message if isinstance(message, str)
                       else "\n".join(p["text"] for p in message or [] if p.get("type") == "text"))
    return out


def sends(fake_eve: FakeEve) -> list[dict[str, Any]]:
    return [body for session in fake_eve.sessions.values() for body in session.sends]


def file_parts(fake_eve: FakeEve) -> list[list[dict[str, Any]]]:
    return [[p for p in b["message"] if p.get("type") != "text"] if isinstance(b["message"], list) else []
            for b in sends(fake_eve)]


async def answered(harness: Harness, tg: FakeTelegram, fake_eve: FakeEve, *, group: bool) -> str:
    """What eve was sent, once the turn is over and the person has the echo."""
    await harness.settled()
    (text,) = said(fake_eve)
    texts = tg.texts(GROUP if group else OWNER)
    assert len(texts) == 1 and texts[0].startswith("echo: "), texts
    return text


# -- states a scenario waits for ---------------------------------------------------------------------


def eve_compacting(fake_eve: FakeEve) -> bool:
    """eve has begun a compaction (compaction.requested is in a session's stream)."""
    return any(e["type"] == "compaction.requested" for s in fake_eve.sessions.values() for e in s.events)


def compacting(h: Harness, fake_eve: FakeEve) -> bool:
    """The chat is busy compacting and eve has begun it."""
    chat = h.maybe_chat()
    return chat is not None and state_of(chat) is ChatState.COMPACTING and eve_compacting(fake_eve)


def cancels(fake_eve: FakeEve) -> list[dict]:
    return [body or {} for method, path, body in fake_eve.requests if method == "POST" and path.endswith("/cancel")]


def phase_is(h: Harness, phase: CompactPhase) -> bool:
    chat = h.maybe_chat()
    return chat is not None and chat.compact_phase is phase


async def behind_a_late_compaction(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve, *,
                                   summary_delay: float) -> Harness:
    """A started bridge whose parking compaction was released (eve acknowledged it late, C6) and
    runs at eve for ``summary_delay`` seconds: what is sent now waits behind it."""
    fake_eve.compact_ack_delay = 0.8
    fake_eve.summary_delay = summary_delay
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_COMPACT_ACK_SECONDS="0.3")
    await h.start()
    await tg.message("big [[tokens=120000]]", user_id=OWNER)
    await h.until(lambda: phase_is(h, CompactPhase.RELEASED), what="released")
    return h


# -- a kill armed mid-scenario ---------------------------------------------------------------------


async def kill_during(h: Harness, image: Path, k: int, act: Callable[[], Awaitable[object]]) -> bool:
    """Arm a kill before the bridge's k-th statement from now, act, and wait until it struck or
    everything settled. True when it struck."""
    assert h.db is not None
    db = h.db
    db.kill_at, db.image = db.statements + k, image
    await act()
    await h.until(lambda: db.killed.is_set() or h.quiet(), timeout=20, what="killed or done")
    return db.killed.is_set()


# -- voice ------------------------------------------------------------------------------------------

OGG = b"OggS\x00\x02fake opus voice"
TRANSCRIPT = "hello from the recording"

# The transcription command (run by ``sys.executable``): it records what it got (its arguments, the
# recording's bytes, its directory's mode, its pid) in a JSON-lines file, then prints a transcript,
# fails, prints nothing, or hangs with a helper.
SCRIPT = r'''
import json, os, stat, subprocess, sys, time
mode, record, path = sys.argv[1], sys.argv[2], sys.argv[-1]
entry = {"argv": sys.argv[1:], "path": path, "pid": os.getpid(),
         "dir_mode": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
         "file_mode": stat.S_IMODE(os.stat(path).st_mode),
         "data": open(path, "rb").read().hex(), "iva_env": sorted(k for k in os.environ if k.startswith("IVA_"))}
if mode == "hang":  # a helper that holds our output open, as a real pipeline's decoder might
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    entry["helper"] = helper.pid
with open(record, "a") as out:
    out.write(json.dumps(entry) + "\n")
if mode == "ok":
    print("  " + "hello from the recording" + "  ")
elif mode == "fail":
    print("partial words")
    print("model not found", file=sys.stderr)
    sys.exit(1)
elif mode == "hang":
    time.sleep(120)
'''


def voice(file_id: str, data: bytes, *, caption: str | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"voice": {"file_id": file_id, "file_unique_id": file_id, "duration": 3,
                                       "mime_type": "audio/ogg", "file_size": len(data)}}
    if caption is not None:
        extra["caption"] = caption
    return extra


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed helper may wait to be reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def parts(fake_eve: FakeEve) -> list[Any]:
    """The ``message`` of every send eve received, in order, across sessions."""
    return [send["message"] for session in fake_eve.sessions.values() for send in session.sends]


def records(path: Path) -> list[dict[str, Any]]:
    """What the transcription command recorded, one entry a run."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def command(script: Path, mode: str, record: Path) -> str:
    """IVA_VOICE_COMMAND for the script at ``script`` in ``mode``, recording into ``record``."""
    return shlex.join([sys.executable, str(script), mode, str(record)])


# -- the transitions alone ---------------------------------------------------------------------------


async def owner_turn(tr: Transitions, address: str, session: str) -> None:
    """The chat in an owner's turn on ``session`` (touch, enqueue, claim, session opened)."""
    await tr.touch(address, int(address), None, "en")
    msg = QueuedMessage(text="hi", message_id=1, user_id=1, user_name="Ann", owner=True, private=True)
    await tr.queue.enqueue(address, msg.to_payload(), dedupe_key=f"tg:{address}:1")
    claim = await tr.claim_turn(address, limit=10)
    assert claim is not None
    chat = await tr.store.chat(address)
    assert chat is not None and chat.claim is not None
    await tr.session_opened(address, chat.claim, session)
