"""The judge's end of the fork-server line: how it starts an implementation's worker, forked by
:mod:`impls.fork_server` on Linux, ``python -m impls.worker_process`` elsewhere.

Both give the process the environment the judge lets through, the ``sys.path`` it names (set only
once the worker is confined) and the judge's current directory, and nothing of the judge's own
state; forking from the fork server spares each worker the interpreter's start and NumPy's
import. Both are started isolated (:func:`isolated_command`): the fork server is unconfined, and
a ``zipfile.py`` beside a candidate kernel must not be imported there. The fork server is started
once per judge process and environment (a judge that changes its environment gets another, so
the variables a library reads at import - thread counts - are the ones the worker is started
with). :class:`ForkedWorker` is the part of ``subprocess.Popen`` that
:class:`conformance.run.worker_clients.ProcessChannel` uses.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import IO

from impls.messages import (
    Refused,
    StartWorker,
    StillRunning,
    WaitForWorker,
    WorkerExited,
    WorkerStarted,
    dumps,
    loads,
)
from impls.sandbox import SUITE_ROOT, WorkerBounds

# Runs a module as ``python -m`` would, from SUITE_ROOT and the installation alone: under -I,
# Python puts neither the current directory nor $PYTHONPATH on sys.path, nor reads any PYTHON*
# variable.
BOOTSTRAP = (
    "import runpy, sys; root, module = sys.argv[1:3]; del sys.argv[1:3]; "
    "sys.path.insert(0, root); runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def isolated_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS``, isolated from the current directory and the environment's
    Python variables: nothing but the interpreter's own paths and the suite's is importable."""
    return [sys.executable, "-I", "-c", BOOTSTRAP, str(SUITE_ROOT), module, *args]


# macOS forks badly once system frameworks are loaded (Python's multiprocessing stopped forking
# there for that), and Windows cannot fork.
WORKERS_ARE_FORKED = sys.platform == "linux"
FORK_SERVER_GRACE = 30.0  # seconds the fork server may take to answer beyond a wait asked of it


class ForkServerGone(ChildProcessError):
    """The fork server ended or stopped answering; what it knew of its workers went with it."""


class ForkServer:
    """A running :mod:`impls.fork_server` and the judge's end of its line."""

    def __init__(self, env: dict[str, str]):
        judge_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            isolated_command("impls.fork_server", str(server_end.fileno()), str(os.getpid())),
            pass_fds=(server_end.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        server_end.close()
        self.line = judge_end
        self.lock = threading.Lock()
        self.gone = False

    def ask(
        self,
        request: StartWorker | WaitForWorker,
        fds: tuple[int, ...] = (),
        timeout: float | None = None,
    ) -> WorkerStarted | WorkerExited | StillRunning:
        if self.gone:
            raise ForkServerGone("the worker fork server had ended before")
        with self.lock:
            try:
                self.line.settimeout(None if timeout is None else timeout + FORK_SERVER_GRACE)
                socket.send_fds(self.line, [dumps(request)], list(fds))
                payload = self.line.recv(1 << 16)
            except (OSError, TimeoutError) as exc:
                self.close()
                raise ForkServerGone(f"the worker fork server stopped answering ({exc})") from None
        if not payload:
            self.close()
            raise ForkServerGone(f"the worker fork server ended ({self.process.returncode})")
        reply = loads(payload, (WorkerStarted, WorkerExited, StillRunning, Refused))
        if isinstance(reply, Refused):
            raise ChildProcessError(f"the worker fork server refused: {reply.message}")
        return reply

    def close(self) -> None:
        self.gone = True
        self.line.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def ended(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has ended (poll: no limit on the descriptor's number,
    as select has)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class ForkedWorker:
    """A worker forked by a fork server, driven as a ``subprocess.Popen``: poll, wait, kill."""

    def __init__(self, fork_server: ForkServer, started: WorkerStarted):
        self.fork_server = fork_server
        self.pid = started.pid
        self.sandbox = started.sandbox  # as the fork server saw it, before any import
        self.returncode: int | None = None
        self.left_running = 0  # its descendants that outlived it (the fork server killed them)
        # Readable once the process has ended: whether it lives, without asking the fork server (the
        # judge asks before every call).
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:  # a kernel before 5.3, or a sandbox that forbids it
            self.pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self.fork_server.ask(WaitForWorker(self.pid, timeout), timeout=timeout)
            if isinstance(reply, StillRunning):
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self.set_returncode(reply.returncode)
            self.left_running = reply.left_running
        return self.returncode

    def set_returncode(self, returncode: int) -> None:
        self.returncode = returncode
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.fork_server.gone or self.fork_server.process.poll() is not None:
            # It dies with its fork server (impls.sandbox.die_with_parent), if it has not yet:
            # it serves no more calls, and no call may be sent to it to die in.
            self.set_returncode(-signal.SIGKILL)
            return self.returncode
        if self.pidfd is not None and not ended(self.pidfd):
            return None
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None
        except ForkServerGone:
            # Its parent is gone, so it has ended or will not be waited for: either way it
            # serves no more calls.
            self.set_returncode(-signal.SIGKILL)
            return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            return  # reaped: its pid may be another process's now
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        try:
            self.wait()
        except ForkServerGone:
            self.set_returncode(-signal.SIGKILL)


FORK_SERVERS: dict[tuple, ForkServer] = {}


def fork_server_for(env: dict[str, str]) -> ForkServer:
    key = (sys.executable, tuple(sorted(env.items())))
    server = FORK_SERVERS.get(key)
    if server is None or server.gone:
        server = FORK_SERVERS[key] = ForkServer(env)
    return server


@atexit.register
def close_fork_servers() -> None:
    for server in FORK_SERVERS.values():
        if not server.gone:
            server.close()


def start_worker(
    selector: str,
    env: dict[str, str],
    worker_end: socket.socket,
    output: IO[bytes],
    scratch: str | None,
    paths: list[str],
    bounds: WorkerBounds,
) -> ForkedWorker | subprocess.Popen:
    """A worker serving ``selector`` on ``worker_end``, printing into ``output``, confined to
    ``scratch`` (None: unconfined) within ``bounds``, ``paths`` its ``sys.path`` once
    confined."""
    if not WORKERS_ARE_FORKED:
        return subprocess.Popen(
            isolated_command(
                "impls.worker_process",
                str(worker_end.fileno()),
                json.dumps(paths),
                selector,
                scratch or "",
                bounds.as_text(),
            ),
            pass_fds=(worker_end.fileno(),),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )
    request = StartWorker(selector, tuple(paths), os.getcwd(), scratch, bounds)
    fds = (worker_end.fileno(), output.fileno())

    def fork() -> ForkedWorker:
        server = fork_server_for(env)
        return ForkedWorker(server, server.ask(request, fds, timeout=0))

    try:
        return fork()
    except ForkServerGone:  # ended by something outside, say: one more try, with a fresh one
        return fork()
