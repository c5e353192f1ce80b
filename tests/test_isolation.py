"""An implementation that crashes or hangs leaves every other verdict intact and is reported."""

from __future__ import annotations

import json

CRASHING = "tests.planted.crashing"


def test_crashes_and_hangs_fail_their_claims_and_spare_the_others(suite, tmp_path):
    report_path = tmp_path / "report.json"
    run = suite(
        "--impl",
        f"numpy,{CRASHING}:segfaults,{CRASHING}:exits,{CRASHING}:hangs",
        "--claims",
        "CONTRACT-DETERMINISM,MASK-ROW0",
        "-n",
        "2",
        "--timeout",
        "8",
        "--timeout-method",
        "thread",
        "--report-json",
        str(report_path),
        timeout=300,
    )
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    verdicts = {s["name"]: s for s in json.loads(report_path.read_text())["subjects"]}
    numpy = verdicts["numpy"]
    assert numpy["verdict"] == "conforms"
    assert {c: e["verdict"] for c, e in numpy["claims"].items()} == {
        "CONTRACT-DETERMINISM": "met",
        "MASK-ROW0": "met",
    }
    for name in ("segfaults", "exits", "hangs"):
        subject = verdicts[f"{CRASHING}:{name}"]
        assert subject["verdict"] == "FAILS", subject
        failed = [c for c, e in subject["claims"].items() if e["verdict"] == "FAILED"]
        assert failed, subject
    assert f"{CRASHING}:segfaults ended the test process" in run.stdout
    assert f"{CRASHING}:exits ended the test process" in run.stdout
    assert f"{CRASHING}:hangs did not return within" in run.stdout
    assert "stopped by --timeout 8: it hangs" in run.stdout
    assert "not called again after it crashed in" in run.stdout


def test_a_bad_claims_pattern_is_a_usage_error_under_xdist_too(suite):
    run = suite("--impl", "numpy", "--claims", "CONTRACT-DET*,NOPE", "-n", "2")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "--claims NOPE matches no claim" in run.stderr
    assert "INTERNALERROR" not in run.stdout + run.stderr
