"""Plain callables that try to change the verdict instead of computing attention.

Each returns a wrong answer (zeros) and, from inside its call, does something that in the
judge's own process would hide it or disturb the run: raise what pytest reads as a skip, patch
the suite's assertions or pytest itself, register a plugin that rewrites failures as passes,
change NumPy's or PyTorch's global state, print without end, or send the judge a message that
would run code there. In a worker process of its own
none of it reaches the judge, and each one FAILS.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import unittest
from multiprocessing.connection import Connection

import numpy as np
import pytest


def _wrong(q, v) -> np.ndarray:
    return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)


def raises_unittest_skip(q, k, v, *, causal=True, scale=None):
    """Raises unittest.SkipTest wherever its answer would be wrong (always)."""
    raise unittest.SkipTest("not applicable")


def raises_pytest_skip(q, k, v, *, causal=True, scale=None):
    """Raises pytest's own skip outcome."""
    raise pytest.skip.Exception("skip me", allow_module_level=True)


def raises_keyboard_interrupt(q, k, v, *, causal=True, scale=None):
    """Raises KeyboardInterrupt, which pytest reads as the user stopping the run."""
    raise KeyboardInterrupt


def patches_the_suite(q, k, v, *, causal=True, scale=None):
    """Replaces the tolerance check by True and the assertion helpers by no-ops, then answers
    wrongly."""
    for name in ("conformance.judge.tolerance", "conformance.judge.assertions"):
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        if hasattr(module, "Comparison"):
            module.Comparison.ok = property(lambda self: True)
        for attribute in dir(module):
            if attribute.startswith(("assert_", "fail")):
                setattr(module, attribute, lambda *args, **kwargs: None)
    return _wrong(q, v)


def patches_pytest_fail(q, k, v, *, causal=True, scale=None):
    """Replaces pytest.fail by a no-op, then answers wrongly."""
    pytest.fail = lambda *args, **kwargs: None
    return _wrong(q, v)


class _PassEverything:
    def pytest_runtest_logreport(self, report):
        report.outcome = "passed"


def registers_a_plugin(q, k, v, *, causal=True, scale=None):
    """Finds the running pytest session's config and registers a plugin that rewrites every
    report as passed, then answers wrongly."""
    from _pytest.config import Config

    for obj in gc.get_objects():
        if isinstance(obj, Config) and not obj.pluginmanager.is_registered(_PASS):
            obj.pluginmanager.register(_PASS, "attnspec-forger")
    return _wrong(q, v)


_PASS = _PassEverything()


def changes_global_state(q, k, v, *, causal=True, scale=None):
    """np.seterr(all='ignore'), torch.set_default_dtype(torch.float64) where torch is there,
    then answers wrongly."""
    np.seterr(all="ignore")
    try:
        import torch

        torch.set_default_dtype(torch.float64)
    except ImportError:
        pass
    return _wrong(q, v)


_printed = []


def prints_ten_megabytes(q, k, v, *, causal=True, scale=None):
    """Prints 10 MB to stdout at its first call, 1 KiB at every other (so that a failing test of
    a few calls has more to show than the judge shows), and answers wrongly."""
    sys.stdout.write(("x" * (10 << 20) if not _printed else "another call ".ljust(1 << 10)) + "\n")
    _printed.append(True)
    return _wrong(q, v)


class _RunsInTheJudge:
    """Unpickled, it runs its code: what a judge that unpickled anything would do."""

    def __reduce__(self):
        return (exec, ("import impls; impls.LINE_FORGED = True",))


def announces_a_huge_answer(q, k, v, *, causal=True, scale=None):
    """Announces, down its worker's line, an answer of one array of a petabyte: a judge that
    allocated what a worker announces would run out of memory."""
    line = Connection(os.dup(int(sys.argv[1])))
    line.send_bytes((1).to_bytes(4, "little") + (1 << 50).to_bytes(8, "little") + b"x")
    return _wrong(q, v)


def forges_an_answer(q, k, v, *, causal=True, scale=None):
    """Sends the judge, down its own worker's line (the descriptor in the worker's argv), a
    message that runs code in the judge if the judge unpickles it, then answers."""
    line = Connection(os.dup(int(sys.argv[1])))
    line.send_bytes((0).to_bytes(4, "little") + pickle.dumps(_RunsInTheJudge(), protocol=5))
    return _wrong(q, v)
