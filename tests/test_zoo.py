"""Test the tests: the suite must reject every mutant in the zoo and accept every correct variant.

One run of the conformance suite judges all members at once (``tests/zoo/kill_matrix.py``), each
mutant on the claims its row of docs/zoo.md's kill matrix names, each correct variant on all;
the tests below read its verdicts. The whole matrix, every member on every claim, is
``python -m tests.zoo.kill_matrix --check`` (``tox -e zoo``). The kill matrix and the mutation
score are printed at the end of the session.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.tolerance import compare_to_oracle
from spec.dtypes import round_to
from tests.made_once import session_directory
from tests.zoo import FAMILIES, load_members
from tests.zoo.kill_matrix import (
    DIAGNOSIS_END,
    DIAGNOSIS_START,
    MATRIX_END,
    MATRIX_START,
    ZOO_SUMMARY,
    claims_in_kill_matrix,
    default_workers,
    diagnosis_problems,
    generated_block,
    machine_independent,
    markdown_diagnosis_matrix,
    markdown_matrix,
    run_zoo,
    text_matrix,
)

pytestmark = pytest.mark.zoo

MEMBERS = load_members()
MUTANTS = [name for name, m in MEMBERS.items() if not m.correct]
CORRECT = [name for name, m in MEMBERS.items() if m.correct]
HIDDEN = [name for name in MUTANTS if MEMBERS[name].hidden_at_easy_shape]
EASY_SHAPE = (1, 1, 64, 64)  # (B, H, T, D): one head, one tile, ANDREA's head dim


@pytest.fixture(scope="module")
def zoo_run(request, tmp_path_factory):
    # Under xdist every worker holding a zoo test asks for the run: the first runs it for all.
    shared = session_directory(tmp_path_factory)
    # Each mutant on the claims its row of docs/zoo.md names (the whole matrix is tox -e zoo's)
    claims = claims_in_kill_matrix(MEMBERS)
    run = run_zoo(MEMBERS, workers=default_workers(), shared=shared, claims=claims)
    request.config.stash[ZOO_SUMMARY] = text_matrix(run)  # printed by tests/conftest.py
    return run


def test_the_zoo_is_large_and_covers_every_family():
    assert len(MUTANTS) >= 25, f"{len(MUTANTS)} mutants, but the zoo should hold at least 25"
    assert len(CORRECT) >= 5, f"{len(CORRECT)} correct variants, but should be at least 5"
    families = {MEMBERS[name].family for name in MUTANTS}
    assert families == set(FAMILIES), f"families without a mutant: {set(FAMILIES) - families}"


@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_is_rejected(zoo_run, name):
    """By a MUST claim, or by the SHOULD claim its bug breaks (a run with --fail-on-should)."""
    verdict = zoo_run.verdicts[name]
    assert verdict.rejected, (
        f"mutant {name} SURVIVED the suite ({verdict.checked_claims} claims checked, none "
        f"failed): {verdict.member.doc}"
    )


@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_is_caught_by_the_claim_its_bug_breaks(zoo_run, name):
    member, verdict = MEMBERS[name], zoo_run.verdicts[name]
    failed = verdict.failed_must | verdict.failed_should
    assert member.caught_by in failed, (
        f"mutant {name} breaks {member.caught_by}, but the suite rejected it only on "
        f"{sorted(failed) or 'nothing'}: {member.doc}"
    )


@pytest.mark.parametrize("name", CORRECT)
def test_correct_variant_meets_every_must_claim(zoo_run, name):
    verdict = zoo_run.verdicts[name]
    assert not verdict.rejected, (
        f"correct variant {name} was rejected on {sorted(verdict.failed_must)} "
        f"(e.g. {next(iter(verdict.failed_must.values()))[0]}): {verdict.member.doc}"
    )
    assert verdict.checked_claims > 0, f"no claim was checked on {name}"


@pytest.mark.parametrize("name", HIDDEN)
def test_hidden_mutant_is_right_at_the_easy_shape(name):
    """The mutants said to hide at the easy shape do: a suite testing only there would pass them."""
    rng = np.random.default_rng(0)
    q, k, v = (round_to(rng.standard_normal(EASY_SHAPE), "float32") for _ in range(3))
    out = MEMBERS[name].fn(*(x.astype(np.float32) for x in (q, k, v)), causal=True, scale=None)
    comparison = compare_to_oracle(np.asarray(out, np.float64), q, k, v, dtype="float32")
    assert comparison.ok, f"{name} is visibly wrong at the easy shape: {comparison.describe()}"


def test_the_kill_matrix_is_current(zoo_run):
    block = generated_block()
    assert block is not None, f"docs/zoo.md lacks the {MATRIX_START} ... {MATRIX_END} markers"
    assert block == markdown_matrix(zoo_run), (
        "docs/zoo.md's kill matrix differs from this run's: "
        "regenerate it with python -m tests.zoo.kill_matrix --write"
    )


@pytest.mark.parametrize("name", list(MEMBERS))
def test_member_is_diagnosed_as_its_catalogued_mistake_and_nothing_else(zoo_run, name):
    """A mutant whose bug is a variant of the formula is diagnosed as that mistake, with
    nothing its variant is not alike; one without a catalogued mistake gets none named (only
    where its errors lie); a correct variant gets no diagnosis at all."""
    problems = diagnosis_problems(zoo_run.verdicts[name])
    assert not problems, f"{name}: {'; '.join(problems)}: {MEMBERS[name].doc}"


def test_every_formula_mutant_names_a_mistake():
    """The zoo's mutants without a catalogued mistake are the ones whose bug no variant of the
    formula expresses: a race or an order of summation, memory never written, strides read
    wrongly, a state kept between calls, a contract broken rather than a formula."""
    without = {name for name in MUTANTS if MEMBERS[name].mistake is None}
    families = {MEMBERS[name].family for name in without}
    assert families <= {"scaling", "tiling", "layout", "dtype", "window", "padding", "strides",
                        "memory", "stress"}, families  # fmt: skip
    # 62 of the 81 name one (docs/zoo.md's diagnosis matrix): none may silently lose it
    assert len(MUTANTS) - len(without) >= 62, sorted(without)


def test_the_diagnosis_matrix_is_current(zoo_run):
    block = generated_block(DIAGNOSIS_START, DIAGNOSIS_END)
    assert block is not None, f"docs/zoo.md lacks the {DIAGNOSIS_START} ... {DIAGNOSIS_END} markers"
    # The farthest matches' budget fractions depend on the machine's BLAS and SIMD paths: shown
    # in docs/zoo.md, not compared; which mistake is named, and where, does not.
    assert machine_independent(block) == machine_independent(markdown_diagnosis_matrix(zoo_run)), (
        "docs/zoo.md's diagnosis matrix differs from this run's: "
        "regenerate it with python -m tests.zoo.kill_matrix --write"
    )
