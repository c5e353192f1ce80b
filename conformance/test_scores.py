"""Section 1, why divide by sqrt(d_k): the score matrix, the growth of dot products with d, the
scaling and its exact form, and what the softmax does without it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from conformance.judge.assertions import (
    assert_equal,
    assert_matches_oracle,
    assert_shape,
    assert_within_budget,
    fail,
)
from conformance.judge.harness import Case, Document
from conformance.judge.measurements import MATH_SEED, sample_dot_products, saturation
from conformance.judge.probe import all_weights
from conformance.judge.tolerance import compare, max_error
from spec.dtypes import SMALLEST_SUBNORMAL
from spec.formula import (
    causal_mask,
    naive_baseline_weights,
    reference_attention,
    reference_scores,
    reference_weights,
    resolve_scale,
)

ANDREA_T, ANDREA_D_K, ANDREA_HEADS = 1024, 64, 12
Z = 6.0  # sigmas: a fixed-seed sample of the right law falls outside with probability ~2e-9


def variance_bound(expected_var: float, fourth_moment: float, samples: int) -> float:
    """Half-width of a Z-sigma interval for a sample variance of ``samples`` draws of a zero-mean
    variable with variance ``expected_var`` and fourth moment ``fourth_moment``."""
    return Z * math.sqrt((fourth_moment - expected_var**2) / samples)


def check_variance(
    document: Document, what: str, samples: np.ndarray, variance: float, fourth: float
):
    """Fail unless the sample variance of zero-mean ``samples`` is within the Z-sigma bound."""
    __tracebackhide__ = True
    observed = float(np.mean(samples**2))
    bound = variance_bound(variance, fourth, samples.size)
    if abs(observed - variance) > bound:
        fail(
            document,
            None,
            f"{what}: std={math.sqrt(observed):.4g}, but should be {math.sqrt(variance):.4g} "
            f"(variance {observed:.4g} vs {variance:.4g} +- {bound:.3g}, n={samples.size})",
        )
    return observed, bound


# --- SCORE-SHAPE, SCORE-DOT ---------------------------------------------------------------------


@pytest.mark.claim("SCORE-SHAPE")
def test_andrea_score_matrix_has_a_million_entries_per_head(document):
    rng = np.random.default_rng(MATH_SEED)
    q, k = rng.standard_normal((2, ANDREA_T, ANDREA_D_K))  # (T, d_k) each
    scores = q @ k.T  # (T, T)
    assert_shape(document, None, "scores.shape", scores.shape, (ANDREA_T, ANDREA_T))
    assert_equal(document, None, "scores per head", scores.size, 1_048_576)
    per_layer = reference_scores(
        rng.standard_normal((1, ANDREA_HEADS, ANDREA_T, ANDREA_D_K)),
        rng.standard_normal((1, ANDREA_HEADS, ANDREA_T, ANDREA_D_K)),
    )  # (B, H, T, T)
    assert_equal(document, None, "scores per layer", per_layer.size, 12 * 1_048_576)


@pytest.mark.claim("SCORE-SHAPE")
def test_every_query_key_pair_gets_a_weight(subject):
    """The (T, T) weights of one ANDREA-120M head, recovered from outputs alone: every visible
    (i, j) pair carries a positive weight, so a score was computed for each of them."""
    dtype = subject.client.capabilities.dtypes[0]
    case = Case(batch=1, heads=1, tq=ANDREA_T, head_dim=ANDREA_D_K, dtype=dtype)
    q, k, _ = subject.inputs(case)
    truth = reference_weights(q, k)
    # Only weights that cannot underflow in the dtype are required to be positive.
    representable = truth > 4 * SMALLEST_SUBNORMAL[dtype]
    visible = causal_mask(ANDREA_T, ANDREA_T)[None, None] & representable
    for source, weights in all_weights(subject, case, q, k):
        assert_shape(
            subject,
            case,
            f"{source} weights.shape",
            weights.shape,
            (1, 1, ANDREA_T, ANDREA_T),
        )
        assert_equal(subject, case, f"{source} weights per head", weights.size, 1_048_576)
        nan = visible & np.isnan(weights)
        if nan.any():
            first = tuple(int(i) for i in np.argwhere(nan)[0][2:])
            fail(
                subject,
                case,
                f"{source}: NaN in {int(nan.sum())} of the visible (i, j) pairs' weights, first "
                f"at (i, j) = {first}, but every pair j <= i should have a positive weight",
            )
        missing = int(np.count_nonzero(visible & ~(weights > 0)))
        if missing:
            fail(
                subject,
                case,
                f"{source}: {missing} visible (i, j) pairs have no "
                "positive weight, but every pair j <= i should have one",
            )


@pytest.mark.claim("SCORE-DOT")
@pytest.mark.parametrize(
    "case",
    [Case(batch=2, heads=2, tq=33, head_dim=16), Case(batch=1, heads=2, tq=5, tk=40, head_dim=8)],
    ids=["square", "Tq<Tk"],
)
def test_scores_are_query_key_dot_products(subject, dtype, case):
    """softmax is invariant to a shift, so log(A[i, j] / A[i, i0]) = s[i, j] - s[i, i0]: the
    recovered weights give back every score difference, which must be scale * (q_i . k_j - q_i .
    k_i0), within the dtype's budget (the naive baseline's weights are the yardstick)."""
    case = subject.fit(case.with_(dtype=dtype))
    q, k, _ = subject.inputs(case, spread=0.8)
    scores = reference_scores(q, k)
    visible = case.visible
    truth = score_differences(scores, visible)
    baseline = log_weight_differences(naive_baseline_weights(q, k, dtype=dtype), visible)
    for source, weights in all_weights(subject, case, q, k):
        got = log_weight_differences(weights, visible)
        comparison = compare(
            got, truth, baseline, dtype=dtype, magnitude=1.0, max_score=float(np.abs(scores).max())
        )
        assert_within_budget(subject, case, f"{source} score differences", comparison)


def score_differences(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """s[i, j] - s[i, 0] on visible entries, 0 elsewhere."""
    return np.where(visible, scores - scores[..., :1], 0.0)


def log_weight_differences(weights: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """log A[i, j] - log A[i, 0] on visible entries: the score differences the weights imply."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return score_differences(np.log(weights), visible)


