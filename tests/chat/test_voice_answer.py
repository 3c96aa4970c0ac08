"""Voice for voice (issue 24, P4, IVA_SPEAK_CMD), in process on the fakes: the answer to a voice
message comes as text and as a voice message (sendVoice, OGG/Opus); a failing, hanging or
wrong speaker costs the voice only, said once in the log.

The speaker is a small Python script written here (run by ``sys.executable``): it records what
it got (its standard input, its working directory's mode, the IVA_* variables it sees, its pid)
and prints fake OGG audio, fails, prints something else, or hangs with a helper."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from bridge.chat.speak import Speaker, SpeakFailed
from bridge.config import ConfigError, Settings
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, FakeTelegram
from tests.harness import FRIEND, OWNER, Harness
from tests.scenarios import OGG, SCRIPT, alive, voice

SPEAKER = r'''
import json, os, stat, subprocess, sys, time
mode, record = sys.argv[1], sys.argv[2]
text = sys.stdin.read()
entry = {"text": text, "pid": os.getpid(), "cwd_mode": stat.S_IMODE(os.stat(os.getcwd()).st_mode),
         "cwd": os.getcwd(), "iva_env": sorted(k for k in os.environ if k.startswith("IVA_"))}
if mode == "hang":
    entry["helper"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]).pid
with open(record, "a") as out:
    out.write(json.dumps(entry) + "\n")
if mode == "ok":
    sys.stdout.buffer.write(b"OggS\x00\x02" + text.encode())
elif mode == "fail":
    print("no voice model", file=sys.stderr)
    sys.exit(3)
elif mode == "wav":
    sys.stdout.buffer.write(b"RIFF....WAVEfmt ")
elif mode == "hang":
    time.sleep(120)
'''


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
async def speaking(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Any]:
    """A harness that transcribes voice and speaks its answers with the script in ``mode``."""
    started: list[Harness] = []
    (tmp_path / "speak.py").write_text(SPEAKER)
    (tmp_path / "transcribe.py").write_text(SCRIPT)

    async def start(mode: str, **env: str) -> tuple[Harness, Path]:
        record = tmp_path / f"speak-{mode}.jsonl"
        h = Harness(tmp_path / "state", tg, fake_eve, IVA_VOICE="command",
                    IVA_TRANSCRIBE_CMD=shlex.join([sys.executable, str(tmp_path / "transcribe.py"), "ok",
                                                   str(tmp_path / "heard.jsonl")]),
                    IVA_SPEAK_CMD=shlex.join([sys.executable, str(tmp_path / "speak.py"), mode, str(record)]),
                    **env)
        await h.start()
        started.append(h)
        return h, record

    try:
        yield start
    finally:
        for h in started:
            await h.stop()


async def test_voice_in_voice_and_text_out(speaking: Any, tg: FakeTelegram):
    h, record = await speaking("ok")
    tg.files["v1"] = OGG
    await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
    await h.settled()
    [text] = tg.texts(OWNER)
    assert text.startswith("echo: ") and "hello from the recording" in text  # the text is kept
    [sent] = await tg.wait_for(lambda: tg.voices(OWNER), 15, "the voice answer")
    [heard] = records(record)
    assert heard["text"] == text  # the answer's plain text on stdin
    assert sent["voice"]["data"] == b"OggS\x00\x02" + text.encode() and sent["voice"]["filename"] == "answer.ogg"
    assert heard["cwd_mode"] == 0o700 and not Path(heard["cwd"]).exists()  # private, and removed
    assert heard["iva_env"] == []  # the settings (the bot token) are not its business

    await tg.message("and in writing?", user_id=OWNER)  # a text message: answered in text only
    await h.settled()
    assert tg.texts(OWNER)[-1] == "echo: and in writing?"
    assert len(tg.voices(OWNER)) == 1 and len(records(record)) == 1


@pytest.mark.parametrize("mode", ["fail", "wav", "hang"])
async def test_a_failing_or_hanging_speaker_falls_back_to_text(speaking: Any, tg: FakeTelegram, mode: str):
    h, record = await speaking(mode, IVA_SPEAK_TIMEOUT="1")
    tg.files["v1"] = OGG
    with structlog.testing.capture_logs() as logs:
        await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
        await h.settled()
        await tg.wait_for(lambda: [e for e in logs if e["event"] == "voice_answer_failed"], 15, "the log line")
        await tg.nudge()
    [text] = tg.texts(OWNER)
    assert "hello from the recording" in text  # the person has the answer
    assert tg.voices(OWNER) == [] and tg.calls_of("sendVoice") == []
    failed = [e for e in logs if e["event"] == "voice_answer_failed"]
    assert len(failed) == 1 and failed[0]["fallback"] == "text only"
    assert failed[0]["outcome"] == {"fail": "failed", "wav": "not_ogg", "hang": "timeout"}[mode]
    if mode == "hang":  # its whole process group is gone, the helper too
        [heard] = records(record)
        assert not alive(heard["pid"]) and not alive(heard["helper"])
    # The chat is free: the next message is answered as ever.
    await tg.message("still here?", user_id=OWNER)
    await h.settled()
    assert tg.texts(OWNER)[-1] == "echo: still here?"


async def test_the_speaker_is_off_by_default_and_its_program_must_exist(tmp_path: Path):
    base = {"IVA_TELEGRAM_TOKEN": TOKEN, "IVA_EVE_URL": "http://127.0.0.1:3000"}
    assert Settings.from_env(base).voice.speak_cmd == () and Speaker.from_settings(Settings.from_env(base)) is None
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({**base, "IVA_SPEAK_CMD": "no-such-speaker --voice en"})
    assert any("IVA_SPEAK_CMD" in p and "no-such-speaker" in p for p in caught.value.problems)
    speaker = Speaker((sys.executable, "-c", "import sys; sys.stdout.write('not audio')"), 5)
    with pytest.raises(SpeakFailed) as failed:
        await speaker.speak("hello")
    assert failed.value.outcome == "not_ogg"


@pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("opusenc")),
                    reason="needs Debian's espeak-ng and opus-tools (docs/people.md's example)")
async def test_the_documented_speaker_makes_ogg_opus(tmp_path: Path):
    """docs/people.md's speaker, as written there, through Iva's Speaker: OGG/Opus out."""
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "people.md").read_text()
    body = page.split("<<'SPEAKER'\n", 1)[1].split("\nSPEAKER\n", 1)[0]
    script = tmp_path / "iva-speak"
    script.write_text(body + "\n")
    script.chmod(0o755)
    audio = await Speaker((str(script), "en"), 30).speak("Hello. This is Iva, answering aloud.")
    assert audio.startswith(b"OggS") and b"OpusHead" in audio[:200] and len(audio) > 1000


GATED = r'''
import json, os, sys, time
record, gate = sys.argv[1], sys.argv[2]
text = sys.stdin.read()
with open(record, "a") as out:
    out.write(json.dumps({"event": "start", "text": text}) + "\n")
for _ in range(6000):  # until the test opens the gate (at most 120 s)
    if os.path.exists(gate):
        break
    time.sleep(0.02)
with open(record, "a") as out:
    out.write(json.dumps({"event": "end", "text": text}) + "\n")
sys.stdout.buffer.write(b"OggS\x00\x02" + text.encode())
'''
THIRD = 3


async def test_speakers_run_in_a_bounded_pool_and_a_chats_voices_come_in_order(tmp_path: Path, tg: FakeTelegram,
                                                                                fake_eve: FakeEve):
    """F13: four voice answers in three chats, the speaker held until the test lets it go: two
    speakers run (SPEAKERS), the other two answers wait in the queue — no third process (before:
    one process per answer at once, each holding up to 20 MB). Let go, every voice comes; the
    owner's two come in the order of their answers, each after its text."""
    from bridge.chat.voices import SPEAKERS

    (tmp_path / "speak.py").write_text(GATED)
    (tmp_path / "transcribe.py").write_text(SCRIPT)
    record, gate = tmp_path / "speak.jsonl", tmp_path / "go"
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_VOICE="command", IVA_ALLOWED_USER_IDS=f"{FRIEND},{THIRD}",
                IVA_TRANSCRIBE_CMD=shlex.join([sys.executable, str(tmp_path / "transcribe.py"), "ok",
                                               str(tmp_path / "heard.jsonl")]),
                IVA_SPEAK_CMD=shlex.join([sys.executable, str(tmp_path / "speak.py"), str(record), str(gate)]))
    await h.start()
    try:
        for n, (user, caption) in enumerate([(OWNER, "one"), (FRIEND, "three"), (THIRD, "four")]):
            tg.files[f"v{n}"] = OGG
            await tg.message(None, user_id=user, extra=voice(f"v{n}", OGG, caption=caption))
        await h.until(lambda: all(tg.texts(u) for u in (OWNER, FRIEND, THIRD)), 60, "the three answers' texts")
        tg.files["v3"] = OGG
        await tg.message(None, user_id=OWNER, extra=voice("v3", OGG, caption="two"))  # a turn of its own
        await h.until(lambda: len(tg.texts(OWNER)) == 2, 60, "the owner's second answer's text")
        starts = lambda: [r for r in records(record) if r["event"] == "start"]  # noqa: E731
        await h.until(lambda: h.s.voices.speaking == SPEAKERS == len(starts()) and h.s.voices.waiting == 2, 60,
                      "two speakers running, two answers waiting")
        assert len(starts()) == SPEAKERS == 2 and tg.voices() == []
        gate.touch()
        await h.until(lambda: len(tg.voices()) == 4, 60, "every voice")
        running, most = 0, 0
        for entry in records(record):
            running += 1 if entry["event"] == "start" else -1
            most = max(most, running)
        assert most == SPEAKERS
        owner = [c for c in tg.calls if c.params.get("chat_id") == OWNER and c.method in ("sendMessage", "sendVoice")
                 and c.params.get("_ok", True)]
        said = [("text" if c.method == "sendMessage" else "voice", "one" if "one" in str(c.params) else "two")
                for c in owner]
        assert [what for kind, what in said if kind == "voice"] == ["one", "two"], said  # in order
        assert all(said.index(("text", what)) < said.index(("voice", what)) for what in ("one", "two")), said
    finally:
        gate.touch()
        await h.stop()
