"""An implementation whose first call breaks the contract is told so once, with a reproducer,
and fails every claim it declares, instead of burying the one sentence under hundreds of
tracebacks."""

from __future__ import annotations

import json

import pytest

from spec.catalogue import load_catalogue

PLAIN = "tests.planted.plain"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("returns_a_list", "returned builtins.list"),
        ("drops_a_column", "returned shape (1, 2, 16, 15) at its first call"),
    ],
)
def test_a_broken_first_call_is_said_once_and_fails_every_declared_claim(
    suite, tmp_path, name, message
):
    report_path = tmp_path / "report.json"
    run = suite("--impl", f"{PLAIN}:{name}", "--report-json", str(report_path))
    assert run.returncode == 1, run.stdout[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) < 300, f"{len(lines)} lines of output"
    assert "Traceback" not in run.stdout
    assert "reproduce: python -m pytest --pyargs 'conformance." in run.stdout
    assert message in run.stdout
    (subject,) = [s for s in json.loads(report_path.read_text())["subjects"] if s["selector"]]
    assert message in subject["broken"]
    verdicts = {claim: entry["verdict"] for claim, entry in subject["claims"].items()}
    # every claim it could be judged on fails (a SHOULD claim: unmet); the claims it does not
    # declare (the extensions, autograd) are not checked, as they would be were it not broken
    catalogue = load_catalogue()
    undeclared = {"MASK-GRAD", "OUT-GRAD"} | {
        claim.id for claim in catalogue if claim.capability not in (None, "none")
    }
    for claim, verdict in verdicts.items():
        if claim in undeclared:
            assert verdict == "not checked", (claim, verdict)
        else:
            assert verdict == ("FAILED" if catalogue[claim].level == "MUST" else "unmet"), claim
    assert len([v for v in verdicts.values() if v == "FAILED"]) >= 20
