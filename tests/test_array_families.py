"""What the suite cannot lay out for an implementation's arrays is not checked, with the reason;
an implementation's own helper failing is its own failure."""

from __future__ import annotations

import json

PLANTED = "tests.planted.foreign_arrays"


def test_views_the_suite_cannot_make_are_not_checked_and_the_kernels_own_are_judged(
    suite, tmp_path
):
    report_path = tmp_path / "report.json"
    run = suite(
        "--impl",
        f"{PLANTED}:BoxedKernel,{PLANTED}:BoxedKernelWithBrokenPermute",
        "--claims",
        "LAYOUT-STRIDES",
        "--report-json",
        str(report_path),
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    subjects = {s["name"]: s for s in json.loads(report_path.read_text())["subjects"]}
    boxed = subjects["boxed"]["claims"]["LAYOUT-STRIDES"]
    assert boxed["verdict"] == "met", boxed
    # per dtype: every layout with a permuted or broadcast view (3 shared, 7 mixed)
    assert (boxed["skipped"], boxed["failed"]) == (20, 0), boxed
    assert any(
        "the default Implementation.permuted() raised TypeError" in reason
        and "impls.torch_arrays.TorchArrays" in reason
        for reason in boxed["skip_reasons"]
    ), boxed["skip_reasons"]
    own = subjects["boxed_broken_permute"]["claims"]["LAYOUT-STRIDES"]
    assert own["verdict"] == "FAILED", own
    assert "permute is not supported" in own["first_failure"]["message"]