# --- DOT-GROWTH, SCALE-UNIT ---------------------------------------------------------------------


@pytest.mark.claim("DOT-GROWTH")
@pytest.mark.parametrize(("d", "expected_std"), [(64, 8), (256, 16), (4096, 64)])
def test_dot_products_grow_as_sqrt_d(document, d, expected_std):
    """Components with unit variance: the dot product has variance d and fourth moment 3d^2 + 6d
    (each product of two standard normals has fourth moment 9)."""
    dots = sample_dot_products(np.random.default_rng([MATH_SEED, d]), d, samples=8000)
    assert expected_std == math.isqrt(d)
    observed, bound = check_variance(document, f"d={d}", dots, d, 3 * d * d + 6 * d)
    document.notes.note_figure(f"dot-product std/{d}", math.sqrt(observed))
    # The same bound rejects the unit-norm law (std 1/sqrt(d)): the test can tell the two apart.
    assert abs(observed - 1 / d) > bound


@pytest.mark.claim("DOT-GROWTH")
@pytest.mark.parametrize("d", [64, 256, 4096])
def test_erratum_unit_norm_vectors_shrink_as_one_over_sqrt_d(document, d):
    """The document says "unit vectors". For unit-*norm* vectors the dot product has variance 1/d
    and fourth moment 3 / (d (d + 2)): it shrinks with d, so the document's numbers (8, 16, 64)
    are those of unit-variance components."""
    dots = sample_dot_products(np.random.default_rng([MATH_SEED, d, 1]), d, 8000, unit_norm=True)
    observed, bound = check_variance(document, f"unit-norm d={d}", dots, 1 / d, 3 / (d * (d + 2)))
    document.notes.note_figure(f"unit-norm dot-product std/{d}", math.sqrt(observed))
    assert abs(observed - d) > bound


