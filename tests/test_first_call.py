"""An implementation whose first call breaks the contract is told so once, with a reproducer,
and fails every claim, instead of burying the one sentence under hundreds of tracebacks."""

from __future__ import annotations

import json

import pytest

PLAIN = "tests.planted.plain"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("returns_a_list", "returned builtins.list"),
        ("drops_a_column", "returned shape (1, 2, 16, 15) at its first call"),
    ],
)
def test_a_broken_first_call_is_said_once_and_fails_every_claim(suite, tmp_path, name, message):
    report_path = tmp_path / "report.json"
    run = suite("--impl", f"{PLAIN}:{name}", "--report-json", str(report_path))
    assert run.returncode == 1, run.stdout[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) < 300, f"{len(lines)} lines of output"
    assert "Traceback" not in run.stdout
    assert "reproduce: python -m pytest --pyargs 'conformance." in run.stdout
    assert message in run.stdout
    (subject,) = [s for s in json.loads(report_path.read_text())["subjects"] if s["selector"]]
    verdicts = {claim: entry["verdict"] for claim, entry in subject["claims"].items()}
    # every claim it could be judged on fails; those needing autograd stay not checked
    assert {c for c, v in verdicts.items() if v != "FAILED"} <= {"MASK-GRAD", "OUT-GRAD"}
    assert len([v for v in verdicts.values() if v == "FAILED"]) >= 20
