"""Media in an eve outage (I4, T8): a turn with a photo and a voice message, queued while eve is
unreachable, is composed once — one download of each file, one transcription — however many
times the worker tries eve, and neither runs again when eve is back; a transcriber does not run
while the turn holds a file slot. In process, with the fakes; the outage is below eve_client
(connection refused at the transport)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from bridge.metrics import METRICS
from tests.fakes.eve import FakeEve
from tests.fakes.telegram import FakeTelegram
from tests.harness import OWNER, Harness
from tests.scenarios import OGG, SCRIPT, TRANSCRIPT, command, parts, records, voice

PNG = b"\x89PNG\r\n\x1a\nfake image"


class Outage(httpx.AsyncBaseTransport):
    """eve's host refuses connections while ``down``."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.down = True
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            self.refused += 1
            raise httpx.ConnectError("injected: connection refused", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_turn_with_files_is_composed_once_across_an_eve_outage(tmp_path: Path, tg: FakeTelegram,
                                                                       fake_eve: FakeEve):
    """Before: every retry downloaded the photo and transcribed the recording again (and held a
    file slot while the transcriber ran); now once each, kept with the turn until eve has it."""
    script = tmp_path / "transcribe.py"
    script.write_text(SCRIPT)
    record = tmp_path / "record.jsonl"
    outage = Outage()
    h = Harness(tmp_path / "state", tg, fake_eve, eve_transport=outage, IVA_VOICE="command",
                IVA_TRANSCRIBE_CMD=command(script, "ok", record))
    await h.start()
    try:
        tg.files.update(v1=OGG, p1=PNG)
        await tg.message(None, user_id=OWNER, extra={"caption": "look", "photo": [
            {"file_id": "p1", "file_unique_id": "p1", "width": 80, "height": 60, "file_size": len(PNG)}]})
        await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
        tries = METRICS.eve_errors.labels(kind="transport")
        before = tries._value.get()
        await h.until(lambda: tries._value.get() >= before + 3, 40, what="three tries of eve in the outage")
        assert len(records(record)) == 1  # transcribed once
        assert [c["file_id"] for c in tg.calls_of("getFile")].count("p1") == 1  # downloaded once
        assert [c["file_id"] for c in tg.calls_of("getFile")].count("v1") == 1
        outage.down = False
        await h.settled(40)
        assert len(records(record)) == 1
        assert [c["file_id"] for c in tg.calls_of("getFile")].count("p1") == 1
        sent = parts(fake_eve)
        assert any(TRANSCRIPT in str(p) for p in sent)
        assert any(isinstance(p, list) and any(x.get("type") == "file" for x in p) for p in sent)
        assert len(tg.texts()) == len(sent)  # each turn answered once
        assert not h.s.media._parts and not h.s.media._heard  # given up once eve had the turn
    finally:
        await h.stop()


async def test_no_transcriber_runs_while_a_file_slot_is_held(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve):
    """A recording is heard with every file slot free (before: its turn took a slot, then waited
    on the transcriber inside it, so two slow transcriptions held every turn with files)."""
    script = tmp_path / "transcribe.py"
    script.write_text(SCRIPT.replace('if mode == "ok":',
                                     'if mode == "slow":\n    time.sleep(1)\n    mode = "ok"\nif mode == "ok":', 1))
    record = tmp_path / "record.jsonl"
    h = Harness(tmp_path / "state", tg, fake_eve, IVA_VOICE="command",
                IVA_TRANSCRIBE_CMD=command(script, "slow", record))
    await h.start()
    try:
        tg.files.update(v1=OGG)
        free: list[bool] = []

        async def watch() -> None:  # while the command runs (it wrote its record, then sleeps)
            while not free:
                if record.exists():
                    free.append(not h.s.files.locked() and h.s.files._value == 2)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        try:
            await tg.message(None, user_id=OWNER, extra=voice("v1", OGG))
            await h.settled(30)
        finally:
            watcher.cancel()
        assert free == [True]
        assert tg.texts() == [f"echo: [voice message, transcribed] {TRANSCRIPT}"]
    finally:
        await h.stop()
