"""--first-failure and attnspec.judge: a loop's verdict, sooner where the candidate is wrong, as
typed objects, from the same confined run as attnspec run."""

from __future__ import annotations

import collections
import json

import pytest

import attnspec
from conformance.run.first_failure import FAILURE_ORDER, failure_rank
from conformance.verifier import BenchResult, Verdict
from spec.catalogue import load_catalogue
from tests.suite_process import ROOT, run_module
from tests.zoo.kill_matrix import generated_block

MUTANT = "tests.zoo.mutants:mask_off_by_one"
CLAIMS = "OUT-FORMULA,MASK-PREFIX,MASK-ROW0,SCORE-SHAPE,SOFTMAX-ROWSUM"


def test_the_claims_that_most_often_fail_run_first():
    """FAILURE_ORDER is docs/zoo.md's kill matrix counted: each MUST claim by how many mutants
    it rejects, most first, ties in the catalogue's order."""
    catalogue = [claim.id for claim in load_catalogue()]
    rejected_by = collections.Counter()
    for line in generated_block().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rejected_by.update(claim for claim in cells[3].split(", ") if claim in catalogue)
    ranked = sorted(rejected_by, key=lambda claim: (-rejected_by[claim], catalogue.index(claim)))
    assert list(FAILURE_ORDER) == ranked
    assert failure_rank(["SCORE-SHAPE", "OUT-FORMULA"]) == 0
    assert failure_rank(["DOC-ONLY"]) == len(FAILURE_ORDER)


def report_of(tmp_path, *options: str) -> dict[str, dict]:
    report = tmp_path / "report.json"
    run = run_module(
        "pytest", "conformance", "-p", "no:cacheprovider", "--impl", f"numpy,{MUTANT}",
        "--claims", CLAIMS, "--hypothesis-profile", "verdicts", "--report-json", str(report),
        *options,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:]
    return {s["name"]: s for s in json.loads(report.read_text())["subjects"]}


def test_first_failure_stops_a_wrong_kernel_at_its_first_failed_claim_and_no_other(tmp_path):
    stopped = report_of(tmp_path, "--first-failure")
    whole = report_of(tmp_path)
    mutant = stopped[MUTANT]["claims"]
    assert [c for c, entry in mutant.items() if entry["verdict"] == "FAILED"] == ["OUT-FORMULA"]
    for claim, entry in mutant.items():
        if claim != "OUT-FORMULA":
            assert entry["verdict"] == "not checked", (claim, entry)
            assert any("already FAILS OUT-FORMULA" in r for r in entry["skip_reasons"]), entry
    failed_whole = [c for c, entry in whole[MUTANT]["claims"].items() if entry["failed"]]
    assert len(failed_whole) > 1, failed_whole  # without it, every claim it breaks is judged
    # a correct kernel beside it is judged in full, as without the option
    verdicts = {c: e["verdict"] for c, e in stopped["numpy"]["claims"].items()}
    assert verdicts == {c: e["verdict"] for c, e in whole["numpy"]["claims"].items()}


def test_judge_returns_the_reports_fields_as_typed_objects():
    verdict = attnspec.judge(
        ["numpy", MUTANT], claims=CLAIMS, first_failure=True, impl_paths=[ROOT], seed=20261129
    )
    assert isinstance(verdict, Verdict)
    assert not verdict.conforms
    assert verdict["numpy"].conforms
    mutant = verdict[MUTANT]
    assert mutant.verdict == "FAILS"
    assert mutant.failed_claims == ["OUT-FORMULA"]
    failure = mutant.claims["OUT-FORMULA"].first_failure
    assert failure is not None
    assert "budget" in failure.message, failure
    assert mutant.sandbox == "full"
    assert verdict.workers["namespaces"] == ["network", "ipc", "mount", "pid"]
    assert verdict.exit_status == 1


def test_judge_adds_the_bench_verdict_where_asked():
    verdict = attnspec.judge(
        "numpy", claims="SCORE-SHAPE", bench="1,2,2,64,64,32", baseline="numpy_flash",
        rounds=3, impl_paths=[ROOT],
    )  # fmt: skip
    assert verdict["numpy"].conforms
    assert isinstance(verdict.bench, BenchResult)
    assert set(verdict.bench.seconds) == {"numpy", "numpy_flash"}
    # whether its timings were credible on this busy machine decides nothing here
    assert verdict.bench.status in (0, 1), verdict.bench


def test_judge_refuses_what_names_nothing():
    with pytest.raises(ValueError, match="give an implementation"):
        attnspec.judge([])
    with pytest.raises(ValueError, match="no_such_module"):
        attnspec.judge("no_such_module:attention", claims="SCORE-SHAPE")


def test_a_candidate_named_by_its_file_is_found_by_the_path_it_was_given(tmp_path, monkeypatch):
    (tmp_path / "k17.py").write_text(
        "from spec.formula import reference_attention\n"
        "def attention(q, k, v, *, causal=True, scale=None):\n"
        "    return reference_attention(q, k, v, causal=causal, scale=scale).astype(q.dtype)\n"
    )
    monkeypatch.chdir(tmp_path)
    verdict = attnspec.judge("k17.py:attention", claims="SCORE-SHAPE", impl_paths=[ROOT])
    assert verdict["k17.py:attention"].conforms
    assert verdict.conforms
