"""The suite's own cost: the default conformance run (every built-in that can run on this
machine's CPU) must finish within 3 minutes on 2 cores, or kernel authors stop running it."""

from __future__ import annotations

import time

import pytest

from perf.measure import require_timing
from tests.suite_process import run_suite

pytestmark = pytest.mark.perf

WORKERS = 2
MAX_SECONDS = 180.0


def test_default_cpu_run_finishes_within_three_minutes(perf_table):
    started = time.perf_counter()
    run = run_suite("-n", str(WORKERS), "-q", timeout=4 * MAX_SECONDS)
    seconds = time.perf_counter() - started
    # The verdict table's lines for implementations, not its "(mathematics)" line.
    verdicts = [
        line.split()[0]
        for line in run.stdout.splitlines()
        if " conforms " in line and not line.startswith("(")
    ]
    perf_table.append(
        (
            "suite cost",
            f"python -m pytest conformance -n {WORKERS}",
            f"conform: {', '.join(verdicts) or 'none'}",
            f"{seconds:.0f} s",
            "",
            f"<= {MAX_SECONDS:.0f} s: {'passes' if seconds <= MAX_SECONDS else 'FAILS'}",
        )
    )
    assert run.returncode == 0, (
        f"the default run failed (exit {run.returncode}), so its time means nothing:\n"
        + run.stdout[-3000:]
    )
    require_timing(
        seconds <= MAX_SECONDS,
        f"the default CPU run took {seconds:.0f} s on {WORKERS} workers, but should finish within "
        f"{MAX_SECONDS:.0f} s",
        perf_table,
    )
