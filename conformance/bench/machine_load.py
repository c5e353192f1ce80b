"""What the rest of the machine ran while a side of a bench was timed.

Freezing the side not timed (:mod:`conformance.bench.fairness`) keeps the bench's own processes
off the cores of a timed call; any other process of the machine (a CI job, a compile, another
bench) can take them too, and a load that comes and goes between the two sides' calls bends the
ratio while its interval stays confident: the same candidate against the formula it wraps came
out 1.12 [0.46, 1.20] on a quiet machine and 0.62 [0.52, 0.66] with a ``tox`` run beside it.

So around every timed call the judge reads the CPU time the whole machine ran (``/proc/stat``)
and takes away what the bench's own processes ran: every worker's tree, read to the nanosecond
from each process's CPU clock (with what its reaped children ran), and the judge's own process.
What is left ran elsewhere, on cores the call could have used. ``/proc/stat`` counts in clock
ticks (10 ms here), sampled: a tick goes to whatever runs on its core at that instant, so over
many short calls the count is right on average and off by about the square root of the ticks
counted. The bench refuses a side's ratio when the others' share of the machine during its timed
calls exceeds :data:`ALLOWED_SHARE` of its cores by more than :data:`STANDARD_ERRORS` standard
errors: load that is shown, not a stray tick.

``/proc/pressure/cpu`` (the time some task waited for a core, to the microsecond) does not decide:
a candidate with more threads than cores waits for its own threads, and would be refused for it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass

from conformance.bench.fairness import cpu_seconds
from conformance.run.memory_watch import processes_of

ALLOWED_SHARE = 0.1  # of the machine's cores, taken by other processes during a side's calls
STANDARD_ERRORS = 3.0  # how far past the allowance the share must be shown before a refusal
TICK_SECONDS = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
PROC_STAT = "/proc/stat"
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (guest is in user)


def machine_ticks() -> int | None:
    """The clock ticks every core of the machine has been busy since it started; None where
    there is no ``/proc/stat``."""
    try:
        with open(PROC_STAT, "rb") as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        return None
    return sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields))


def reaped_children_seconds(pids: list[int]) -> float:
    """What the children that ``pids`` reaped ran (``cutime`` and ``cstime``, in ticks)."""
    total = 0
    for pid in pids:
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/stat", "rb") as stat,
        ):
            fields = stat.read().rsplit(b")", 1)[1].split()
            total += int(fields[13]) + int(fields[14])  # the 16th and 17th of the whole line
    return total * TICK_SECONDS


@dataclass
class MachineLoad:
    """What the machine ran during one side's timed calls, summed over them."""

    wall_seconds: float = 0.0
    machine_ticks: int = 0  # every core's busy ticks
    own_seconds: float = 0.0  # the bench's processes: the workers' trees and the judge
    measured: bool = sys.platform == "linux"

    @property
    def cores(self) -> int:
        return os.cpu_count() or 1

    @property
    def others_seconds(self) -> float:
        return self.machine_ticks * TICK_SECONDS - self.own_seconds

    def others_cores(self, standard_errors: float = 0.0) -> float:
        """The cores the rest of the machine took on average during the calls, less
        ``standard_errors`` of the tick count's sampling."""
        if not self.wall_seconds:
            return 0.0
        error = math.sqrt(max(self.machine_ticks, 1)) * TICK_SECONDS
        return (self.others_seconds - standard_errors * error) / self.wall_seconds

    def refusal(self, timed: str) -> str | None:
        """Why ``timed``'s ratio is refused for the load beside it, or None."""
        allowed = ALLOWED_SHARE * self.cores
        shown = self.others_cores(STANDARD_ERRORS)
        if not self.measured or shown <= allowed:
            return None
        return (
            f"timing not fair: other processes of the machine ran {self.others_cores():.2f} of "
            f"its {self.cores} cores on average during {timed}'s timed calls (at least "
            f"{shown:.2f} beyond the tick count's noise; at most {allowed:.2f} allowed), so the "
            "ratio is refused: time it again on a quiet machine"
        )

    def as_json(self) -> dict:
        return {
            "measured": self.measured,
            "others_cores": self.others_cores(),
            "others_cores_shown": self.others_cores(STANDARD_ERRORS),
            "allowed_cores": ALLOWED_SHARE * self.cores,
            "cores": self.cores,
            "wall_seconds": self.wall_seconds,
        }


class WatchedCall:
    """Adds one timed call to ``load``: the machine's busy ticks and the bench's own CPU over
    it, ``workers`` the pids of every side's worker."""

    def __init__(self, load: MachineLoad, workers: list[int]):
        self.load, self.workers = load, workers

    def own_seconds(self, trees: list[int]) -> float:
        return cpu_seconds(trees) + reaped_children_seconds(trees) + time.process_time()

    def __enter__(self) -> WatchedCall:
        if self.load.measured:
            self.trees = [p for pid in self.workers for p in processes_of(pid)]
            self.own = self.own_seconds(self.trees)
            self.ticks = machine_ticks()
            self.started = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        if not self.load.measured:
            return
        wall = time.perf_counter() - self.started
        ticks = machine_ticks()
        if ticks is None or self.ticks is None:
            self.load.measured = False
            return
        # a process forked meanwhile ran all its life in the call
        later = [p for pid in self.workers for p in processes_of(pid) if p not in self.trees]
        own = self.own_seconds(self.trees) - self.own + cpu_seconds(later)
        self.load.wall_seconds += wall
        self.load.machine_ticks += ticks - self.ticks
        self.load.own_seconds += own