@pytest.mark.claim("SCALE-UNIT")
@pytest.mark.parametrize("d_k", [16, 64, 256, 1024, 4096])
def test_scaled_scores_have_unit_scale(document, d_k):
    """q . k / sqrt(d_k) has variance 1 and fourth moment 3 + 6 / d_k, for every d_k."""
    dots = sample_dot_products(np.random.default_rng([MATH_SEED, d_k, 2]), d_k, 8000)
    scaled = dots / math.sqrt(d_k)
    _observed, bound = check_variance(document, f"d_k={d_k}", scaled, 1.0, 3 + 6 / d_k)
    assert abs(float(np.mean(dots**2)) - 1.0) > bound  # and the same bound rejects the unscaled


# --- SCALE-FORMULA ------------------------------------------------------------------------------


@pytest.mark.claim("SCALE-FORMULA")
def test_default_scale_is_one_over_sqrt_head_dim(subject, dtype):
    """At D = 32 with 4 heads the plausible wrong scales - 1/D, 1/sqrt(H*D), a hard-coded 1/8 -
    all give outputs at least 4 budgets away; only 1/sqrt(D) fits."""
    case = Case(batch=1, heads=4, tq=48, head_dim=32, dtype=dtype)
    q, k, v = subject.inputs(case, spread=1.5)
    comparison = assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)
    truth = reference_attention(q, k, v)
    for wrong in (1 / 32, 1 / math.sqrt(4 * 32), 1 / 8):
        gap = np.abs(reference_attention(q, k, v, scale=wrong) - truth).max()
        assert gap > 4 * comparison.allowed, f"scale {wrong} is not distinguishable here"


@pytest.mark.claim("SCALE-FORMULA")
def test_explicit_scale_overrides_the_default(subject, dtype):
    case = Case(batch=1, heads=2, tq=40, head_dim=64, dtype=dtype, scale=0.37)
    q, k, v = subject.inputs(case)
    comparison = assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)
    gap = np.abs(reference_attention(q, k, v) - reference_attention(q, k, v, scale=0.37)).max()
    assert gap > 4 * comparison.allowed


@pytest.mark.claim("SCALE-FORMULA")
def test_andrea_default_scale_is_exactly_one_eighth(subject, dtype):
    """For d_k = 64, sqrt(64) = 8 exactly, so the default scale is exactly 0.125 (checked on the
    arithmetic), and an implementation's default output agrees with its output for an explicit
    0.125 within the dtype's budget. Bit identity is not required: the two calls may take code
    paths that round differently (a float64 default path in a float32 kernel, say)."""
    assert resolve_scale(None, ANDREA_D_K) == 0.125
    assert np.float32(1.0) / np.sqrt(np.float32(ANDREA_D_K)) == np.float32(0.125)
    case = Case(batch=1, heads=2, tq=70, head_dim=ANDREA_D_K, dtype=dtype)
    q, k, v = subject.inputs(case)
    explicit = case.with_(scale=0.125)
    comparison = assert_matches_oracle(subject, explicit, subject.call(explicit, q, k, v), q, k, v)
    error, index = max_error(subject.call(case, q, k, v), subject.call(explicit, q, k, v))
    if not error <= comparison.allowed:
        fail(
            subject,
            case,
            f"out(scale=None) differs from out(scale=0.125) by "
            f"{error:.3e} at {index}, but should be within {comparison.allowed:.3e}",
        )


