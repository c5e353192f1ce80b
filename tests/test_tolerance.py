"""The tolerance policy and the oracle it rests on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance.judge.tolerance import (
    BUDGETS,
    GRADIENT_BUDGETS,
    compare,
    compare_gradients,
    compare_merged,
    max_error,
)
from spec.dtypes import DTYPES, UNIT_ROUNDOFF, numpy_storage, round_to
from spec.formula import (
    accumulation_dtype,
    merge_states,
    naive_baseline,
    naive_baseline_vjp,
    reference_attention,
    reference_vjp,
)
from tests.cpu_paths import premise
from tests.score_rounding_survey import (
    SIZES,
    budget_fractions,
    causal_attention,
    float32_scores,
    inputs_with_scores_up_to,
    scores_off_by,
)
from tests.zoo.states import merge_in_the_natural_base


@pytest.mark.parametrize("budgets", [BUDGETS, GRADIENT_BUDGETS], ids=["outputs", "gradients"])
def test_every_dtype_has_a_budget_with_a_reason(budgets):
    assert set(budgets) == set(DTYPES)
    for budget in budgets.values():
        assert budget.baseline_factor >= 1
        assert budget.floor_u > 0
        assert len(budget.reason) > 40


# The worst of 3000 seeds of OUT-GRAD's first case (B=2 H=2 Tq=37 Tk=53 D=16, causal on even
# seeds) for torch_sdpa in float32: 4.6x the naive backward pass's error, over the outputs' 3x.
TORCH_SDPA_WORST_GRADIENT_SEED = 1836


def gradient_inputs(seed: int, dtype: str):
    """q, k, v, grad_out and causal of that case, from ``seed``."""
    rng = np.random.default_rng(seed)
    q, k, v, grad_out = (
        round_to(rng.standard_normal(shape), dtype)
        for shape in ((2, 2, 37, 16), (2, 2, 53, 16), (2, 2, 53, 16), (2, 2, 37, 16))
    )
    return q, k, v, grad_out, seed % 2 == 0


@pytest.mark.optional_libraries
def test_pytorchs_own_backward_is_within_the_gradient_budget():
    from impls.torch_sdpa import TorchSdpa

    pytest.importorskip("torch")
    impl = TorchSdpa()
    q, k, v, grad_out, causal = gradient_inputs(TORCH_SDPA_WORST_GRADIENT_SEED, "float32")
    native = (impl.from_numpy(x, "float32") for x in (q, k, v, grad_out))
    answer = impl.vjp(*native, causal=causal)
    grads = {
        name: impl.to_numpy(g).astype(np.float64) for name, g in zip("qkv", answer, strict=True)
    }
    comparisons = compare_gradients(grads, q, k, v, grad_out, dtype="float32", causal=causal)
    for name, comparison in comparisons.items():
        assert comparison.ok, f"{name}: {comparison.describe()}"


def test_a_float32_backward_that_stores_in_bfloat16_is_outside_the_gradient_budget():
    """The wider float32 gradient factor still rejects a backward pass that rounds its
    intermediates to bfloat16, as a kernel saving memory on dS would."""
    q, k, v, grad_out, causal = gradient_inputs(0, "float32")
    grads = naive_baseline_vjp(q, k, v, grad_out, dtype="bfloat16", causal=causal)
    comparisons = compare_gradients(grads, q, k, v, grad_out, dtype="float32", causal=causal)
    assert all(c.budget_fraction > 10 for c in comparisons.values()), comparisons


@pytest.mark.optional_libraries
def test_bfloat16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(0).standard_normal(10_000) * 10.0 ** np.arange(-20, 20, 0.004)
    ours = round_to(values, "bfloat16")
    theirs = torch.from_numpy(values).to(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_error_is_within_unit_roundoff(dtype):
    values = np.random.default_rng(1).standard_normal(10_000)
    assert np.max(np.abs(round_to(values, dtype) - values) / np.abs(values)) <= UNIT_ROUNDOFF[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_naive_baseline_error_grows_with_roundoff(dtype):
    rng = np.random.default_rng(2)
    q, k, v = (round_to(rng.standard_normal((1, 2, 50, 16)), dtype) for _ in range(3))
    error, _ = max_error(naive_baseline(q, k, v, dtype=dtype), reference_attention(q, k, v))
    assert UNIT_ROUNDOFF[dtype] / 10 < error < 100 * UNIT_ROUNDOFF[dtype]


def test_compare_reports_the_worst_index_and_treats_nan_as_infinite():
    truth = np.zeros((1, 1, 4, 3))
    actual = truth.copy()
    actual[0, 0, 2, 1] = 1e-3
    result = compare(actual, truth, truth, dtype="float32", magnitude=1.0)
    assert result.worst_index == (0, 0, 2, 1)
    assert not result.ok
    actual[0, 0, 3, 0] = np.nan
    result = compare(actual, truth, truth, dtype="float32", magnitude=1.0)
    assert result.max_abs == np.inf
    assert result.worst_index == (0, 0, 3, 0)


def test_budget_is_baseline_factor_times_baseline_plus_floor():
    truth = np.zeros((1, 1, 2, 2))
    baseline = truth + 1e-6
    result = compare(truth, truth, baseline, dtype="float32", magnitude=4.0)
    assert result.allowed == pytest.approx(3.0 * 1e-6 + 2.0 * 2.0**-24 * 4.0)


@pytest.mark.parametrize("causal", [True, False])
def test_oracle_gradients_match_finite_differences(causal):
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 1, 2, 5, 3))
    v, grad_out = rng.standard_normal((2, 1, 2, 5, 4))
    analytic = reference_vjp(q, k, v, grad_out, causal=causal, scale=0.7)
    step = 1e-6
    for which, array in enumerate((q, k, v)):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            bumped = [x.copy() for x in (q, k, v)]
            bumped[which][index] += step
            plus = np.sum(reference_attention(*bumped, causal=causal, scale=0.7) * grad_out)
            bumped[which][index] -= 2 * step
            minus = np.sum(reference_attention(*bumped, causal=causal, scale=0.7) * grad_out)
            numeric[index] = (plus - minus) / (2 * step)
        np.testing.assert_allclose(analytic[which], numeric, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_merge_converting_bases_conforms_and_one_16_ulps_worse_does_not(dtype):
    """LSE-MERGE's floor carries (1 + max|lse|): a correct base-2 merge that converts its lses to
    the natural base first rounds each by its magnitude, and stays well within it; a merge whose
    lses are off by 16 of their own ulps does not."""
    rng = np.random.default_rng(0)
    outputs = round_to(rng.standard_normal((3, 2, 4, 5, 16)), dtype).astype(numpy_storage(dtype))
    natural_lses = 1000.0 + 3.0 * rng.standard_normal((3, 2, 4, 5))
    lses = round_to(natural_lses / math.log(2), dtype).astype(numpy_storage(dtype))  # base 2
    truth, _ = merge_states(outputs, lses, "2")
    naive, _ = merge_states(outputs, lses, "2", accumulation_dtype(dtype))
    u = UNIT_ROUNDOFF[dtype]
    worse_lses = lses + 16 * u * np.abs(lses) * rng.choice([-1.0, 1.0], size=lses.shape)
    judged = {
        "converting": merge_in_the_natural_base(outputs, lses)[0],
        "16 ulps worse": merge_states(outputs, worse_lses, "2", accumulation_dtype(dtype))[0],
    }
    fractions = {
        name: compare_merged(
            out, truth, naive, outputs=outputs, natural_lses=lses * math.log(2), dtype=dtype
        ).budget_fraction
        for name, out in judged.items()
    }
    assert fractions["converting"] < 0.25, fractions
    assert fractions["16 ulps worse"] > 1.0, fractions


def test_float32_scores_summed_in_another_order_conform_and_scores_16_ulps_off_do_not():
    """Below float64 the floor carries the scores' rounding (score_rounding_sensitivity): on rows
    whose large top scores nearly tie, the baseline can be exact by chance, and a correct float32
    kernel that only sums its dot products in another order failed the budget without that term
    (as PyTorch's did, up to 8.6x over 50 seeds of the suite). With it, such a kernel conforms on
    every input here, and one whose scores are 16 ulps (32u) off, relative to their size, still
    misses its budget.

    The baseline here is the naive float32 formula summed in a plain loop, rounded by NumPy's
    elementwise float32 arithmetic: which kernel the machine's BLAS picks would otherwise decide
    how it rounds, and so whether the premise holds (it held only with OpenBLAS's Haswell sgemm)."""
    assert_rounding_term_needed_and_enough(
        16, SIZES, ("pairwise", "backwards"), ulps_off=16, head_dim=16, terms="16 terms"
    )


def test_float32_scores_of_576_terms_summed_in_another_order_conform():
    """A float32 dot product errs by a share of the sum of its terms' sizes, not of its result,
    so K takes each score's rounding by sum_d |q_d k_d| (spec.formula.score_rounding_sensitivity).
    At D = 576 (MLA's absorbed keys) the terms cancel: with K by |s| alone, a correct kernel
    that sums its dot products backwards missed its budget 6.2x on one of these 16 inputs
    (scores up to 1000). Scores 64 ulps (128u) off, relative to their size, still miss it on
    every input at scores up to 100; 16 ulps at D = 576 are within what a correct evaluation
    commits where the terms cancel."""
    assert_rounding_term_needed_and_enough(
        16, (1e2, 1e3), ("backwards",), ulps_off=64, head_dim=576, terms="576 terms"
    )


def assert_rounding_term_needed_and_enough(
    inputs: int, sizes, orders, *, ulps_off: int, head_dim: int, terms: str
) -> None:
    """Over ``inputs`` seeds at each of ``sizes`` (the largest score): a float32 kernel summing
    its dot products in each of ``orders`` misses its budget somewhere without the scores'
    rounding term (the premise), against a baseline summed forwards; with the term it stays
    below 0.9 of it everywhere; and a kernel whose scores are ``ulps_off`` ulps off, relative to
    their size, misses it on every input at the smallest size (above it, most rows are one key,
    whatever the scores' error)."""
    without_term, with_term, off = {}, {}, []
    for seed in range(inputs):
        for largest in sizes:
            q, k, v = inputs_with_scores_up_to(largest, seed, head_dim=head_dim)
            baseline = causal_attention(float32_scores(q, k, "forwards"), v)
            for order in orders:
                out = causal_attention(float32_scores(q, k, order), v)
                key = (order, largest, seed)
                without_term[key], with_term[key] = budget_fractions(out, q, k, v, baseline)
            if largest == min(sizes):
                relative = 2 * ulps_off * UNIT_ROUNDOFF["float32"]  # an ulp is 2u
                scores = scores_off_by(q, k, relative, seed)
                off.append(budget_fractions(causal_attention(scores, v), q, k, v, baseline)[1])
    worst_without = max(without_term, key=without_term.get)
    premise(
        without_term[worst_without] > 1.0,
        f"without the scores' rounding term, a float32 kernel summing {terms} in another order "
        f"than the baseline misses its budget somewhere: at most {without_term[worst_without]:.2f}",
    )
    worst_with = max(with_term, key=with_term.get)
    assert with_term[worst_with] < 0.9, f"{worst_with}: {with_term[worst_with]:.2f} of its budget"
    assert min(off) > 1.0, f"{ulps_off} ulps off: as little as {min(off):.2f}"
