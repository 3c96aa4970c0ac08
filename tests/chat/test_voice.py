"""Voice messages, audio files and video notes (issue 14, IVA_VOICE), in process on the real store
with the fakes: refused by default, sent to eve as file parts, or transcribed by the operator's
command in the worker — the transcript marked, the recording's copy removed, a failure or a hang
told to the person in one line without wedging the chat.

The transcription command is a small Python script written here (run by ``sys.executable``): it
records what it got (its arguments, the recording's bytes, its directory's mode, its pid) in a
JSON-lines file, then prints a transcript, fails, prints nothing, or hangs with a helper.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridge.chat.transcribe import MAX_TRANSCRIPT, TranscribeFailed, Transcriber
from bridge.config import ConfigError, Settings
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness
from tests.scenarios import OGG, SCRIPT, TRANSCRIPT, alive, command, parts, records, voice

REFUSED = "I can read text, photos and documents — not this kind of message, sorry."
REFUSED_VOICE_ON = "I can read text, photos, documents and voice messages — not this kind of message, sorry."
UNHEARD = "I couldn't transcribe that recording — please send it again or write it down."

@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "transcribe.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
async def running(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Any]:
    """Start a harness with the given environment; every one started is stopped at the end."""
    started: list[Harness] = []

    async def start(**env: str) -> Harness:
        h = Harness(tmp_path / "state", tg, fake_eve, **env)
        await h.start()
        started.append(h)
        return h

    try:
        yield start
    finally:
        for h in started:
            await h.stop()


async def test_voice_is_refused_by_default_as_before(running: Any, tg: FakeTelegram, fake_eve: FakeEve):
    """IVA_VOICE unset (refuse): a voice message, an audio file and a video note each get the
    short clear answer; eve hears of none of them."""
    h = await running()
    assert h.settings.voice.mode == "refuse"
    tg.files["v1"] = OGG
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await tg.message(None, user_id=OWNER, extra={"audio": {"file_id": "a1", "file_unique_id": "a1", "duration": 9}})
    await tg.message(None, user_id=OWNER, extra={"video_note": {
        "file_id": "n1", "file_unique_id": "n1", "length": 240, "duration": 4}})
    await h.settled()
    assert tg.texts() == [REFUSED] * 3
    assert parts(fake_eve) == []


async def test_a_recording_or_video_is_not_dropped_behind_its_caption(running: Any, tg: FakeTelegram,
                                                                      fake_eve: FakeEve):
    """A captioned voice message under refuse, and a captioned video under file, are refused —
    before, the caption went to eve alone and the recording was dropped without a word. With
    voice on, the answer says voice is read."""
    h = await running()
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG, caption="listen to this"))
    await h.settled()
    await h.stop()
    h = await running(IVA_VOICE="file")
    await tg.message(None, user_id=OWNER, extra={"caption": "look at this", "video": {
        "file_id": "vid", "file_unique_id": "vid", "width": 640, "height": 480, "duration": 5,
        "mime_type": "video/mp4", "file_size": 1000}})
    await h.settled()
    assert tg.texts() == [REFUSED, REFUSED_VOICE_ON]
    assert parts(fake_eve) == []


async def test_file_mode_sends_voice_audio_and_video_notes_as_file_parts(running: Any, tg: FakeTelegram,
                                                                         fake_eve: FakeEve):
    """IVA_VOICE=file: each recording reaches eve as a file part, with Telegram's media type and
    a file name, like a document."""
    h = await running(IVA_VOICE="file")
    tg.files.update(v1=OGG, a1=b"ID3 mp3 bytes", n1=b"\x00\x00\x00\x18ftypmp42")
    voice_msg = await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await h.settled()
    await tg.message(None, user_id=OWNER, extra={"caption": "the chorus", "audio": {
        "file_id": "a1", "file_unique_id": "a1", "duration": 9, "file_name": "song.mp3", "mime_type": "audio/mpeg",
        "file_size": 13}})
    await h.settled()
    note = await tg.message(None, user_id=OWNER, extra={"video_note": {
        "file_id": "n1", "file_unique_id": "n1", "length": 240, "duration": 4, "file_size": 12}})
    await h.settled()
    sent = parts(fake_eve)
    assert len(sent) == 3
    first, second, third = sent
    assert first == [{"type": "file", "mediaType": "audio/ogg", "filename": f"voice-{voice_msg['message_id']}.ogg",
                      "data": "data:audio/ogg;base64," + base64.b64encode(OGG).decode()}]
    assert second[0] == {"type": "text", "text": "the chorus"}
    assert {k: second[1][k] for k in ("mediaType", "filename")} == {"mediaType": "audio/mpeg", "filename": "song.mp3"}
    assert {k: third[0][k] for k in ("mediaType", "filename")} == {
        "mediaType": "video/mp4", "filename": f"video-note-{note['message_id']}.mp4"}
    received = [p for s in fake_eve.sessions.values() for p in s.parts.values()]
    assert [p["mediaType"] for ps in received for p in ps if p["type"] == "file"] == [
        "audio/ogg", "audio/mpeg", "video/mp4"]
    assert tg.texts()[0] == f"echo: [file: voice-{voice_msg['message_id']}.ogg (audio/ogg)]"


async def test_command_mode_sends_the_transcript_marked_and_removes_the_recording(
        running: Any, tg: FakeTelegram, fake_eve: FakeEve, script: Path, tmp_path: Path):
    """IVA_VOICE=command: the command gets the recording's path as its last argument (in a
    private 0700 directory, without the IVA_* settings in its environment); eve gets what it
    printed, marked as transcribed; the copy and its directory are gone afterwards."""
    record = tmp_path / "record.jsonl"
    h = await running(IVA_VOICE="command", IVA_TRANSCRIBE_CMD=command(script, "ok", record))
    tg.files.update(v1=OGG, n1=b"\x00\x00\x00\x18ftypmp42")
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await h.settled()
    await tg.message(None, user_id=OWNER, extra={"caption": "from the car", "video_note": {
        "file_id": "n1", "file_unique_id": "n1", "length": 240, "duration": 4, "file_size": 12}})
    await h.settled()
    assert parts(fake_eve) == [f"[voice message, transcribed] {TRANSCRIPT}",
                               f"from the car\n[video message, transcribed] {TRANSCRIPT}"]
    assert tg.texts() == [f"echo: [voice message, transcribed] {TRANSCRIPT}",
                          f"echo: from the car [video message, transcribed] {TRANSCRIPT}"]
    runs = records(record)
    assert len(runs) == 2
    for run, data, suffix in zip(runs, (OGG, b"\x00\x00\x00\x18ftypmp42"), (".ogg", ".mp4"), strict=True):
        assert run["argv"] == ["ok", str(record), run["path"]]
        assert run["path"].endswith(suffix) and bytes.fromhex(run["data"]) == data
        assert run["dir_mode"] == 0o700 and run["file_mode"] == 0o600
        assert run["iva_env"] == []
        assert not Path(run["path"]).exists() and not Path(run["path"]).parent.exists()


@pytest.mark.parametrize("mode", ["fail", "empty"])
async def test_a_failing_transcription_tells_the_person_in_one_line(running: Any, tg: FakeTelegram,
                                                                    fake_eve: FakeEve, script: Path,
                                                                    tmp_path: Path, mode: str):
    """A command that exits 1 (or prints nothing): the person gets one line, in reply to the
    recording; the recording does not go to eve; the chat is free for the next message."""
    record = tmp_path / "record.jsonl"
    h = await running(IVA_VOICE="command", IVA_TRANSCRIBE_CMD=command(script, mode, record))
    tg.files["v1"] = OGG
    sent = await tg.message(None, user_id=OWNER, extra=voice("v1", OGG, caption="my plan"))
    await h.settled()
    assert tg.texts() == [UNHEARD]
    assert tg.sent()[0]["reply_parameters"]["message_id"] == sent["message_id"]
    assert parts(fake_eve) == []
    assert not Path(records(record)[0]["path"]).parent.exists()
    await tg.message("still there?", user_id=OWNER)
    await h.settled()
    assert tg.texts() == [UNHEARD, "echo: still there?"]
    assert parts(fake_eve) == ["still there?"]


async def test_a_hanging_transcription_is_killed_at_the_timeout_and_nothing_waits_on_it(
        running: Any, tg: FakeTelegram, fake_eve: FakeEve, script: Path, tmp_path: Path):
    """A command that hangs (with a helper holding its output open) is killed with its helper at
    IVA_TRANSCRIBE_TIMEOUT and the person is told in one line. Meanwhile ingest goes on and another
    chat is answered; afterwards this chat answers again."""
    record = tmp_path / "record.jsonl"
    h = await running(IVA_VOICE="command", IVA_TRANSCRIBE_CMD=command(script, "hang", record),
                      IVA_TRANSCRIBE_TIMEOUT="3")
    tg.files["v1"] = OGG
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await h.until(lambda: records(record), what="the command to start")
    await tg.message("meanwhile", user_id=FRIEND)
    await tg.wait_for(lambda: "echo: meanwhile" in tg.texts(FRIEND), 30, "the other chat's answer")
    assert tg.texts(OWNER) == []  # answered while the transcription still hangs
    # The command hangs for good: the notice comes only if it was killed at the timeout (this
    # wait a failure bound; before: asserted as under 10 s of wall time).
    await tg.wait_for(lambda: tg.texts(OWNER) == [UNHEARD], 60, "the one-line notice")
    await h.settled()
    run = records(record)[0]
    assert not alive(run["pid"]) and not alive(run["helper"])
    assert not Path(run["path"]).parent.exists()
    await tg.message("hello again", user_id=OWNER)
    await h.settled()
    assert tg.texts(OWNER) == [UNHEARD, "echo: hello again"]
    assert parts(fake_eve) == ["meanwhile", "hello again"]


async def test_a_recording_without_transcript_leaves_the_rest_of_the_turn_to_go(
        running: Any, tg: FakeTelegram, fake_eve: FakeEve, script: Path, tmp_path: Path):
    """A recording and a text waiting together for the next turn: the recording's sender is
    told, the text goes to eve without it, the chat settles."""
    record = tmp_path / "record.jsonl"
    h = await running(IVA_VOICE="command", IVA_TRANSCRIBE_CMD=command(script, "fail", record))
    tg.files["v1"] = OGG
    await tg.message("think slowly [[delay=1.5]]", user_id=OWNER)
    await h.until(lambda: (c := h.maybe_chat()) is not None and c.busy, what="the first turn")
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG, caption="my plan"))
    await tg.message("and this", user_id=OWNER)
    await h.settled(30)
    assert tg.texts() == ["echo: think slowly", UNHEARD, "echo: and this"]
    assert parts(fake_eve) == ["think slowly [[delay=1.5]]", "and this"]
    assert len(records(record)) == 1


async def test_a_recording_steering_a_running_turn_is_answered_and_the_turn_goes_on(
        running: Any, tg: FakeTelegram, fake_eve: FakeEve, script: Path, tmp_path: Path):
    """IVA_TURN_POLICY=immediate: a recording without a transcript, meant for the running turn,
    is answered in one line while the turn goes on; it never reaches eve; what comes next does."""
    record = tmp_path / "record.jsonl"
    h = await running(IVA_VOICE="command", IVA_TRANSCRIBE_CMD=command(script, "fail", record),
                      IVA_TURN_POLICY="immediate")
    tg.files["v1"] = OGG
    await tg.message("think slowly [[delay=3]]", user_id=OWNER)
    await h.until(lambda: (c := h.maybe_chat()) is not None and c.busy, what="the first turn")
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await tg.wait_for(lambda: UNHEARD in tg.texts(), 10, "the one-line notice")
    assert "echo: think slowly" not in tg.texts()  # told while the turn still runs
    await h.settled(30)
    await tg.message("and this", user_id=OWNER)
    await h.settled(30)
    assert tg.texts() == [UNHEARD, "echo: think slowly", "echo: and this"]
    assert parts(fake_eve) == ["think slowly [[delay=3]]", "and this"]
    assert not (await h.chat()).busy


async def test_a_restart_before_the_transcription_loses_nothing(running: Any, tg: FakeTelegram,
                                                                fake_eve: FakeEve, script: Path, tmp_path: Path):
    """The recording is queued at ingest (by reference) and transcribed by the worker: a crash
    while the worker fetches it loses nothing — after the restart the transcript reaches eve."""
    record = tmp_path / "record.jsonl"
    env = {"IVA_VOICE": "command", "IVA_TRANSCRIBE_CMD": command(script, "ok", record)}
    h = await running(**env)
    tg.files["v1"] = OGG
    held = asyncio.Event()
    fetching = asyncio.Event()

    async def hold(_: dict[str, Any]) -> None:
        fetching.set()
        await held.wait()

    tg.hooks["getFile"] = hold
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await asyncio.wait_for(fetching.wait(), 10)
    await h.crash()
    del tg.hooks["getFile"]
    held.set()
    await h.start()
    await h.settled()
    assert parts(fake_eve) == [f"[voice message, transcribed] {TRANSCRIPT}"]
    assert tg.texts() == [f"echo: [voice message, transcribed] {TRANSCRIPT}"]


def test_voice_settings_and_their_errors(script: Path, tmp_path: Path):
    """IVA_VOICE takes refuse|file|command; command needs IVA_TRANSCRIBE_CMD, a command line whose
    program exists; IVA_TRANSCRIBE_TIMEOUT is at least 1 s (60 by default)."""
    base = {"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_EVE_URL": "http://127.0.0.1:3000", "IVA_OWNER_IDS": "1"}
    line = command(script, "ok", tmp_path / "r")
    good = Settings.from_env({**base, "IVA_VOICE": "Command", "IVA_TRANSCRIBE_CMD": line,
                              "IVA_TRANSCRIBE_TIMEOUT": "2.5"})
    assert good.voice.mode == "command" and good.voice.transcribe_timeout == 2.5
    assert good.voice.transcribe_cmd == (sys.executable, str(script), "ok", str(tmp_path / "r"))
    assert Settings.from_env(base).voice.transcribe_timeout == 60
    assert Settings.from_env({**base, "IVA_VOICE": "file"}).voice.mode == "file"
    unused = Settings.from_env({**base, "IVA_VOICE": "file", "IVA_TRANSCRIBE_CMD": "/nonexistent/whisper"})
    assert unused.voice.transcribe_cmd == ()  # only IVA_VOICE=command reads (and checks) it

    def problems(**env: str) -> list[str]:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({**base, **env})
        return caught.value.problems

    assert problems(IVA_VOICE="command") == [
        "IVA_VOICE=command needs IVA_TRANSCRIBE_CMD: the command that prints a transcript (the audio file's "
        "path is appended as its last argument)"]
    assert problems(IVA_VOICE="whisper") == ["IVA_VOICE='whisper' must be 'refuse', 'file' or 'command'"]
    assert problems(IVA_VOICE="command", IVA_TRANSCRIBE_CMD='whisper "--model') == [
        "IVA_TRANSCRIBE_CMD='whisper \"--model' is not a command line (No closing quotation)"]
    assert problems(IVA_VOICE="command", IVA_TRANSCRIBE_CMD="/nonexistent/whisper --fast") == [
        "IVA_TRANSCRIBE_CMD: '/nonexistent/whisper' is not an executable program"]
    assert problems(IVA_VOICE="command", IVA_TRANSCRIBE_CMD="no-such-transcriber-here x") == [
        "IVA_TRANSCRIBE_CMD: 'no-such-transcriber-here' is not an executable program on PATH"]
    assert problems(IVA_TRANSCRIBE_TIMEOUT="0") == ["IVA_TRANSCRIBE_TIMEOUT=0.0 must be at least 1.0"]
    assert problems(IVA_TRANSCRIBE_TIMEOUT="soon") == ["IVA_TRANSCRIBE_TIMEOUT='soon' is not a number of seconds"]


async def test_the_transcript_is_bounded_and_a_vanished_program_is_a_failure(tmp_path: Path):
    """A command that prints without end is read to its end but kept to MAX_TRANSCRIPT bytes,
    marked cut; a program gone since the configuration was checked fails like any other."""
    loud = tmp_path / "loud.py"
    loud.write_text("import sys\nsys.stdout.write('word ' * 200_000)\n")
    text = await Transcriber((sys.executable, str(loud)), timeout=30).transcribe(OGG, "voice-1.ogg")
    assert text.endswith("…") and len(text.encode()) <= MAX_TRANSCRIPT + len("…".encode())
    with pytest.raises(TranscribeFailed) as failed:
        await Transcriber((str(tmp_path / "gone"),), timeout=30).transcribe(OGG, "voice-1.ogg")
    assert failed.value.outcome == "failed" and "could not start" in str(failed.value)


HELD = r'''
import json, os, sys, time
record, gate = sys.argv[1], sys.argv[2]
with open(record, "a") as out:
    out.write(json.dumps({"event": "start", "pid": os.getpid()}) + "\n")
for _ in range(6000):  # until the test opens the gate (at most 120 s)
    if os.path.exists(gate):
        break
    time.sleep(0.02)
with open(record, "a") as out:
    out.write(json.dumps({"event": "end", "pid": os.getpid()}) + "\n")
print("hello from the recording")
'''


async def test_transcribers_run_in_a_bounded_pool(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """F13: four chats send a recording at once, the transcriber held until the test lets it go:
    two transcribe (TRANSCRIBERS), the other two wait for a slot without their recording
    downloaded — no third process (before: one per turn slot, sixteen at once). Let go, all four
    are answered with their transcripts."""
    from bridge.chat.transcribe import TRANSCRIBERS

    users = [OWNER, FRIEND, 3, 4]
    (tmp_path / "held.py").write_text(HELD)
    record, gate = tmp_path / "heard.jsonl", tmp_path / "go"
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_VOICE="command", IVA_ALLOWED_USER_IDS="2,3,4",
                IVA_TRANSCRIBE_CMD=shlex.join([sys.executable, str(tmp_path / "held.py"), str(record), str(gate)]))
    await h.start()
    try:
        for user in users:
            tg.files[f"v{user}"] = OGG
            await tg.message(None, user_id=user, extra=voice(f"v{user}", OGG))
        starts = lambda: [r for r in records(record) if r["event"] == "start"]  # noqa: E731
        await h.until(lambda: h.s.hearing.busy == TRANSCRIBERS == len(starts()) and h.s.hearing.waiting == 2, 60,
                      "two transcribing, two waiting")
        assert len(starts()) == TRANSCRIBERS == 2
        assert len(tg.calls_of("getFile")) == 2  # a waiting recording is not in memory yet
        gate.touch()
        await h.settled(60)
        assert all(TRANSCRIPT in " ".join(tg.texts(user)) for user in users), [tg.texts(u) for u in users]
        running, most = 0, 0
        for entry in records(record):
            running += 1 if entry["event"] == "start" else -1
            most = max(most, running)
        assert most == TRANSCRIBERS
    finally:
        gate.touch()
        await h.stop()
