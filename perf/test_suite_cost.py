"""The suite's own cost: the default conformance run (every built-in that can run on this
machine's CPU) must finish within 3 minutes on 2 cores, or kernel authors stop running it; and
judging more implementations must not compute the float64 truth again for each."""

from __future__ import annotations

import re
import time
from functools import partial

import numpy as np
import pytest

import conformance.run.fork_server_client as fork_server_client
from conformance.bench.timing import interleaved, wall_time
from conformance.run.worker_clients import open_clients
from perf.measure import milliseconds, require_timing
from tests.suite_process import run_suite
from tests.zoo import load_members

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


# Implementations judged on the same cases: numpy and plain callables of the zoo's correct
# variants, all float64 and float32 (a built-in with other dtypes would bring cases of its own).
CORRECT_VARIANTS = [member.selector for member in load_members().values() if member.correct]
SCALING_SELECTION = ["numpy", *CORRECT_VARIANTS[:12]]
SCALING_COUNTS = (1, 13)
SCALING_CLAIMS = "OUT-FORMULA,MASK-PREFIX,OUT-CONVEX"
TRUTH_LINE = re.compile(r"attnspec: float64 truth: (\d+) entries")


def test_the_truth_does_not_grow_with_the_implementations_judged(perf_table):
    """With the truth shared, judging more implementations on the same cases adds their own
    calls and comparisons, not another float64 oracle per implementation: the run's truth entries
    stay as many (checked), and the marginal seconds per implementation are printed (timings
    report, they decide nothing)."""
    assert len(SCALING_SELECTION) == max(SCALING_COUNTS)
    seconds, entries = {}, {}
    for count in SCALING_COUNTS:
        started = time.perf_counter()
        run = run_suite(
            "--impl", ",".join(SCALING_SELECTION[:count]), "--claims", SCALING_CLAIMS,
            "-n", str(WORKERS), "-q", timeout=4 * MAX_SECONDS,
        )  # fmt: skip
        seconds[count] = time.perf_counter() - started
        assert run.returncode == 0, run.stdout[-3000:]
        found = TRUTH_LINE.search(run.stdout)
        assert found, f"no truth summary in the run's output:\n{run.stdout[-2000:]}"
        entries[count] = int(found.group(1))
    few, many = SCALING_COUNTS
    marginal = (seconds[many] - seconds[few]) / (many - few)
    for count in SCALING_COUNTS:
        perf_table.append(
            (
                "suite cost",
                f"{count} implementation(s)",
                f"--claims {SCALING_CLAIMS}",
                f"{seconds[count]:.1f} s",
                f"{entries[count]} truth entries",
                f"marginal {marginal:.1f} s per implementation" if count == many else "",
            )
        )
    assert len(set(entries.values())) == 1, (
        f"truth entries by implementations judged: {entries}; they should not grow, since every "
        "implementation is judged on the same cases"
    )


def start_call_and_close(selector: str, sandbox: bool = True) -> None:
    [client] = open_clients([selector], sandbox=sandbox)
    x = client.from_numpy(np.ones((1, 1, 4, 8)), "float64")
    client.attention(x, x, x)
    client.close()


def test_a_forked_worker_starts_in_a_fraction_of_a_started_ones_time(perf_table, monkeypatch):
    """Every implementation gets a worker in each process of a run, and again after each death:
    a few hundred over the zoo. Forked from the fork server, a worker must cost at most half of one
    started as ``python -m impls.worker_process`` (a fresh interpreter importing NumPy)."""
    if not fork_server_client.WORKERS_ARE_FORKED:
        pytest.skip("workers are not forked on this platform")

    def started_as(forked: bool):
        def start() -> None:
            monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", forked)
            start_call_and_close("numpy")

        return start

    timings = interleaved(
        {"forked": started_as(True), "started": started_as(False)},
        repeats=9,
        warmup=1,
        timer=partial(wall_time, settle_seconds=0),  # no matrix product is timed: no pause
    )
    forked, started = timings["forked"].median, timings["started"].median
    for how, seconds in (("forked", forked), ("started", started)):
        perf_table.append(
            ("worker start", "numpy", "start, one call, close", milliseconds(seconds), "", how)
        )
    require_timing(
        forked <= started / 2,
        f"a forked worker took {milliseconds(forked)} to start, serve a call and close, but "
        f"should take at most half of a started one's {milliseconds(started)}",
        perf_table,
    )


def test_a_confined_worker_starts_in_about_an_unconfined_ones_time(perf_table):
    """What confining a worker costs (impls/sandbox.py, once per worker: a ruleset of a few dozen
    paths, the capabilities dropped), reported beside an unconfined start; within 10 %, or 5 ms,
    of it is the gate."""
    if not fork_server_client.WORKERS_ARE_FORKED:
        pytest.skip("workers are not forked on this platform")
    timings = interleaved(
        {
            "confined": partial(start_call_and_close, "numpy", sandbox=True),
            "unconfined": partial(start_call_and_close, "numpy", sandbox=False),
        },
        repeats=9,
        warmup=1,
        timer=partial(wall_time, settle_seconds=0),
    )
    confined, unconfined = timings["confined"].median, timings["unconfined"].median
    for how, seconds in (("confined", confined), ("unconfined", unconfined)):
        perf_table.append(
            ("worker start", "numpy", "start, one call, close", milliseconds(seconds), "", how)
        )
    require_timing(
        confined <= max(1.1 * unconfined, unconfined + 0.005),
        f"a confined worker took {milliseconds(confined)} to start, serve a call and close, but "
        f"should take about an unconfined one's {milliseconds(unconfined)}",
        perf_table,
    )
