"""Plain callables, right on every call, that take what the machine shares: one writes past its
worker's disk (its scratch, where TMPDIR points), one keeps children past its worker's bound on
processes and threads. Unbounded, both are judged to conform while the machine's disk and
process table fill; within a worker's bounds (``--worker-disk``, ``--worker-processes``) each
call fails with a message naming the bound. ``ATTNSPEC_PLANTED_FILL`` (bytes) and
``ATTNSPEC_PLANTED_CHILDREN`` say how much each takes; the children name themselves
``CHILD_NAME`` (``/proc/PID/comm``), so that a test can look for any that outlived the run."""

from __future__ import annotations

import ctypes
import os
import tempfile
import time

from tests.planted.plain import correct

CHILD_NAME = b"attnspec-hoard"
PR_SET_NAME = 15
_children: list[int] = []


def fills_its_disk(q, k, v, *, causal=True, scale=None):
    """Reserves real blocks in its scratch, more at every call."""
    size = int(os.environ.get("ATTNSPEC_PLANTED_FILL", 96 << 20))
    path = os.path.join(tempfile.gettempdir(), "hoard")
    with open(path, "ab") as hoard:
        os.posix_fallocate(hoard.fileno(), os.fstat(hoard.fileno()).st_size, size)
    return correct(q, k, v, causal=causal, scale=scale)


def keeps_children_past_its_bound(q, k, v, *, causal=True, scale=None):
    """Keeps its count of sleeping children, started at its first call."""
    wanted = int(os.environ.get("ATTNSPEC_PLANTED_CHILDREN", 96))
    while len(_children) < wanted:
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(CHILD_NAME), 0, 0, 0)
            time.sleep(600)
            os._exit(0)
        _children.append(pid)
    return correct(q, k, v, causal=causal, scale=scale)
