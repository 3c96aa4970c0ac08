"""Shared fixtures: the fakes on loopback, and the real daemon as a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.eve import FakeEve
from tests.fakes.telegram import TOKEN, UNPACED, FakeTelegram, FloodLimits
from tests.fakes.waiting import settle, unsettled
from tests.zygote import spawn_bridge

ROOT = Path(__file__).resolve().parent.parent
OWNER = 1
FRIEND = 2
STRANGER = 666


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def tg_limited() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API with Telegram's flood limits on: a call that breaks one gets a 429."""
    fake = FakeTelegram(limits=FloodLimits())
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


# -- which tests run the bridge as a process --------------------------------------------------------
# A test that starts a real bridge process (the daemon fixtures, ``iva check``, ``python -m
# bridge``) carries ``@pytest.mark.process``: the mark is required on every test using a daemon
# fixture (checked at collection) and on every test that calls tests/zygote.py's spawn_bridge
# (checked when it does). tests/unit/test_process_budget.py counts the marked tests.

PROCESS_DIR = Path(__file__).resolve().parent / "process"
DAEMON_FIXTURES = frozenset({"bridge", "daemon_factory", "nb_daemon"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "process: the test starts a real bridge process (at most 50 such tests)")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's worker hook, which names each item's group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_groups(config, items)
    for item in items:  # what lives in tests/process/ is there because it needs the process
        if PROCESS_DIR in Path(str(item.path)).parents and item.get_closest_marker("process") is None:
            item.add_marker(pytest.mark.process)
    unmarked = [item.nodeid for item in items
                if DAEMON_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("process") is None]
    if unmarked:
        raise pytest.UsageError("these tests start the daemon without @pytest.mark.process: " + ", ".join(unmarked))


GROUP_LOST = pytest.StashKey[bool]()  # set on an item whose xdist group its node id does not carry
LOST_GROUP = ("pytest-xdist's loadgroup could not name this test's group in its node id (pytest 9.2 "
              "ignores that rename): the group's tests would spread over every worker. Use pytest < 9.2.")


def _check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--dist loadgroup`` every item marked ``xdist_group`` must carry its group in its
    node id (how pytest-xdist sends a group to one worker). pytest 9.2 ignores that rename, and
    the real-eve tests then spread over every worker, each starting an eve of its own: such a
    test fails at its setup (``_group_named``), saying why."""
    if not config.getoption("loadgroup", default=False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            item.stash[GROUP_LOST] = True


@pytest.fixture(autouse=True)
def _group_named(request: pytest.FixtureRequest) -> None:
    if request.node.stash.get(GROUP_LOST, False):
        pytest.fail(LOST_GROUP)


@pytest.fixture(autouse=True)
def _process_mark(request: pytest.FixtureRequest) -> Iterator[None]:
    import tests.zygote

    tests.zygote.PROCESS_ALLOWED = request.node.get_closest_marker("process") is not None
    yield
    tests.zygote.PROCESS_ALLOWED = False


FAKE_EVES: dict[str, FakeEve] = {}  # URL → the fake eve serving there (Daemon.settled looks in it)


@pytest.fixture
async def harness(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Any]:
    """The bridge in process on a temp store and the fakes (tests/fakes/telegram.py)."""
    from tests.harness import Harness

    h = Harness(tmp_path / "state", tg, fake_eve)
    await h.start()
    try:
        yield h
    finally:
        await h.stop()


@pytest.fixture
async def in_process_factory(tmp_path: Path, tg: FakeTelegram, fake_eve: FakeEve) -> AsyncIterator[Any]:
    """``make(**env)``: the bridge in process (tests/harness.py) with these settings, not yet
    started, seen as ``daemon_factory``'s daemons are (tests/harness.py's ``InProcess``)."""
    from tests.harness import Harness, InProcess

    made: list[Harness] = []

    def make(*, listen: bool = False, **env: str) -> InProcess:
        h = Harness(tmp_path / "state", tg, fake_eve, listen=listen, **env)
        made.append(h)
        return InProcess(h)

    yield make
    for h in made:
        await h.stop()


@pytest.fixture
async def in_process(in_process_factory: Any) -> Any:
    """The bridge in process, started: what a scenario-only test of the daemon runs on."""
    bridge = in_process_factory()
    await bridge.start()
    return bridge


@pytest.fixture
async def nb_in_process(in_process_factory: Any, fake_eve: FakeEve) -> Any:
    """``nb_daemon`` in process: the listener with the owner API (token ``tests.daemons.API_TOKEN``)
    and the notebook's MCP server, the fake eve calling it, notes on."""
    from tests.daemons import API_TOKEN

    bridge = in_process_factory(listen=True, IVA_API_TOKEN=API_TOKEN, IVA_CONTEXT_WINDOW="200000",
                                IVA_NOTES_ENABLED="1",
                                **({"IVA_MCP_TOKEN": fake_eve.mcp_token} if fake_eve.mcp_token else {}))
    fake_eve.mcp_url = bridge.api_url + "/mcp"
    await bridge.start()
    return bridge


