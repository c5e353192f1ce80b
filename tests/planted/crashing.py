"""Plain callables that take their process down or never return: the suite must survive them."""

from __future__ import annotations

import ctypes
import os
import time

from tests.planted.plain import correct


def segfaults(q, k, v, *, causal=True, scale=None):
    """Reads address 0, as a kernel with a bad pointer does: SIGSEGV."""
    return ctypes.string_at(0)


def exits(q, k, v, *, causal=True, scale=None):
    """Ends the process without unwinding, as a library calling exit() on an internal error."""
    os._exit(3)


def hangs(q, k, v, *, causal=True, scale=None):
    """Never returns, as a kernel spinning on a flag no one sets."""
    while True:
        time.sleep(1)


def sys_exits(q, k, v, *, causal=True, scale=None):
    """Calls sys.exit(0), as a library that 'handles' an error by exiting cleanly."""
    raise SystemExit(0)


def right_after_a_second(q, k, v, *, causal=True, scale=None):
    """Right, and slow: a call long enough for something outside to happen during it."""
    time.sleep(1)
    return correct(q, k, v, causal=causal, scale=scale)
