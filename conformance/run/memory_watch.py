"""The judge's watch over all of a worker's memory, which its ``RLIMIT_DATA`` does not bound.

``RLIMIT_DATA`` counts what malloc, NumPy and torch allocate, not shared mappings: a kernel that
maps shared anonymous memory, attaches a SysV segment or maps a file of its ``/dev/shm`` holds
memory the limit never sees, and files written into ``/dev/shm`` are memory held by no process
at all. A control group's ``memory.max`` would count all of it, but the judge may only use a
hierarchy it was handed, and none is handed here (a delegated cgroup v2 subtree is what it
needs). So the judge reads, at most every :data:`WATCH_EVERY` seconds while a call runs and
after it answers, what the worker's processes hold resident (anonymous and shared pages,
``/proc/PID/status``) and what its own ``/dev/shm`` holds (a tmpfs no larger than the bound,
:mod:`impls.sandbox`), and stops the worker once their sum reaches the bound.

A page counted twice (a ``/dev/shm`` file that is also mapped, memory a forked child shares with
its parent) makes the bound stricter, never looser.
"""

from __future__ import annotations

import contextlib
import os
import time

# How the bound holds, in the report's words.
MEMORY_BOUND = "data by RLIMIT_DATA; resident, shared and /dev/shm memory watched every 20 ms"
WATCH_EVERY = 0.02  # seconds: about 0.1 ms a look, so at most half a percent of one core
RESIDENT_FIELDS = (b"RssAnon:", b"RssShmem:")  # kB each; file pages are the page cache's


class BoundExceeded(Exception):
    """A worker reached one of the bounds the judge watches; the worker was killed."""

    def __init__(self, used: int, bound: int):
        self.used, self.bound = used, bound
        super().__init__(f"{used} in use, bound {bound}")


class MemoryBoundExceeded(BoundExceeded):
    """A worker's memory, in bytes, reached its bound."""


class TasksBoundExceeded(BoundExceeded):
    """A worker's live processes and threads reached their bound: where the kernel cannot
    count them for it (root's tasks, which RLIMIT_NPROC never refuses), the judge does."""


def tasks_of(pid: int) -> int:
    """The live processes and threads of ``pid``'s tree."""
    total = 0
    for process in processes_of(pid):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{process}/task"))
    return total


def processes_of(pid: int) -> list[int]:
    """``pid`` and its descendants (a worker is a child subreaper: none leaves its tree), from
    each thread's ``children`` in /proc."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with (
                    contextlib.suppress(OSError),
                    open(f"/proc/{current}/task/{task}/children", "rb") as children,
                ):
                    pending.extend(int(child) for child in children.read().split())
    return found


def resident_bytes(pid: int) -> int:
    """Anonymous and shared pages resident in ``pid``'s memory."""
    total = 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(RESIDENT_FIELDS):
                total += int(line.split()[1]) * 1024
    return total


def shared_memory_bytes(pid: int) -> int:
    """What the files of ``pid``'s own ``/dev/shm`` hold, read through its root."""
    try:
        stat = os.statvfs(f"/proc/{pid}/root/dev/shm")
    except OSError:
        return 0
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def memory_in_use(pid: int) -> int:
    """All of a worker's memory that the judge can see: its processes' resident anonymous and
    shared pages and its ``/dev/shm``."""
    return sum(resident_bytes(p) for p in processes_of(pid)) + shared_memory_bytes(pid)


class MemoryWatch:
    """The watch over one worker: :meth:`look` reads its memory when :data:`WATCH_EVERY` has
    passed since the last look (or when forced) and raises :class:`MemoryBoundExceeded` at the
    bound."""

    def __init__(self, pid: int, bound: int | None, tasks: int | None = None):
        self.pid, self.bound, self.tasks = pid, bound, tasks
        self.last_look = time.monotonic()

    def look(self, force: bool = False) -> None:
        """Raises the bound the worker reached, if any: MemoryBoundExceeded for its memory (None:
        no bound), TasksBoundExceeded for its live processes and threads (None: no bound)."""
        now = time.monotonic()
        if not force and now - self.last_look < WATCH_EVERY:
            return
        self.last_look = now
        if self.bound is not None:
            used = memory_in_use(self.pid)
            if used >= self.bound:
                raise MemoryBoundExceeded(used, self.bound)
        if self.tasks is not None:
            running = tasks_of(self.pid)
            if running > self.tasks:
                raise TasksBoundExceeded(running, self.tasks)
