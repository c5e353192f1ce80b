"""What of the machine this process may use: shared by a built-in that sizes its thread pool and
by the run that shares the cores among its processes."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
