"""A plain callable whose version is what its worker process looked like when it imported the
module: the judge's tests read it to see that a forked worker is a fresh one."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading

JUDGE_MODULES = ("conformance", "pytest", "_pytest", "hypothesis", "tests.conftest")

_numpy_random_was_imported = "numpy.random" in sys.modules
import numpy as np  # noqa: E402  (after the look at what the process had imported before)

__version__ = json.dumps(
    {
        "cwd": os.getcwd(),
        "mark": os.environ.get("ATTNSPEC_TEST_MARK"),
        "path": sys.path,
        # paths and selector; not the connection's descriptor, nor the worker's own scratch
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[2:4]],
        "scratch_argument": os.path.basename(sys.argv[4]).startswith("attnspec-scratch-"),
        "tmpdir_is_the_scratch": os.environ.get("TMPDIR") == sys.argv[4],
        "sigint": getattr(signal.getsignal(signal.SIGINT), "__name__", None)
        or str(signal.getsignal(signal.SIGINT)),
        "python_threads": threading.active_count(),
        "numpy_random_imported_before": _numpy_random_was_imported,
        "judge_modules": sorted(m for m in JUDGE_MODULES if m in sys.modules),
        "numpy_draw": float(np.random.random()),
        "python_draw": random.random(),
    }
)


def attention(q, k, v, *, causal=True, scale=None):
    return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
