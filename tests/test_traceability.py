"""Traceability: every catalogue claim has a test, every test names catalogue claims."""

from __future__ import annotations

import json
import os

from spec import load_catalogue


def collected_claims(suite, tmp_path) -> dict[str, list[str]]:
    out = tmp_path / "claims.json"
    os.environ["ATTNSPEC_CLAIMS_OUT"] = str(out)
    try:
        run = suite("--collect-only", "-q", "-p", "tests.claim_collector", "--impl", "numpy")
    finally:
        del os.environ["ATTNSPEC_CLAIMS_OUT"]
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


def test_every_claim_has_a_test_and_every_test_a_known_claim(suite, tmp_path):
    claims = collected_claims(suite, tmp_path)
    catalogue = {claim.id for claim in load_catalogue()}
    tested = {claim for names in claims.values() for claim in names}
    assert not catalogue - tested, f"claims with no test: {sorted(catalogue - tested)}"
    assert not tested - catalogue, f"tests name unknown claims: {sorted(tested - catalogue)}"
    unmarked = [test for test, names in claims.items() if not names]
    assert not unmarked, f"tests without a claim: {unmarked}"


def test_mathematics_tests_run_once_not_per_implementation(suite, tmp_path):
    claims = collected_claims(suite, tmp_path)
    checked_on = {claim.id: claim.checked_on for claim in load_catalogue()}
    for test, names in claims.items():
        if all(checked_on[name] == "mathematics" for name in names):
            assert "[numpy" not in test, f"{test} checks mathematics but runs per implementation"
