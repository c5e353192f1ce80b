"""The fork server: the implementation's end of the fork-server line, forking workers from a clean
interpreter that has imported NumPy and :mod:`impls.worker_process` and nothing of any
implementation.

A worker forked from here is the process ``python -m impls.worker_process`` would be - the
environment the judge lets through (:func:`impls.sandbox.worker_environment`), the sys.path and
current directory it names, no CUDA context, no thread of the judge - without paying for the
interpreter and NumPy again: about 0.3 s of CPU per worker on a 2-core machine, and a run over
the zoo starts a few hundred. The judge (``conformance/run/fork_server_client.py``) starts one
per process and environment, isolated (``python -I``: no current directory, no ``PYTHONPATH`` on
its ``sys.path``), so that no file beside a candidate kernel, a ``zipfile.py`` say, is imported
into this unconfined process.

The line is a Unix socket of packets, each a request of :mod:`impls.messages` with the file
descriptors it hands over, answered in order:

- :class:`~impls.messages.StartWorker`, with the worker's end of its socket pair and the file its
  output goes to: :class:`~impls.messages.WorkerStarted`, with how far the worker confined itself
  to its scratch directory (:mod:`impls.sandbox`), said down a pipe before it set its ``sys.path``
  or imported anything of the implementation; or unconfined where there is no scratch.
- :class:`~impls.messages.WaitForWorker`: :class:`~impls.messages.WorkerExited`, or
  :class:`~impls.messages.StillRunning` when its timeout passes first;
  :class:`~impls.messages.Refused` for a pid that is not a worker it has not waited for. A
  worker's descendants that outlived it are killed then, and counted.

No process outlives its worker: a worker is a child subreaper (:mod:`impls.sandbox`), so every
descendant stays in its tree while it lives; when it ends, they come to the fork server, itself a
subreaper, which kills and reaps every child that is not a worker (a daemon that left its
worker's process group and session included) whenever a worker ends, and before it ends itself.

A forked worker closes its copy of this line before anything else runs, so nothing an
implementation does can speak for the fork server. It ends when the judge closes the line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
import traceback

from impls import worker_process
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
from impls.sandbox import become_subreaper, die_with_parent

MAX_PACKET = 1 << 20  # a request holds a selector and the judge's sys.path
# What a fresh interpreter does on SIGINT here: KeyboardInterrupt, or nothing where the judge's
# own parent ignored it (a background job).
SIGINT_AT_START = signal.getsignal(signal.SIGINT)
WAIT_POLL = (0.001, 0.05)  # seconds between two looks at a worker that has not ended: first, most


def start(line: socket.socket, request: StartWorker, fds: list[int]) -> WorkerStarted:
    connection_fd, output_fd = fds
    sys.stdout.flush()
    sys.stderr.flush()
    # the worker says down this pipe how far it was confined, before it imports anything
    report_read, report_write = os.pipe()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            if not die_with_parent(me):
                os._exit(1)
            line.close()
            os.close(report_read)
            signal.signal(signal.SIGINT, SIGINT_AT_START)
            os.dup2(output_fd, 1)
            os.dup2(output_fd, 2)
            os.close(output_fd)
            os.chdir(request.cwd)
            # What python -m impls.worker_process would have seen as its arguments.
            sys.argv = [
                worker_process.__file__,
                str(connection_fd),
                json.dumps(list(request.paths)),
                request.selector,
                request.scratch or "",
                request.bounds.as_text(),
            ]
            worker_process.run(
                connection_fd,
                list(request.paths),
                request.selector,
                request.scratch,
                request.bounds,
                report_write,
            )
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(connection_fd)
    os.close(output_fd)
    os.close(report_write)
    WORKERS.add(pid)
    with os.fdopen(report_read, "rb") as report:
        said = report.read(4096).decode(errors="replace")
    return WorkerStarted(pid, said or "none (its worker ended before it was confined)")


WORKERS: set[int] = set()  # the workers forked and not yet waited for


def children() -> dict[int, bool]:
    """This process's children, read from /proc (the workers and whatever came back to it),
    each with whether it still runs (it is not a zombie)."""
    mine, found = os.getpid(), {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    state, parent = stat.read().rsplit(b")", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue
            if int(parent) == mine:
                found[int(entry.name)] = state != b"Z"
    return found


def sweep() -> int:
    """Kills and reaps every child that is not a live worker: descendants that outlived theirs.
    Returns how many of them were still running, not counting the first process of a worker's
    PID namespace, which ends with its worker and takes the namespace with it."""
    left = {
        pid: running and not first_of_its_namespace(pid)
        for pid, running in children().items()
        if pid not in WORKERS
    }
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return sum(left.values())


def first_of_its_namespace(pid: int) -> bool:
    """Whether ``pid`` is process 1 of a PID namespace of its own (a worker's, whose relay was
    killed before it: :func:`impls.sandbox._own_process_tree`)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return line.split()[-1] == b"1" and len(line.split()) > 2
    except OSError:
        pass
    return False


def wait(pid: int, timeout: float | None) -> int | None:
    """The worker's return code, or None if it still runs after ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = WAIT_POLL[0]
    while True:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            WORKERS.discard(pid)
            return os.waitstatus_to_exitcode(status)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(2 * pause, WAIT_POLL[1])


def answer(line: socket.socket, request: StartWorker | WaitForWorker, fds: list[int]):
    if isinstance(request, StartWorker):
        if len(fds) != 2:
            return Refused(f"a StartWorker with {len(fds)} file descriptors, but should have 2")
        return start(line, request, fds)
    try:
        returncode = wait(request.pid, request.timeout)
    except ChildProcessError as exc:  # not a worker of this fork server, or waited for before
        return Refused(f"pid {request.pid}: {exc}")
    return StillRunning() if returncode is None else WorkerExited(returncode, sweep())


def serve(line: socket.socket) -> None:
    while True:
        try:
            payload, fds, _, _ = socket.recv_fds(line, MAX_PACKET, 2)
        except ConnectionError:
            return
        if not payload:
            return
        line.send(dumps(answer(line, loads(payload, (StartWorker, WaitForWorker)), fds)))


def main(fd: int, judge: int) -> None:
    # A Ctrl-C reaches the whole process group: the workers take it as a fresh interpreter would,
    # the fork server lives until the judge closes its line, so the judge can still wait for them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent(judge):  # a judge killed outright takes its workers with it
        return
    become_subreaper()  # and the C library its workers confine themselves with, loaded once
    try:
        serve(socket.socket(fileno=fd))
    finally:
        for pid in WORKERS:  # the judge has gone: nothing it started may stay
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        sweep()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
