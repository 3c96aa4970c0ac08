"""Real bridge processes without paying the imports each time (test infrastructure only).

Importing aiogram builds ~900 pydantic models: about 3 s of CPU per ``python -m bridge`` on these
machines, and the suite starts well over a hundred of them (daemons for end-to-end and SIGKILL
tests, ``iva check`` runs). The zygote is one process per test worker that imports the bridge
once and then forks a child for each start: the child is a real process (its own pid, SIGKILL
kills it mid-write, its exit code is the one ``main`` returns), its environment and working
directory are the test's, and its stdin/stdout/stderr are the test's file descriptors, passed
over a Unix socket. Only the imports are shared, and they happened before anything ran.

``IVA_TEST_ZYGOTE=0`` makes :func:`spawn_bridge` exec ``python -m bridge`` instead; some tests
always exec (the systemd unit, the emulator, SIGTERM during start), so that path stays covered.

The zygote holds no threads and no event loop (fork is safe); the test worker holds its stdin:
when the worker goes, the zygote SIGKILLs the children it still has and exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
PIPE = asyncio.subprocess.PIPE
STDOUT = asyncio.subprocess.STDOUT
DEVNULL = asyncio.subprocess.DEVNULL


# -- the zygote's side -------------------------------------------------------------------------

def _serve(path: str) -> None:
    import random

    import bridge.app  # the point: everything a start needs, imported once
    import bridge.cli
    import bridge.intake.webhook

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, ("accept",))
    sel.register(sys.stdin, selectors.EVENT_READ, ("parent",))
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd → (pid, the requester's connection)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in sel.select():
            kind = key.data[0]
            if kind == "parent":
                if not os.read(sys.stdin.fileno(), 4096):  # the test worker is gone
                    for pid, _ in children.values():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    return
            elif kind == "accept":
                conn, _ = listener.accept()
                msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(msg)
                pid = os.fork()
                if pid == 0:
                    resources: list[Any] = [listener, conn, sel, *(c for _, c in children.values())]
                    _child(request, fds, resources, list(children), random, bridge.cli.main)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
                conn.send(json.dumps({"pid": pid}).encode())
            else:
                pidfd = key.data[1]
                sel.unregister(pidfd)
                os.close(pidfd)
                pid, conn = children.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                conn.close()


def _child(request: dict[str, Any], fds: list[int], resources: list[Any], pidfds: list[int],
           random: Any, main: Any) -> None:
    code = 1
    try:
        for resource in resources:
            resource.close()
        for fd in pidfds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()  # the zygote's generator state is every child's otherwise
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = [sys.executable, *request["argv"]]
        code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# -- the test's side ---------------------------------------------------------------------------

class _Zygote:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="iva-zygote-")
        self.path = os.path.join(self.dir, "sock")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", self.path], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != b"ready\n":
            raise RuntimeError(f"the test zygote did not start: {line!r}")
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # the zygote kills its children and ends
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.dir)


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _get_zygote() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = _Zygote()
        return _zygote


class BridgeProcess:
    """The part of :class:`asyncio.subprocess.Process` the tests use, for a zygote's child."""

    def __init__(self, conn: socket.socket, pid: int, stdout: asyncio.StreamReader | None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = stdout
        self._conn = conn
        self._exited = asyncio.Event()
        self._watch = asyncio.get_running_loop().create_task(self._watcher())

    async def _watcher(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            msg = await loop.sock_recv(self._conn, 4096)
            self.returncode = json.loads(msg)["exit"] if msg else -signal.SIGKILL
        finally:
            self._conn.close()
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def communicate(self) -> tuple[bytes, None]:
        out = await self.stdout.read() if self.stdout is not None else b""
        await self.wait()
        return out, None


async def spawn_bridge(*argv: str, env: dict[str, str], stdout: int | IO[Any] = PIPE,
                       stderr: int | IO[Any] = STDOUT, cwd: Path = ROOT) -> Any:
    """``python -m bridge *argv`` as a real process: a zygote's child, or exec'd (IVA_TEST_ZYGOTE=0).
    stdin is /dev/null; stdout is PIPE or a file; stderr is STDOUT or a file."""
    if os.environ.get("IVA_TEST_ZYGOTE", "1") == "0":
        return await asyncio.create_subprocess_exec(sys.executable, "-m", "bridge", *argv, cwd=cwd, env=env,
                                                    stdin=DEVNULL, stdout=stdout, stderr=stderr)
    zygote = await asyncio.to_thread(_get_zygote)
    loop = asyncio.get_running_loop()
    opened: list[int] = [os.open(os.devnull, os.O_RDONLY)]
    reader: asyncio.StreamReader | None = None
    try:
        if stdout == PIPE:
            read_end, write_end = os.pipe()
            opened.append(write_end)
            reader = asyncio.StreamReader()
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                         os.fdopen(read_end, "rb", buffering=0))
            out_fd = write_end
        else:
            assert not isinstance(stdout, int)
            out_fd = stdout.fileno()
        err_fd = out_fd if stderr == STDOUT else (stderr.fileno() if not isinstance(stderr, int) else stderr)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(zygote.path)
        request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd)}).encode()
        socket.send_fds(conn, [request], [opened[0], out_fd, err_fd])
    finally:
        for fd in opened:
            os.close(fd)
    conn.setblocking(False)
    msg = await loop.sock_recv(conn, 4096)
    if not msg:
        raise RuntimeError("the test zygote closed the connection without a child")
    return BridgeProcess(conn, json.loads(msg)["pid"], reader)


if __name__ == "__main__":
    _serve(sys.argv[1])
