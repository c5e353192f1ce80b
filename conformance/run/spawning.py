"""How the judge starts an implementation's worker: forked by :mod:`impls.spawner` on Linux,
``python -m impls.worker`` elsewhere.

Both give the process the judge's environment, ``sys.path`` and current directory and nothing
of the judge's own state; forking from the spawner spares each worker the interpreter's start
and NumPy's import. The spawner is started once per judge process and environment (a judge that
changes its environment gets another, so the variables a library reads at import - thread
counts - are the ones the worker is started with). :class:`ForkedWorker` is the part of
``subprocess.Popen`` that :class:`conformance.run.workers.ProcessChannel` uses.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import IO

# macOS forks badly once system frameworks are loaded (Python's multiprocessing stopped forking
# there for that), and Windows cannot fork.
WORKERS_ARE_FORKED = sys.platform == "linux"
SPAWNER_GRACE = 30.0  # seconds the spawner may take to answer beyond a wait it was asked for


class SpawnerGone(ChildProcessError):
    """The spawner ended or stopped answering; what it knew of its workers went with it."""


class Spawner:
    """A running :mod:`impls.spawner` and the judge's end of its line."""

    def __init__(self, env: dict[str, str]):
        judge_end, spawner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "impls.spawner", str(spawner_end.fileno())],
            pass_fds=(spawner_end.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        spawner_end.close()
        self.line = judge_end
        self.lock = threading.Lock()
        self.gone = False

    def ask(self, request: tuple, fds: tuple[int, ...] = (), timeout: float | None = None):
        if self.gone:
            raise SpawnerGone("the worker spawner had ended before")
        with self.lock:
            try:
                self.line.settimeout(None if timeout is None else timeout + SPAWNER_GRACE)
                socket.send_fds(self.line, [pickle.dumps(request)], list(fds))
                reply = self.line.recv(1 << 16)
            except (OSError, TimeoutError) as exc:
                self.close()
                raise SpawnerGone(f"the worker spawner stopped answering ({exc})") from None
        if not reply:
            self.close()
            raise SpawnerGone(f"the worker spawner ended ({self.process.returncode})")
        reply = pickle.loads(reply)
        if reply[0] not in ("started", "exited", "running"):
            raise ChildProcessError(f"the worker spawner answered {reply}")
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
    """A worker forked by a spawner, driven as a ``subprocess.Popen``: poll, wait, kill."""

    def __init__(self, spawner: Spawner, pid: int):
        self.spawner = spawner
        self.pid = pid
        self.returncode: int | None = None
        self.left_running = 0  # its descendants that outlived it (the spawner killed them)
        # Readable once the process has ended: whether it lives, without asking the spawner (the
        # judge asks before every call).
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:  # a kernel before 5.3, or a sandbox that forbids it
            self.pidfd = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self.spawner.ask(("wait", self.pid, timeout), timeout=timeout)
            if reply[0] == "running":
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            self.set_returncode(reply[1])
            self.left_running = reply[2]
        return self.returncode

    def set_returncode(self, returncode: int) -> None:
        self.returncode = returncode
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.pidfd is not None and not ended(self.pidfd):
            return None
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None
        except SpawnerGone:
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
        except SpawnerGone:
            self.set_returncode(-signal.SIGKILL)


SPAWNERS: dict[tuple, Spawner] = {}


def spawner_for(env: dict[str, str]) -> Spawner:
    key = (sys.executable, tuple(sorted(env.items())))
    spawner = SPAWNERS.get(key)
    if spawner is None or spawner.gone:
        spawner = SPAWNERS[key] = Spawner(env)
    return spawner


@atexit.register
def close_spawners() -> None:
    for spawner in SPAWNERS.values():
        if not spawner.gone:
            spawner.close()


def start_worker(
    selector: str,
    env: dict[str, str],
    worker_end: socket.socket,
    output: IO[bytes],
    scratch: str | None,
) -> ForkedWorker | subprocess.Popen:
    """A worker serving ``selector`` on ``worker_end``, printing into ``output``, confined to
    ``scratch`` (None: unconfined)."""
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    if not WORKERS_ARE_FORKED:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "impls.worker",
                str(worker_end.fileno()),
                json.dumps(paths),
                selector,
                scratch or "",
            ],
            pass_fds=(worker_end.fileno(),),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
        )
    request = ("start", selector, paths, os.getcwd(), scratch)
    fds = (worker_end.fileno(), output.fileno())
    try:
        spawner = spawner_for(env)
        return ForkedWorker(spawner, spawner.ask(request, fds, timeout=0)[1])
    except SpawnerGone:  # ended by something outside, say: one more try, with a fresh one
        spawner = spawner_for(env)
        return ForkedWorker(spawner, spawner.ask(request, fds, timeout=0)[1])
