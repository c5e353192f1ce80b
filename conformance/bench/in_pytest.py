"""``attnspec bench`` as a pytest test, for runners that gather pytest's results:

    python -m pytest --pyargs conformance.bench.in_pytest --bench-impl mykernel:attention

It passes when the gate passes (or there is none) and every timing is credible; it fails on a
gate that FAILS, a wrong answer or a timing that is not credible; an inconclusive gate is a skip
that says so. Named neither test_*.py nor *_test.py: a conformance run never collects it."""

from __future__ import annotations

import pytest

from conformance.bench.cli import EXIT_FAILS, EXIT_INCONCLUSIVE, BenchUsageError, run_bench
from conformance.bench.options import bench_namespace
from conformance.bench.report import table_lines


def test_bench(pytestconfig):
    options = bench_namespace(pytestconfig)
    if options.impl is None and options.gates is None:
        pytest.fail(
            "give --bench-impl SELECTOR (the implementation to time) or --bench-gates FILE",
            pytrace=False,
        )
    try:
        run = run_bench(options)
    except BenchUsageError as exc:
        pytest.fail(str(exc), pytrace=False)
    report = "\n".join([run.machine.source if run.machine else "", *table_lines(run.results)])
    print(report)
    said = "\n".join([*run.skipped, *run.problems])
    if run.status == EXIT_FAILS:
        pytest.fail(f"{report}\n{said}", pytrace=False)
    if run.status == EXIT_INCONCLUSIVE:
        pytest.skip(f"inconclusive: the ratio's interval straddles the gate\n{report}")
