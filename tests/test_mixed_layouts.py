"""LAYOUT-STRIDES gives q, k and v layouts of their own: a kernel that reads one operand with
another's strides fails where they differ, though it passes every layout shared by all three."""

from __future__ import annotations

import re

from tests.suite_process import run_suite


def test_a_kernel_that_swaps_k_and_v_strides_fails_on_mixed_layouts_only():
    result = run_suite(
        "--impl", "tests.planted.strides:swapped_kv_strides", "--claims", "LAYOUT-STRIDES",
        "-q", "-rf",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    failed = set(re.findall(r"FAILED \S+\[\S+:swapped_kv_strides-\w+-([^\]]+)\]", result.stdout))
    # k's and v's strides differ in these, and agree in every layout shared by all three
    assert failed == {
        "k=heads_last", "v=heads_last", "k=row_gaps", "v=row_gaps", "k=broadcast_kv",
        "v=broadcast_kv", "k=heads_last,v=row_gaps", "k=row_gaps,v=heads_last",
    }, result.stdout[-4000:]  # fmt: skip
