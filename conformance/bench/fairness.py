"""Fair timing: while one side of a bench is timed, the other side's worker does not run.

A candidate that computes right, reports its own time honestly and keeps every core busy between
its own calls (threads or processes left running in its worker) slows the baseline it is
compared with, and buys a ratio that way. So each timed call runs with the other side's worker
frozen: every process of its tree (a worker is a child subreaper, so none leaves the tree) gets
SIGSTOP before the call and SIGCONT after, and what the frozen processes ran meanwhile is read
from their CPU clocks (``clock_getcpuclockid``: every thread, to the nanosecond). A frozen side
that ran more than :data:`ALLOWED_CPU_SECONDS` during a call, or one that could not be frozen
and ran that much, makes the round unfair, and the bench refuses its ratio ("timing not fair").

On a GPU, freezing a process does not stop kernels it already queued on the device: there the
other side's processes are watched through NVML's samples during each timed call, and a round in
which one kept the GPU busy is refused too (conformance/bench/device_activity.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from conformance.bench.device_activity import DeviceActivity
from conformance.run.memory_watch import processes_of

# What a frozen process may run during a call: the instants between SIGSTOP's sending and its
# taking hold, and SIGCONT's delivery; a thread left spinning runs whole milliseconds.
ALLOWED_CPU_SECONDS = 0.002
STOP_WAIT_SECONDS = 0.2  # for every thread of a frozen process to reach its stop
FREEZE, MEASURE, OFF = "freeze", "measure", "off"  # the defence, its measurement alone, none


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.clock_getcpuclockid.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_int))
    return libc


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time the processes ``pids`` have run, all their threads together; a process
    that has gone counts nothing."""
    if sys.platform != "linux":
        return 0.0
    libc, total = _libc(), 0.0
    for pid in pids:
        clock = ctypes.c_int()
        if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
            with contextlib.suppress(OSError):
                total += time.clock_gettime(clock.value)
    return total


def _all_stopped(pids: list[int]) -> bool:
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                    state = stat.read().rsplit(b")", 1)[1].split()[0]
                if state not in (b"T", b"t", b"Z", b"X"):
                    return False
    return True


@dataclass
class Quiet:
    """The sides not being timed, over one timed call: frozen (``freeze``), watched only
    (``measure``) or left alone (``off``); ``ran`` is the CPU they ran meanwhile, by name."""

    workers: dict[str, int]  # name -> worker pid
    mode: str = FREEZE
    device: DeviceActivity | None = None  # the GPU's samples, where the sides run on one
    ran: dict[str, float] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)  # name -> SM utilisation seen, percent
    frozen: bool = False

    def __enter__(self) -> Quiet:
        self.trees = {name: processes_of(pid) for name, pid in self.workers.items()}
        if self.mode == FREEZE:
            self.frozen = self._freeze()
        self.before = {name: cpu_seconds(pids) for name, pids in self.trees.items()}
        if self.device is not None:
            self.device.start()
        return self

    def _freeze(self) -> bool:
        """SIGSTOP to every process of each tree, again for any forked meanwhile, until every
        thread has stopped. False where a process could not be signalled."""
        stopped: set[int] = set()
        try:
            while True:
                for pids in self.trees.values():
                    for pid in set(pids) - stopped:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGSTOP)
                        stopped.add(pid)
                self.trees = {name: processes_of(pid) for name, pid in self.workers.items()}
                if all(set(pids) <= stopped for pids in self.trees.values()):
                    break
        except PermissionError:
            self._thaw(stopped)
            return False
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        every = [pid for pids in self.trees.values() for pid in pids]
        while not _all_stopped(every) and time.monotonic() < deadline:
            time.sleep(0.0005)
        return True

    def __exit__(self, *exc_info) -> None:
        for name, pids in self.trees.items():
            # a process forked meanwhile (where nothing was frozen) ran all its life in the call
            later = [p for p in processes_of(self.workers[name]) if p not in pids]
            self.ran[name] = cpu_seconds(pids) - self.before[name] + cpu_seconds(later)
            if self.device is not None:
                self.busy[name] = self.device.busiest([*pids, *later])
        if self.frozen:
            self._thaw({pid for pids in self.trees.values() for pid in pids})

    @staticmethod
    def _thaw(pids) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)


def unfair(
    timed: str, ran: dict[str, list[float]], busy: dict[str, list[int]] | None = None
) -> str | None:
    """Why ``timed``'s calls were not timed fairly, from what the other sides ran during each
    (CPU seconds, and the GPU's utilisation where it was watched), or None."""
    for other, percents in (busy or {}).items():
        if max(percents, default=0) > 0:
            return (
                f"timing not fair: {other}'s worker kept the GPU busy (SM {max(percents)} % in "
                f"NVML's samples) during one of {timed}'s timed calls, so the ratio is refused"
            )
    for other, seconds in ran.items():
        worst = max(seconds, default=0.0)
        if worst > ALLOWED_CPU_SECONDS:
            return (
                f"timing not fair: {other}'s worker ran {worst * 1e3:.1f} ms of CPU during one "
                f"of {timed}'s timed calls (at most {ALLOWED_CPU_SECONDS * 1e3:g} ms allowed: the "
                f"side not timed is frozen), so the ratio is refused"
            )
    return None
