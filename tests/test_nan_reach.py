"""Where a NaN stored in a low-precision operand must show (conformance.judge.fp8's
compare_dequantized, which FP8-NAN and BLOCK-NAN judge by): in every output that reads it through
a key its row sees, and nowhere else is it required. A kernel whose tiles skip the keys a row
cannot see never multiplies their NaN values by the zero weight the formula gives them; one
whose tile holds them does (0 times NaN). Both are right."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.block_scaled import with_nan_planted
from conformance.judge.fp8 import compare_dequantized, fp8_budget, nan_values_zeroed
from spec.block_scaled import quantize_call
from spec.formula import reference_attention

pytest.importorskip("ml_dtypes")


def planted_call():
    """BLOCK-NAN's MXFP8 call (its NaN scales and elements), causal, Tq = Tk = 64: v's NaN
    element at key 40 is hidden from rows 0..39."""
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((2, 4, 64, 64)) for _ in range(2))
    v = rng.standard_normal((2, 4, 64, 64))
    call = quantize_call(q, k, v, "mx_attention", "mxfp8_e4m3", options=dict(causal=True))
    return with_nan_planted(call.with_(p_rounding="float32", out_dtype="float32"))


def visible_keys_only(q, k, v) -> np.ndarray:
    """The output as a loop over each row's visible keys alone (causal, Tq = Tk): a kernel that
    never touches a hidden key."""
    out = np.empty((*q.shape[:-1], v.shape[-1]))
    scale = 1 / np.sqrt(q.shape[-1])
    for index in np.ndindex(q.shape[:-2]):
        for row in range(q.shape[-2]):
            keys, values = k[index][: row + 1], v[index][: row + 1]
            scores = keys @ q[index][row] * scale
            weights = np.exp(scores - scores.max())
            out[index][row] = weights @ values / weights.sum()
    return out


def judged(out, call):
    true_q, true_k, true_v = call.dequantized()
    baseline = call.baseline(operands=(true_q, true_k, nan_values_zeroed(true_v)))
    return compare_dequantized(out, (true_q, true_k, true_v), baseline, options=call.options,
                               budget=fp8_budget("float32", "float32"))  # fmt: skip


def test_a_kernel_that_never_reads_a_hidden_nan_value_is_right():
    call = planted_call()
    out = visible_keys_only(*call.dequantized())
    assert np.isfinite(out[0, -1, :40, 11]).all()  # the hidden NaN at key 40 reached none of these
    assert np.isnan(out[0, -1, 40:, 11]).all()
    comparison = judged(out, call)
    assert comparison.ok, comparison.describe()


def test_a_kernel_whose_tile_weighs_a_hidden_nan_value_by_zero_is_right():
    call = planted_call()
    out = reference_attention(*call.dequantized(), **call.options)  # P v over whole rows
    assert np.isnan(out[0, -1, :40, 11]).all()
    comparison = judged(out, call)
    assert comparison.ok, comparison.describe()


def test_an_output_that_reads_a_nan_through_a_key_it_sees_must_be_nan():
    call = planted_call()
    out = visible_keys_only(*call.dequantized())
    out[0, -1, 45, 11] = 0.5
    comparison = judged(out, call)
    assert not comparison.ok
    assert "outputs that read a NaN stored in an operand are numbers, first at (0, 3, 45, 11)" in (
        comparison.describe()
    )


def test_a_wrong_number_where_a_hidden_nan_value_is_skipped_is_still_wrong():
    call = planted_call()
    out = visible_keys_only(*call.dequantized())
    out[0, -1, 12, 11] += 0.25
    comparison = judged(out, call)
    assert not comparison.ok
    assert comparison.nan_lost is None, comparison.describe()