@pytest.fixture
async def fake_eve(request: pytest.FixtureRequest) -> AsyncIterator[FakeEve]:
    """The fake eve, speaking eve 1.x's stream (version 27); a test marked ``eve_wire(26)``
    gets eve 0.80's (what only 0.80 does, kept for the reader's deprecation window)."""
    marker = request.node.get_closest_marker("eve_wire")
    fake = FakeEve(stream_version=marker.args[0]) if marker else FakeEve()
    await fake.start()
    FAKE_EVES[fake.url] = fake
    try:
        yield fake
    finally:
        FAKE_EVES.pop(fake.url, None)
        await fake.stop()


class Daemon:
    """``python -m bridge run`` as a real process, for end-to-end and crash tests."""

    def __init__(self, state: Path, env: dict[str, str], tg: FakeTelegram) -> None:
        self.state = state
        self.env = env
        self.tg = tg
        self.proc: Any = None  # an asyncio Process, or the zygote's BridgeProcess (tests/zygote.py)
        self.starts = 0
        self.log = state / "daemon.log"

    async def start(self, **overrides: str) -> None:
        env = {**os.environ, **self.env}
        env.pop("NOTIFY_SOCKET", None)
        env.update(overrides)
        # Ready once it polls Telegram, or (webhook mode, issue 15) once it set its webhook, which
        # it does only when its webhook listener serves.
        ready = "setWebhook" if env.get("IVA_TELEGRAM_WEBHOOK_URL") else "getUpdates"
        polls = len(self.tg.calls_of(ready))
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            self.proc = await spawn_bridge("run", env=env, stdout=out)
        await self.tg.wait_for(lambda: len(self.tg.calls_of(ready)) > polls or self._died(), 20,
                               f"the daemon to call {ready}")
        if self._died():
            raise AssertionError(f"daemon exited early:\n{self.log.read_text()[-3000:]}")

    def _died(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed, nothing said."""
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def terminate(self, timeout: float = 15) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.state / "iva.sqlite3")
        conn.row_factory = sqlite3.Row
        return conn

    def unsettled(self, *, eve: bool = True) -> list[str]:
        """What the daemon still has to do, as far as the outside can see; [] when nothing."""
        return unsettled(self.state / "iva.sqlite3", self.tg, FAKE_EVES.get(self.env["IVA_EVE_URL"]) if eve else None)

    async def settled(self, timeout: float = 30, *, eve: bool = True) -> None:
        """Wait until the daemon has nothing left to do (tests/fakes/waiting.py: every update
        confirmed, no chat busy, waiting for /new or watching a released compaction, no reply
        pending in the outbox, the queue empty, no Telegram call being answered and, with
        ``eve``, nothing in flight at the fake eve); then once more after its polling loop went
        round (a nudge), so a task it spawned on the way has started. Proves "nothing more
        happens" without sleeping. ``eve=False`` for a test that leaves eve busy on purpose (an
        abandoned compaction still running there)."""
        def died() -> str | None:
            return f"the daemon exited:\n{self.log.read_text()[-3000:]}" if self._died() else None

        await settle(lambda: self.unsettled(eve=eve), self.tg, timeout, died=died)

    def chat(self, address: str) -> dict[str, Any] | None:
        with self.db() as conn:
            row = conn.execute("SELECT * FROM chats WHERE address = ?", (address,)).fetchone()
            return dict(row) if row else None

    @property
    def api_url(self) -> str:
        return "http://" + self.env["IVA_API_LISTEN"]

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
async def daemon_factory(tmp_path: Path, tg: FakeTelegram):
    daemons: list[Daemon] = []

    def make(eve_url: str, eve_token: str, **env: str) -> Daemon:
        base = {
            "IVA_TELEGRAM_TOKEN": TOKEN,
            "IVA_TELEGRAM_API_URL": tg.url,
            "IVA_EVE_URL": eve_url,
            "IVA_EVE_TOKEN": eve_token,
            "IVA_STATE_DIR": str(tmp_path / "state"),
            "IVA_OWNER_IDS": str(OWNER),
            "IVA_ALLOWED_USER_IDS": str(FRIEND),
            "IVA_LANG": "en",
            "IVA_LOG_LEVEL": "debug",
            **UNPACED,  # not about pacing unless a test passes its own IVA_SEND_* (tests/fakes/telegram.py)
            # A daemon against the real eve listens where that eve's notebook connection points
            # (the URL is baked into eve's build, PROTOCOL.md §11).
            "IVA_API_LISTEN": MCP_LISTEN.get(eve_url) or f"127.0.0.1:{free_port()}",
            **env,
        }
        # S1: the token eve's notebook connection sends (the real eve's build, or a fake's mcp_token).
        fake = FAKE_EVES.get(eve_url)
        mcp_token = MCP_TOKENS.get(eve_url) or (fake.mcp_token if fake is not None else None)
        if mcp_token and "IVA_MCP_TOKEN" not in env:
            base["IVA_MCP_TOKEN"] = mcp_token
        state = Path(base["IVA_STATE_DIR"])
        state.mkdir(parents=True, exist_ok=True)
        daemon = Daemon(state, base, tg)
        daemons.append(daemon)
        return daemon

    yield make
    for daemon in daemons:
        if daemon.proc and daemon.proc.returncode is None:
            try:
                await daemon.terminate(10)
            except TimeoutError:
                await daemon.kill()
    # S5: every line every daemon of the suite wrote is checked for the secrets it was given.
    for daemon in daemons:
        leaks = secret_leaks(daemon.log, daemon.env)
        assert not leaks, f"a secret in {daemon.log}: {leaks[:3]}"


def secret_leaks(log: Path, env: dict[str, str]) -> list[str]:
    """Lines of ``log`` holding a secret of ``env`` (the bot token or its secret part, eve's,
    the owner API's and the MCP server's tokens)."""
    if not log.exists():
        return []
    secrets = [env.get(name) for name in ("IVA_TELEGRAM_TOKEN", "IVA_EVE_TOKEN", "IVA_API_TOKEN", "IVA_MCP_TOKEN")]
    forms = {s for s in secrets if s and len(s) >= 8}
    forms |= {s.partition(":")[2] for s in forms if len(s.partition(":")[2]) >= 8}
    return [line[:300] for line in log.read_text(errors="replace").splitlines() if any(f in line for f in forms)]


@pytest.fixture
async def bridge(daemon_factory, fake_eve: FakeEve) -> Daemon:
    """A daemon against the fake eve, started."""
    daemon = daemon_factory(fake_eve.url, fake_eve.token)
    await daemon.start()
    return daemon


@pytest.fixture
async def nb_daemon(daemon_factory, fake_eve: FakeEve) -> Daemon:
    """A daemon with the owner API (token ``tests.daemons.API_TOKEN``) and the notebook's MCP
    server, the fake eve calling it."""
    from tests.daemons import API_TOKEN

    d = daemon_factory(fake_eve.url, fake_eve.token, IVA_API_TOKEN=API_TOKEN, IVA_CONTEXT_WINDOW="200000")
    fake_eve.mcp_url = d.api_url + "/mcp"
    await d.start()
    return d


# -- the real eve (../shared/eve-peer) --------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MCP_LISTEN: dict[str, str] = {}  # real eve URL → the listen address its notebook MCP URL names
MCP_TOKENS: dict[str, str] = {}  # real eve URL → the bearer token its notebook connection sends
REAL_MCP_TOKEN = "iva-mcp-test-token"

EVE_PEER = Path(os.environ.get("IVA_EVE_PEER_DIR", ROOT.parent / "shared" / "eve-peer"))


class RealEve:
    def __init__(self, env: dict[str, str], run_dir: Path) -> None:
        self.env = env
        self.url = env["EVE_BASE_URL"]
        self.token = env["EVE_PEER_TOKEN"]
        self.llm_url = env["FAKE_LLM_BASE_URL"]
        self.run_dir = run_dir
        self.script_env: dict[str, str] = {}
        self.mcp_listen = ""
        self.version = env.get("EVE_VERSION", "0.80.1")
        self.wire = 26 if self.version.startswith("0.80") else 27

    def llm_requests(self) -> list[dict[str, Any]]:
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.llm_url}/requests", timeout=10) as response:
            data = json.loads(response.read())
        return data["requests"] if isinstance(data, dict) else data

    def restart_eve(self, *, kill: bool) -> None:
        """eve only (the scripted model keeps running), with its durable store kept."""
        import subprocess

        stop = ["bash", str(EVE_PEER / "stop.sh"), "--eve-only"] + (["--kill"] if kill else [])
        subprocess.run(stop, env=self.script_env, capture_output=True, timeout=60, check=True, stdin=subprocess.DEVNULL)
        subprocess.run(["bash", str(EVE_PEER / "start.sh"), "--eve-only", "--keep-state"], env=self.script_env,
                       capture_output=True, timeout=300, check=True, stdin=subprocess.DEVNULL)

    def control(self, **values: Any) -> None:
        """The scripted model's control endpoint (fake_llm.py), e.g. next_summary_delay=3."""
        import json
        import urllib.request

        request = urllib.request.Request(f"{self.llm_url}/control", data=json.dumps(values).encode(),
                                         headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass


EVE_VERSIONS = ("0.80.1", "1.0.1")  # the eves Iva is tested against: 0.80.x (stream 26) and 1.x (stream 27)


def _start_real_eve(tmp_path_factory: pytest.TempPathFactory, version: str) -> Iterator[RealEve]:
    import subprocess

    if os.environ.get("IVA_SKIP_REAL_EVE") == "1":
        pytest.skip("IVA_SKIP_REAL_EVE=1: real-eve contract tests skipped on request")
    if not (EVE_PEER / "start.sh").exists():
        pytest.fail(f"no eve-peer at {EVE_PEER}; set IVA_EVE_PEER_DIR")
    run_dir = tmp_path_factory.mktemp(f"eve-peer-{version}")
    mcp_listen = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "EVE_VERSION": version, "EVE_PORT": str(free_port()), "FAKE_LLM_PORT": str(free_port()),
           "EVE_PEER_RUN_DIR": str(run_dir), "NOTEBOOK_MCP_URL": f"http://{mcp_listen}/mcp",
           "NOTEBOOK_MCP_TOKEN": REAL_MCP_TOKEN, "EVE_PEER_HITL_TOOLS": "1"}  # questions and approvals
    done = subprocess.run(["bash", str(EVE_PEER / "start.sh")], env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.fail(f"eve-peer {version} did not start:\n{done.stdout}\n{done.stderr}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    peer = RealEve({"EVE_VERSION": version, **values}, run_dir)
    peer.script_env = env
    peer.mcp_listen = mcp_listen
    MCP_LISTEN[peer.url] = mcp_listen
    MCP_TOKENS[peer.url] = REAL_MCP_TOKEN
    yield peer
    subprocess.run(["bash", str(EVE_PEER / "stop.sh")], env=env, capture_output=True, timeout=60,
                   stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def real_eve_0801(tmp_path_factory) -> Iterator[RealEve]:
    """The real eve 0.80.1 (stream version 26) with the scripted model, for the whole session."""
    yield from _start_real_eve(tmp_path_factory, "0.80.1")


@pytest.fixture(scope="session")
def real_eve_101(tmp_path_factory) -> Iterator[RealEve]:
    """The real eve 1.0.1 (stream version 27: what npm installs today) with the scripted model."""
    yield from _start_real_eve(tmp_path_factory, "1.0.1")


def _real_fixture(version: str) -> str:
    return "real_eve_" + version.replace(".", "")


@pytest.fixture(scope="session", params=EVE_VERSIONS)
def real_eve(request) -> RealEve:
    """Each real eve in turn: a test that takes it runs against 0.80.1 and 1.0.1 (contract)."""
    peer: RealEve = request.getfixturevalue(_real_fixture(request.param))
    return peer


class Backend:
    """Either eve: the fake (with fault controls) or the real one (contract)."""

    def __init__(self, name: str, url: str, token: str, fake: FakeEve | None, real: RealEve | None) -> None:
        self.name, self.url, self.token, self.fake, self.real = name, url, token, fake, real

    @property
    def wire(self) -> int:
        """The stream version this eve speaks (26: eve 0.80.x, 27: eve 1.x)."""
        if self.fake is not None:
            return self.fake.stream_version
        assert self.real is not None
        return self.real.wire

    def slow_summary(self, seconds: float) -> None:
        """Make the next compaction's summary take ``seconds``."""
        if self.fake is not None:
            self.fake.summary_delay = seconds
        else:
            assert self.real is not None
            self.real.control(next_summary_delay=seconds)

    def running(self, text: str) -> bool:
        """eve is running the turn of the message ``text`` (the model has it, on the real eve)."""
        if self.fake is not None:
            return any(s.running and any(text in str(b.get("message")) for b in s.sends)
                       for s in self.fake.sessions.values())
        assert self.real is not None
        return any(text in str(r.get("latest_user") or r.get("preview")) for r in self.real.llm_requests())


REAL = pytest.mark.xdist_group("real_eve")  # every real-eve test on one worker: one eve, less load
# the real-eve tests that start an eve of their own (an upgrade, a budget build): beside REAL's worker
REAL_OWN = pytest.mark.xdist_group("real_eve_own")


@pytest.fixture(params=["fake", *(pytest.param(f"real-{v}", marks=REAL) for v in EVE_VERSIONS)])
async def backend(request) -> AsyncIterator[Backend]:
    if request.param == "fake":
        fake = FakeEve()
        await fake.start()
        FAKE_EVES[fake.url] = fake
        try:
            yield Backend("fake", fake.url, fake.token, fake, None)
        finally:
            FAKE_EVES.pop(fake.url, None)
            await fake.stop()
    else:
        real = request.getfixturevalue(_real_fixture(request.param.removeprefix("real-")))
        yield Backend(request.param, real.url, real.token, None, real)


@pytest.fixture
async def eve_in_process_factory(tmp_path: Path, tg: FakeTelegram) -> AsyncIterator[Any]:
    """``make(url, token, fake=None, listen=False, **env)``: the bridge in process (an InProcess,
    not yet started) against any eve — a ``Backend``'s ``.url, .token, .fake``, or the real eve's.
    Against the real eve it listens where that eve's notebook connection points (MCP_LISTEN, the
    URL baked into its build) and takes that connection's token, as ``daemon_factory`` does."""
    from tests.harness import Harness, InProcess

    made: list[Harness] = []
    recorder = BodyRecorder()

    def make(url: str, token: str, fake: FakeEve | None = None, *, listen: bool = False, **env: str) -> InProcess:
        if url in MCP_LISTEN:
            listen = True
            env = {"IVA_API_LISTEN": MCP_LISTEN[url], "IVA_MCP_TOKEN": MCP_TOKENS[url], **env}
        elif fake is not None and fake.mcp_token and "IVA_MCP_TOKEN" not in env:
            env = {"IVA_MCP_TOKEN": fake.mcp_token, **env}
        h = Harness(tmp_path / "state", tg, fake, eve_url=url, eve_token=token, listen=listen,
                    eve_transport=recorder if fake is None else None, **env)
        made.append(h)
        return InProcess(h)

    yield make
    for h in made:
        await h.stop()
    await recorder.aclose()
    # V3: eve 1.x answers 400 to any field it does not know; no body Iva sent a real eve was refused.
    assert [r for r in recorder.seen if r[3] == 400] == []


class BodyRecorder(httpx.AsyncBaseTransport):
    """eve_client's transport seam against a real eve: every request and its status, recorded."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[tuple[str, str, bytes, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = b""
        response = await self.inner.handle_async_request(request)
        self.seen.append((request.method, request.url.path, body, response.status_code))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()
