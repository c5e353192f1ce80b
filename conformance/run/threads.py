"""Threads per process in a run spread over pytest-xdist workers.

BLAS (OpenBLAS, MKL) and OpenMP (PyTorch's CPU ops) size their thread pools to the machine's cores
in every process that loads them, and OpenBLAS's idle threads spin. Under ``-n N`` that is N
judges, and the implementations' worker processes each of them starts, all sized for the whole
machine. A distributed run therefore gives each process its share of the cores, through the
variables those libraries read when they start, unless the user has set them (docs/performance.md
has the measurement).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from impls.machine import usable_cores

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def share_cores(processes: int, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Sets each of THREAD_VARIABLES that ``environ`` lacks to the cores per process (at least 1),
    for the ``processes`` xdist workers about to start and the processes they start; returns what
    it set."""
    if processes < 1:
        raise ValueError(f"processes={processes}, but should be >= 1")
    threads = str(max(1, usable_cores() // processes))
    chosen = {name: threads for name in THREAD_VARIABLES if name not in environ}
    environ.update(chosen)
    return chosen


def describe(chosen: dict[str, str], processes: int) -> str:
    """The header's line on what :func:`share_cores` set."""
    names = ", ".join(chosen)
    return (
        f"attnspec: {processes} xdist workers on {usable_cores()} cores: {names} set to "
        f"{next(iter(chosen.values()))} per process (set them yourself to choose)"
    )
