"""The suite run end to end: what it rejects, what it accepts, what it prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from spec import load_catalogue
from spec.catalogue import BLOCK_SCALED, FP8
from tests.suite_process import ROOT

PLANTED = "tests.planted.plain"
MUTANTS = "tests.zoo.mutants"


def test_scale_bug_fails_naming_the_claim_and_printing_a_reproducer(suite):
    run = suite("--impl", f"{MUTANTS}:scale_by_one_over_d", "-k", "test_formula_at_length")
    assert run.returncode == 1, run.stdout
    assert "[OUT-FORMULA tests.zoo.mutants:scale_by_one_over_d attention(causal=True" in run.stdout
    rerun = "reproduce: python -m pytest --pyargs 'conformance.test_output::test_formula_at_length["
    assert rerun in run.stdout
    assert "--attnspec-seed 20261129   # B=1 H=2 Tq=" in run.stdout
    assert "formula's error" in run.stdout  # what the budget allows, and why
    assert "max abs err" in run.stdout
    assert "FAILED MUST OUT-FORMULA" in run.stdout
    assert "diagnosis: matches" in run.stdout  # in the failure message itself


def test_a_reproducer_runs_as_printed_in_the_checkout_and_fails_the_same_way(suite):
    run = suite("--impl", f"{MUTANTS}:top_left_alignment", "--claims", "OUT-FORMULA")
    assert run.returncode == 1, run.stdout[-3000:]
    lines = run.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("reproduce: "))
    # the failure's first line (the comparison), then its diagnosis, then its reproducer
    message, diagnosis = lines[first - 2], lines[first - 1]
    assert diagnosis.startswith("diagnosis: matches mask-top-left, "), diagnosis
    command = lines[first].removeprefix("reproduce: ").split("   #")[0]
    assert command.startswith("python -m pytest --pyargs ")
    env = {k: v for k, v in os.environ.items() if k != "ATTNSPEC_IMPL"}
    again = subprocess.run(
        sys.executable + command.removeprefix("python"),  # `python` as this interpreter
        shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=env | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert again.returncode == 1, command + "\n" + again.stdout[-3000:]
    assert message in again.stdout
    assert "1 failed" in again.stdout


def test_float32_inside_a_float64_implementation_is_caught(suite):
    run = suite("--impl", f"{MUTANTS}:computes_in_float32", "-k", "test_formula_at_length")
    assert run.returncode == 1, run.stdout
    assert "float64-1024-causal" in run.stdout
    assert "dtype=float64" in run.stdout


def test_wrong_result_type_fails_the_contract(suite):
    run = suite("--impl", f"{PLANTED}:returns_a_list", "-k", "test_output_dtype_shape_device")
    assert run.returncode == 1
    assert "returned builtins.list, but should return numpy.ndarray" in run.stdout


def test_bad_selection_is_a_usage_error(suite):
    run = suite("--impl", "no_such_impl")
    assert run.returncode == 4
    assert "attnspec: unknown implementation 'no_such_impl'; available: built-in:" in run.stderr


def test_claim_pattern_that_matches_nothing_is_a_usage_error(suite):
    run = suite("--impl", "numpy", "--claims", "NOPE-*")
    assert run.returncode == 4
    assert "--claims: NOPE-* matches no claim" in run.stderr


def test_claims_option_selects_by_claim(suite):
    run = suite("--impl", "numpy", "--claims", "CONTRACT-DET*", "-q")
    assert run.returncode == 0
    assert "2 passed" in run.stdout
    assert "deselected" in run.stdout


def test_run_where_every_implementation_is_skipped_fails(suite):
    run = suite("--impl", "torch_sdpa_cuda", "--claims", "CONTRACT-DETERMINISM")
    if "torch_sdpa_cuda cannot run here" not in run.stdout:
        pytest.skip("torch_sdpa_cuda can run on this machine")
    assert run.returncode == 5
    assert "nothing was checked" in run.stdout


def test_header_names_implementations_seed_and_profile(suite):
    run = suite("--impl", "numpy", "--claims", "CONTRACT-DETERMINISM", "--attnspec-seed", "7")
    assert "attnspec impl numpy: numpy " in run.stdout
    assert "seed 7" in run.stdout
    assert "hypothesis profile ci" in run.stdout


def test_bad_seed_is_a_usage_error(suite):
    run = suite("--impl", "numpy", "--attnspec-seed", "minus-one")
    assert run.returncode == 4
    assert "seed='minus-one', but should be a whole number" in run.stderr


@pytest.mark.parametrize(("flags", "status"), [((), 0), (("--fail-on-should",), 1)])
def test_a_should_claim_not_met_fails_the_run_only_on_request(suite, flags, status):
    # numpy lets a NaN in a future value reach past rows: MASK-NONFINITE-VALUES, a SHOULD claim,
    # in 10 tests: 2 float dtypes x NaN, inf and -inf, and one per FP8 format.
    run = suite("--impl", "numpy", "--claims", "MASK-NONFINITE-VALUES", *flags)
    assert run.returncode == status, run.stdout[-3000:]
    if status == 0:
        assert re.search(
            r"unmet, not failing the run: .*MASK-NONFINITE-VALUES \(10 tests\)", run.stdout
        )
    else:
        assert "FAILED SHOULD MASK-NONFINITE-VALUES (10 tests)" in run.stdout


def test_nonfinite_future_keys_and_values_are_judged_apart(suite, tmp_path):
    """A mask that replaces scores keeps a NaN key out and a dense A @ V lets a NaN value in; a
    mask added to the scores lets both in. One verdict for both could not tell the two apart."""
    report = tmp_path / "report.json"
    run = suite(
        "--impl",
        "numpy,tests.planted.plain:masks_by_adding",
        "--claims",
        "MASK-NONFINITE-*",
        "--report-json",
        str(report),
    )
    assert run.returncode == 0, run.stdout[-3000:]
    verdicts = {
        subject["name"]: {claim: entry["verdict"] for claim, entry in subject["claims"].items()}
        for subject in json.loads(report.read_text())["subjects"]
    }
    assert verdicts["numpy"] == {
        "MASK-NONFINITE": "unmet",
        "MASK-NONFINITE-KEYS": "met",
        "MASK-NONFINITE-VALUES": "unmet",
    }
    assert verdicts["tests.planted.plain:masks_by_adding"] == {
        "MASK-NONFINITE": "unmet",
        "MASK-NONFINITE-KEYS": "unmet",
        "MASK-NONFINITE-VALUES": "unmet",
    }


def test_a_scale_is_never_sent_to_an_implementation_that_declares_none(suite, tmp_path):
    """CONTRACT-ERRORS's NaN and infinite scales go only to implementations that take a scale:
    one whose scale is fixed, and says so, ignores them and must not fail for it."""
    report = tmp_path / "report.json"
    run = suite(
        "--impl",
        "tests.planted.fixed_scale:FixedScale",
        "--claims",
        "CONTRACT-ERRORS",
        "--report-json",
        str(report),
    )
    assert run.returncode == 0, run.stdout[-3000:]
    subject = next(s for s in json.loads(report.read_text())["subjects"] if s["selector"])
    assert subject["claims"]["CONTRACT-ERRORS"]["verdict"] == "met"


def test_implementations_are_judged_on_the_same_inputs(suite, tmp_path):
    """A test's inputs come from the run's seed, the test and its case, never from the name of
    the implementation: renaming one cannot change its verdict, and every implementation in a run
    is judged on the same data."""
    log = tmp_path / "inputs"
    run = suite(
        "--impl",
        f"{PLANTED}:records_inputs_first,{PLANTED}:records_inputs_second",
        "--claims",
        "OUT-FORMULA,MASK-PREFIX",
        "--no-sandbox",  # the recorders write what they were handed to a log beside tmp_path
        env_overrides={"ATTNSPEC_INPUTS_LOG": str(log)},
    )
    assert run.returncode == 0, run.stdout[-3000:]
    first, second = (
        sorted((tmp_path / f"inputs.{name}").read_text().split()) for name in ("first", "second")
    )
    assert len(first) > 50
    assert first == second


# Claims whose tests need autograd or FP8, which neither implementation below declares.
NOT_DECLARED = {"OUT-GRAD", "MASK-GRAD"} | {
    claim.id for claim in load_catalogue() if claim.capability in (FP8, BLOCK_SCALED)
}


@pytest.mark.parametrize(
    ("selector", "undeclared_extensions"),
    [
        # declares every capability but autograd, FP8 and block-scaled
        ("numpy_reference", False),
        (f"{PLANTED}:correct", True),  # a plain callable: the document's claims, no extension
    ],
)
def test_every_claim_an_implementation_declares_is_checked(
    suite, tmp_path, selector, undeclared_extensions
):
    """A claim left not checked on an implementation that declares what it needs is a test that
    skips where it should run (a Case that asks for more than it means to). Both conform: a plain
    callable as well as a built-in."""
    path = tmp_path / "report.json"
    run = suite("--impl", selector, "-n", "2", "--report-json", str(path), "-q")
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"{selector}  conforms" in run.stdout
    (subject,) = [s for s in json.loads(path.read_text())["subjects"] if s["selector"]]
    catalogue = load_catalogue()
    excused = set(NOT_DECLARED)
    if undeclared_extensions:
        excused |= {c.id for c in catalogue if c.is_extension and c.capability != "none"}
    unchecked = {
        claim: entry["skip_reasons"]
        for claim, entry in subject["claims"].items()
        if entry["verdict"] == "not checked" and claim not in excused
    }
    assert not unchecked, f"claims {selector} declares but were not checked: {unchecked}"


def test_paged_cases_fit_the_page_sizes_an_implementation_declares(suite):
    """A kernel taking pages of 4 keys alone, declared (``fn.page_sizes = (4,)``), is judged on
    pages of 4 rather than failed or skipped; undeclared, the same kernel raised in every paged
    test (seen with the declaration removed)."""
    run = suite("--impl", f"{PLANTED}:pages_of_four_only", "--claims", "PAGED-KV,PAGED-UNREAD")
    assert run.returncode == 0, run.stdout[-3000:]
    assert re.search(r"\b\d+ passed\b", run.stdout), run.stdout[-1500:]
    assert "failed" not in run.stdout, run.stdout[-1500:]
    assert "does not declare page size" not in run.stdout
    # what it does skip is what it does not declare: fewer k/v heads than q heads
    skips = re.findall(r"^SKIPPED \[\d+\] .*$", run.stdout, re.MULTILINE)
    assert all("does not declare gqa" in skip for skip in skips), skips
