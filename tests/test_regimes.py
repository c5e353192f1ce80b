"""The regime table (spec/regimes.py): what the judge reads off a call, and that every regime is
drawn by a test of its claims, as docs/regimes.md shows."""

from __future__ import annotations

import math

import numpy as np

from conformance.judge.harness import Case
from conformance.judge.regimes import choices_of_call, regimes_of_call, regimes_of_merge
from spec import load_catalogue
from spec.regimes import REGIME_IDS, REGIMES
from tests.regime_coverage import (
    CHOICES_END,
    CHOICES_START,
    coverage,
    current_block,
    drawn_choices,
    drawn_regimes,
    gaps,
    generated_block,
    generated_choices_block,
    measured_report,
)


def normal(case: Case, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape) for shape in (case.q_shape, case.k_shape, case.v_shape))


def test_the_table_names_catalogue_claims_once_each():
    catalogue = load_catalogue()
    assert len(set(REGIME_IDS)) == len(REGIME_IDS)
    unknown = {(r.id, c) for r in REGIMES for c in r.claims if c not in catalogue}
    assert not unknown, f"regimes name claims the catalogue lacks: {sorted(unknown)}"


def test_a_paged_decode_of_groups_of_seven_at_page_edges():
    case = Case(
        batch=3, heads=14, kv_heads=2, tq=1, tk=33, head_dim=8, key_lengths=(15, 33, 0),
        page_size=16,
    )  # fmt: skip
    drawn = regimes_of_call(case, *normal(case))
    expected = {
        "gqa.group-7", "paged.gqa", "paged.group-not-a-power-of-two", "paged.decode",
        "shape.decode", "keys.page-minus-1", "keys.page-plus-1", "keys.capacity", "keys.length-0",
        "paged.page-16", "paged.page-divides-no-length",
    }  # fmt: skip
    assert expected <= drawn, sorted(expected - drawn)
    assert not {"keys.page", "gqa.group-8", "gqa.one-kv-head"} & drawn, sorted(drawn)


def test_scores_far_from_zero_are_read_off_the_inputs():
    case = Case(batch=1, heads=2, tq=6, head_dim=16)
    q, k, v = normal(case)
    q[..., 0], k[..., 0] = 1.0, -(2.0**20) * 4
    assert "scores.far-below-zero" in regimes_of_call(case, q, k, v)
    k[..., 0] = 2.0**20 * 4
    drawn = regimes_of_call(case, q, k, v)
    assert "scores.far-above-zero" in drawn
    assert "scores.far-below-zero" not in drawn
    # keys past an item's length do not count: here they are the only far ones
    padded = case.with_(key_lengths=(3,))
    q, k, v = normal(padded)
    k[..., 3:, :] = 1e9
    assert "scores.far-above-zero" not in regimes_of_call(padded, q, k, v)


def test_the_same_inputs_at_another_scale_or_key_lengths_draw_their_own_score_regimes():
    """The judge keeps a row's score extremes per inputs (every implementation judged is called
    on the same ones): another scale, or other key lengths, are other scores."""
    case = Case(batch=1, heads=2, tq=6, head_dim=16)
    q, k, v = normal(case)
    q[..., 0], k[..., 0] = 1.0, 2.0**20 * 4
    assert "scores.far-above-zero" in regimes_of_call(case, q, k, v)
    assert "scores.far-above-zero" not in regimes_of_call(case.with_(scale=1e-9), q, k, v)
    assert "scores.far-above-zero" in regimes_of_call(case, q, k, v)
    k[..., :3, 0] = -(2.0**20) * 4  # the first three keys far below, the rest far above
    assert "scores.far-below-zero" not in regimes_of_call(case, q, k, v)
    assert "scores.far-below-zero" in regimes_of_call(case.with_(key_lengths=(3,)), q, k, v)


def test_sinks_far_from_the_scores_and_minus_inf():
    case = Case(batch=1, heads=3, tq=5, head_dim=16, sinks=(40.0, -40.0, -math.inf))
    drawn = regimes_of_call(case, *normal(case))
    assert {"sinks.far-above-scores", "sinks.far-below-scores", "sinks.minus-inf"} <= drawn
    near = case.with_(sinks=(0.5, 1.0, 2.0))
    assert not {r for r in regimes_of_call(near, *normal(near)) if r.startswith("sinks.")}


def test_a_merge_with_an_empty_part_and_a_row_no_part_saw():
    lses = np.full((2, 1, 1, 3), 1000.0)  # (P, B, H, Tq)
    assert regimes_of_merge(lses) == {"lse.near-plus-1000"}
    lses[1, ..., 0] = -np.inf
    lses[:, ..., 2] = -np.inf
    assert regimes_of_merge(lses) == {
        "lse.near-plus-1000", "merge.empty-part", "merge.row-no-part-saw",
    }  # fmt: skip


def test_a_regime_drawn_only_by_tests_of_other_claims_is_a_gap():
    drawn = {"window.one": {"conformance/test_output.py::test_formula_at_length"}}
    assert "window.one" in gaps(coverage(drawn))
    drawn = {"window.one": {"conformance/test_window.py::test_query_at_p_sees_keys_p_minus_w_to_p"}}
    assert "window.one" not in gaps(coverage(drawn))


def test_every_regime_is_drawn_by_a_test_of_its_claims_as_docs_regimes_shows():
    report = measured_report()  # a run of the suite on numpy_reference and numpy_flash, ~15 s
    covered = coverage(drawn_regimes(report))
    assert not gaps(covered), f"regimes no test of their claims draws: {gaps(covered)}"
    assert current_block() == generated_block(covered), (
        "docs/regimes.md is stale: python -m tests.regime_coverage --write"
    )
    # and the table of the choices each claim's tests vary, from the same run
    choices = drawn_choices(report)
    assert "own" in choices["LAYOUT-STRIDES"]["layout"]
    assert current_block(CHOICES_START, CHOICES_END) == generated_choices_block(choices), (
        "docs/regimes.md is stale: python -m tests.regime_coverage --write"
    )


def test_the_choices_of_a_call():
    case = Case(heads=4, kv_heads=2, tq=5, tk=9, window=3, dtype="float32", layout="v=row_gaps")
    assert choices_of_call(case, "backward") == {
        "choice.direction.backward", "choice.lengths.tq-below-tk", "choice.heads.grouped",
        "choice.dtype.float32", "choice.keywords.window", "choice.layout.own",
    }  # fmt: skip
    assert "choice.layout.shared-heads_last" in choices_of_call(Case(layout="heads_last"))
