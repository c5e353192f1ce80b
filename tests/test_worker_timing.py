"""The CPU gates time each implementation in its worker, and the judge's clock checks what the
worker reports: a patched clock in the worker is a timing that is not credible."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conformance.run.worker_clients import open_clients
from perf.worker_timing import WorkerClock


def clock_of(reported: list[float], judged: list[float]) -> WorkerClock:
    """A WorkerClock holding these measurements, without a worker (no timing here decides)."""
    clock = WorkerClock.__new__(WorkerClock)
    clock.client, clock.settle_seconds, clock.overhead = SimpleNamespace(name="k"), 0.25, 0.003
    clock.batch = 5
    clock.reported, clock.judged = reported, judged
    return clock


def test_what_the_judges_clock_allows_and_what_it_contradicts():
    calls = [0.030, 0.031, 0.029, 0.030, 0.032]
    assert clock_of(calls, [c + 0.004 for c in calls]).contradiction() is None  # the line's cost
    assert clock_of(calls, [c * 1.4 for c in calls]).contradiction() is None  # a busy machine
    assert clock_of(calls, [c * 2 for c in calls]).contradiction()  # a clock at half speed
    assert clock_of(calls, [c - 0.25 for c in calls]).contradiction()  # a pause not kept
    assert clock_of(calls, [c * 0.7 for c in calls]).contradiction()  # shorter than reported


@pytest.mark.parametrize(
    "selector",
    ["tests.planted.clock:halves_its_clock", "tests.planted.clock:sleeps_through_its_pauses"],
)
def test_a_worker_whose_clock_the_judges_contradicts_is_not_credible(selector):
    """Live, in a worker: a busy machine only makes these contradictions larger."""
    [client] = open_clients([selector])
    try:
        x = client.from_numpy(np.random.default_rng(0).standard_normal((1, 8, 512, 64)), "float64")
        clock = WorkerClock(client, [x, x, x], settle_seconds=0.2)
        for _ in range(4):
            clock()
        problem = clock.contradiction()
    finally:
        client.close()
    assert problem is not None
    assert problem.startswith("timing not credible")
    assert "the judge's clock puts it at" in problem, problem
