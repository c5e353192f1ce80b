"""The performance run's table: every measurement a test records is printed at the end."""

from __future__ import annotations

import pytest

from conformance.report.tables import text_table
from perf.measure import close_worker_clients

RESULTS_KEY = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def perf_table(pytestconfig: pytest.Config) -> list:
    """Rows (what, implementation, shape and dtype, median ms, rate, note) for the final table."""
    return pytestconfig.stash.setdefault(RESULTS_KEY, [])


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    rows = config.stash.get(RESULTS_KEY, [])
    if not rows:
        return
    header = ("measurement", "implementation", "shape, dtype", "median", "rate", "note")
    terminalreporter.write_sep("=", "attnspec performance")
    for line in text_table([header, *([str(cell) for cell in row] for row in rows)]):
        terminalreporter.write_line(line)
    missed = [row for row in rows if row[0] == "MISSED"]
    if missed:
        terminalreporter.write_sep(
            "!", f"attnspec: {len(missed)} timing(s) MISSED their gate (reported, not failed)"
        )
        for row in missed:
            terminalreporter.write_line(row[-1], red=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    close_worker_clients()
