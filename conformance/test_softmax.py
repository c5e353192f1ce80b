"""Section 3, softmax: the weights recovered from any implementation are a distribution over the
visible keys, ordered like the scores, and unmoved by shifts and large scores."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_matches_oracle, fail
from conformance.judge.harness import Case
from conformance.judge.probe import all_weights
from conformance.judge.tolerance import summation_slack
from conformance.judge.truth import oracle_attention
from spec.dtypes import UNIT_ROUNDOFF, round_to
from spec.formula import reference_scores

WEIGHT_CASES = [
    Case(batch=2, heads=2, tq=65, head_dim=16),
    Case(batch=1, heads=2, tq=3, tk=40, head_dim=8),
    Case(batch=1, heads=1, tq=129, head_dim=32, causal=False),
]
WEIGHT_IDS = ["square", "Tq<Tk", "non-causal"]


def weights_of(subject, case, spread=1.5):
    q, k, _ = subject.inputs(case, spread=spread)
    return q, k, all_weights(subject, case, q, k)


@pytest.mark.claim("SOFTMAX-NONNEG")
@pytest.mark.parametrize("case", WEIGHT_CASES, ids=WEIGHT_IDS)
def test_weights_are_non_negative(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    _, _, found = weights_of(subject, case)
    for source, weights in found:
        if not (weights >= 0).all():  # NaN fails too
            index = tuple(int(i) for i in np.argwhere(~(weights >= 0))[0])
            fail(
                subject,
                case,
                f"{source} weights{list(index)}={weights[index]!r}, but should be >= 0",
            )


@pytest.mark.claim("SOFTMAX-ROWSUM")
@pytest.mark.parametrize("case", WEIGHT_CASES, ids=WEIGHT_IDS)
def test_rows_sum_to_one_over_visible_keys(subject, dtype, case):
    """|sum - 1| <= summation_slack(dtype, Tk): storing the weights in the dtype and normalising
    by a sum of Tk terms may move a row sum that much, and no more."""
    case = subject.fit(case.with_(dtype=dtype))
    _, _, found = weights_of(subject, case)
    allowed = summation_slack(dtype, case.tk)
    visible = case.visible
    for source, weights in found:
        deviation = np.abs(np.where(visible, weights, 0).sum(axis=-1) - 1)
        if not deviation.max() <= allowed:
            index = np.unravel_index(np.argmax(deviation), deviation.shape)
            fail(
                subject,
                case,
                f"{source} row {index} sums to "
                f"{1 + deviation[index]:.9g} over keys 0..i, but should be 1 within {allowed:.3g}",
            )
        outside = np.abs(np.where(visible, 0, weights)).max()
        if outside != 0:
            fail(
                subject,
                case,
                f"{source}: mass {outside!r} outside keys 0..i, but should be 0",
            )


@pytest.mark.claim("SOFTMAX-MONOTONE")
@pytest.mark.parametrize("case", WEIGHT_CASES, ids=WEIGHT_IDS)
def test_larger_scores_get_larger_weights(subject, dtype, case):
    """Within each row, sorted by score, weights never decrease - except between scores closer
    than the dtype can tell apart (8 u (1 + |s|)), where rounding may order them either way."""
    case = subject.fit(case.with_(dtype=dtype))
    q, k, found = weights_of(subject, case)
    scores = reference_scores(q, k)
    visible = case.visible
    margin = 8 * UNIT_ROUNDOFF[dtype] * (1 + np.abs(scores).max())
    for source, weights in found:
        for index in np.ndindex(*weights.shape[:3]):
            keys = np.flatnonzero(visible[index[2]])
            order = keys[np.argsort(scores[index][keys])]
            s, w = scores[index][order], weights[index][order]
            # For every pair a < b in score order with s_b - s_a > margin, w_b >= w_a: the
            # largest weight among the scores clearly below s_b is at most w_b.
            lower_weight_so_far = np.maximum.accumulate(w)
            clearly_below = np.searchsorted(s, s - margin, side="right")  # (keys,) counts
            largest_below = np.where(
                clearly_below > 0, lower_weight_so_far[np.maximum(clearly_below - 1, 0)], -np.inf
            )
            broken = np.flatnonzero(largest_below > w)
            if broken.size:
                b = broken[0]
                fail(
                    subject,
                    case,
                    f"{source} row {index}: key {order[b]} has score {s[b]:.6g} and weight "
                    f"{w[b]!r}, but a key with a lower score has weight {largest_below[b]!r}",
                )


@pytest.mark.claim("SOFTMAX-STABLE")
def test_shifting_scores_changes_nothing(subject, dtype):
    """Adding one vector c to every key adds q_i . c to row i of the scores: a shift per row, which
    the softmax ignores: the output stays within budget of the unshifted truth."""
    case = subject.fit(Case(batch=1, heads=2, tq=50, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    shift = np.full(case.head_dim, 3.0)
    shifted_k = round_to(k + shift, dtype)
    assert_matches_oracle(
        subject,
        case,
        subject.call(case, q, shifted_k, v),
        q,
        shifted_k,
        v,
        truth=oracle_attention(q, k, v),
        what="out with every key shifted by 3",
    )


@pytest.mark.claim("SOFTMAX-STABLE")
@pytest.mark.parametrize("target", ["1e2", "1e4", "near-limit"])
def test_large_scores_stay_finite_and_correct(subject, dtype, target):
    """Scaled scores of magnitude up to 1e4 (float32 and wider), and up to half of what float16
    holds before scaling (raw q . k near 3e4) - exp() of unshifted scores would overflow."""
    case = subject.fit(Case(batch=1, heads=2, tq=33, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    raw = np.abs(reference_scores(q, k, 1.0)).max()
    if target == "near-limit":
        want_raw = 3e4 if dtype == "float16" else 1e4 * np.sqrt(case.head_dim)
    else:
        want_raw = float(target) * np.sqrt(case.head_dim)
    if dtype == "float16" and want_raw > 3e4:
        pytest.skip(f"raw scores of {want_raw:.3g} overflow float16 before any scaling")
    factor = np.sqrt(want_raw / raw)
    q, k = (round_to(x * factor, dtype) for x in (q, k))
    out = subject.call(case, q, k, v)
    what = f"out with scores up to {np.abs(reference_scores(q, k)).max():.3g}"
    nonfinite = np.size(out) - int(np.isfinite(out).sum())
    if nonfinite:
        what += f", {nonfinite} of its elements non-finite"
    assert_matches_oracle(subject, case, out, q, k, v, what=what)


# Where every visible score of a row lies: beyond FlashInfer's finite sentinel of -5e4 by far
# more than exp() spans (104 in float32), and in float64 beyond anything a sentinel could be; and
# as far above zero, where exp of an unshifted score overflows. Powers of two over sqrt(D) = 4, so
# that the planted part of each score is exact.
FAR_FROM_ZERO = {"float64": 2.0**20, "float32": 2.0**16}


def assert_rows_shifted_far(subject, dtype: str, sign: float) -> None:
    __tracebackhide__ = True
    if dtype not in FAR_FROM_ZERO:
        pytest.skip(f"scores of 65536 times sqrt(D) overflow {dtype} before any scaling")
    case = subject.fit(Case(batch=1, heads=2, tq=24, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    # Component 0 of every query is 1 and of every key sign S sqrt(D): each score is sign S plus
    # the rest's q . k / sqrt(D), of order one.
    q, k = q.copy(), k.copy()
    q[..., 0] = 1.0
    k[..., 0] = sign * FAR_FROM_ZERO[dtype] * np.sqrt(case.head_dim)
    out = subject.call(case, q, k, v)
    scores = reference_scores(q, k)
    assert_matches_oracle(
        subject, case, out, q, k, v,
        what=f"out with every score between {scores.min():.6g} and {scores.max():.6g}",
    )  # fmt: skip


@pytest.mark.claim("SOFTMAX-STABLE")
def test_rows_whose_every_score_lies_far_below_zero(subject, dtype):
    """Every score of every row near -65536 (float32) or -1e6 (float64), the differences between
    them of order one: the softmax ignores the common shift. A kernel whose running maximum
    starts at a finite sentinel instead of -inf sees every exponential underflow and returns 0
    (FlashInfer #4450: paged decode, all logits below -5e4)."""
    assert_rows_shifted_far(subject, dtype, -1.0)


@pytest.mark.claim("SOFTMAX-STABLE")
def test_rows_whose_every_score_lies_far_above_zero(subject, dtype):
    """The same rows shifted as far above zero: a kernel that exponentiates a score before
    subtracting its row's maximum overflows to inf, and inf / inf is NaN."""
    assert_rows_shifted_far(subject, dtype, 1.0)
