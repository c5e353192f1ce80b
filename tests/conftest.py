"""Fixtures for the project's own tests."""

from __future__ import annotations

import pytest

from impls.cuda_kernels import report_lines
from tests.suite_process import run_suite
from tests.test_cuda_kernels import KERNEL_RESOURCES
from tests.zoo.kill_matrix import ZOO_SUMMARY


@pytest.fixture
def suite():
    """Runs ``python -m pytest conformance ARGS`` in a subprocess; see :func:`run_suite`."""
    return run_suite


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    summary = config.stash.get(ZOO_SUMMARY, None)
    if summary is not None:
        terminalreporter.write_sep("=", "attnspec zoo: kill matrix (failing MUST tests per claim)")
        terminalreporter.write_line(summary)
    resources = config.stash.get(KERNEL_RESOURCES, None)
    if resources:
        terminalreporter.write_sep("=", "attnspec CUDA kernels compiled by NVRTC (ptxas -v)")
        for line in report_lines(resources):
            terminalreporter.write_line(line)