@pytest.mark.claim("SCALE-FORMULA")
def test_reciprocal_multiply_matches_division_within_one_ulp():
    """The code view multiplies by 1.0f / sqrtf(d_k) rather than dividing by sqrtf(d_k). In
    float32 the two differ by at most 1 ulp for every d_k in 1..4096, and never when d_k is a power
    of 4 (sqrt(d_k) is then a power of 2, whose reciprocal is exact)."""
    rng = np.random.default_rng(MATH_SEED)
    d = np.arange(1, 4097, dtype=np.float32)
    root = np.sqrt(d)  # sqrtf: correctly rounded
    reciprocal = np.float32(1.0) / root
    mantissas = (rng.integers(0, 2**23, 4096, dtype=np.uint32) | np.uint32(0x3F800000)).view(
        np.float32
    )  # uniform over [1, 2): ulp distances are scale-free, so this range covers every exponent
    worst, exact = 0, np.empty(d.size, dtype=bool)  # exact[i]: no sampled mantissa differs
    # 256 values of d at a time: the whole (4096, 4096) comparison in one piece makes 640 MB of
    # fresh arrays, which cost several times the arithmetic.
    for start in range(0, d.size, 256):
        rows = slice(start, start + 256)
        ulps = np.abs(
            (mantissas[None, :] * reciprocal[rows, None]).view(np.int32).astype(np.int64)
            - (mantissas[None, :] / root[rows, None]).view(np.int32).astype(np.int64)
        )  # (256, 4096)
        worst = max(worst, int(ulps.max()))
        exact[rows] = (ulps == 0).all(axis=1)
    assert worst <= 1, f"x * (1/sqrtf(d)) and x / sqrtf(d) differ by {worst} ulps"
    power_of_4 = np.array(
        [n & (n - 1) == 0 and (n.bit_length() - 1) % 2 == 0 for n in range(1, 4097)]
    )
    assert exact[power_of_4].all(), f"inexact at powers of 4: {d[power_of_4 & ~exact]}"
    # Where the sample happened to agree everywhere, every mantissa decides.
    every_mantissa = (np.arange(2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
    multiplied, divided = np.empty((2, every_mantissa.size), dtype=np.float32)
    for value in d[~power_of_4 & exact]:
        r = np.sqrt(np.float32(value))
        np.multiply(every_mantissa, np.float32(1.0) / r, out=multiplied)
        np.divide(every_mantissa, r, out=divided)
        differs = np.count_nonzero(multiplied != divided)
        assert differs, f"d={value:g} is not a power of 4 yet the two agree for every float32"


# --- SOFTMAX-SATURATION ------------------------------------------------------------------------


@pytest.mark.claim("SOFTMAX-SATURATION")
def test_unscaled_softmax_saturates_and_scaled_one_does_not(document):
    """Thresholds: without scaling the mean largest weight is >= 0.75 at every d_k and the share
    of rows with a vanishing Jacobian (norm < 1e-2) is >= 0.15 at d_k = 64, >= 0.5 from 1024 on,
    and grows with d_k. With 1/sqrt(d_k) the mean largest weight stays <= 0.15, no row's Jacobian
    vanishes, and the median Jacobian norm stays within 20% of its d_k = 64 value."""
    dims = (64, 256, 1024, 4096)
    unscaled = [saturation(d, 1.0) for d in dims]
    scaled = [saturation(d, 1 / math.sqrt(d)) for d in dims]
    report = "\n".join(
        f"d_k={d:5d}: unscaled max weight {u[0]:.3f}, vanishing rows {u[1]:.2f}, median |J| "
        f"{u[2]:.2e}; scaled max weight {s[0]:.3f}, vanishing rows {s[1]:.2f}, "
        f"median |J| {s[2]:.2e}"
        for d, u, s in zip(dims, unscaled, scaled, strict=True)
    )
    document.notes.note_figure(
        "largest weight",
        {"d_k": list(dims), "unscaled": [u[0] for u in unscaled], "scaled": [s[0] for s in scaled]},
    )
    vanishing = [u[1] for u in unscaled]
    checks = [
        all(u[0] >= 0.75 for u in unscaled),
        vanishing[0] >= 0.15 and min(vanishing[2:]) >= 0.5,
        all(a <= b for a, b in itertools.pairwise(vanishing)),
        all(s[0] <= 0.15 for s in scaled),
        all(s[1] == 0 for s in scaled),
        all(abs(s[2] / scaled[0][2] - 1) <= 0.2 for s in scaled),
    ]
    if not all(checks):
        fail(document, None, f"thresholds not met ({checks}):\n{report}")
