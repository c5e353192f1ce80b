"""A timing decides nothing where timings only report (ATTNSPEC_TIMINGS=report, the perf-report
env of the README's test command), and still fails a gate run on its own."""

from __future__ import annotations

import pytest

from perf.measure import REPORT_ONLY_VAR, require_timing


def test_a_missed_gate_fails_by_default(monkeypatch):
    monkeypatch.delenv(REPORT_ONLY_VAR, raising=False)
    table: list = []
    with pytest.raises(pytest.fail.Exception, match=r"took 3\.00x"):
        require_timing(False, "GATE: numpy took 3.00x torch_sdpa's median time", table)


def test_a_missed_gate_is_reported_loudly_where_timings_only_report(monkeypatch):
    monkeypatch.setenv(REPORT_ONLY_VAR, "report")
    table: list = []
    require_timing(False, "GATE: numpy took 3.00x torch_sdpa's median time", table)
    assert table == [
        (
            "MISSED",
            "",
            "",
            "",
            "",
            f"GATE: numpy took 3.00x torch_sdpa's median time ({REPORT_ONLY_VAR}=report)",
        )
    ]
    require_timing(True, "never shown", table)
    assert len(table) == 1
