"""The float64 backward of every feature (spec.formula.reference_feature_vjp), derived by hand,
against central finite differences of the forward: grouped heads, windows, key lengths, chunks,
packed sequences, softcap, ALiBi, sinks (their own gradient too) and the log-sum-exp's."""

from __future__ import annotations

import numpy as np
import pytest

from spec.formula import reference_attention, reference_feature_vjp, reference_log_sum_exp

STEP = 1e-6
FEATURES = {
    "plain, causal": {},
    "plain, not causal": {"causal": False},
    "grouped heads (4 query heads on 2)": {"kv_heads": 2},
    "window of 2": {"window": 2},
    "window of 2, not causal": {"window": 2, "causal": False},
    "key lengths 5 and 3": {"key_lengths": [5, 3]},
    "chunks of 2": {"chunk": 2},
    "softcap 1.5": {"softcap": 1.5},
    "ALiBi": {"alibi_slopes": [0.5, 0.25, 0.125, 0.0625]},
    "sinks": {"sinks": [0.3, -0.7, 1.1, 0.0]},
    "packed sequences of 2, 3 and 1 rows": {
        "batch": 1, "cu_seqlens_q": [0, 2, 5, 6], "cu_seqlens_k": [0, 3, 5, 6],
    },
    "softcap, sinks, window and the lse's gradient": {
        "softcap": 2.0, "sinks": [0.3, -0.7, 1.1, 0.0], "window": 3, "lse": True,
    },
    "the lse's gradient, grouped heads, key lengths": {
        "kv_heads": 1, "key_lengths": [6, 2], "lse": True,
    },
}  # fmt: skip


def inputs(options: dict):
    rng = np.random.default_rng(7)
    batch, heads, tokens = options.pop("batch", 2), 4, 6
    kv_heads = options.pop("kv_heads", heads)
    q = rng.standard_normal((batch, heads, tokens, 3))
    k = rng.standard_normal((batch, kv_heads, tokens, 3))
    v = rng.standard_normal((batch, kv_heads, tokens, 2))
    grad_out = rng.standard_normal((batch, heads, tokens, 2))
    grad_lse = rng.standard_normal((batch, heads, tokens)) if options.pop("lse", False) else None
    return q, k, v, grad_out, grad_lse


def loss(q, k, v, grad_out, grad_lse, options: dict) -> float:
    """sum(out * dO) + sum(lse * dLSE), rows that see no key counting 0."""
    with np.errstate(invalid="ignore"):
        return _loss(q, k, v, grad_out, grad_lse, options)


def _loss(q, k, v, grad_out, grad_lse, options: dict) -> float:
    total = np.nansum(reference_attention(q, k, v, scale=0.7, **options) * grad_out)
    if grad_lse is not None:
        lse = reference_log_sum_exp(q, k, scale=0.7, **options)
        total += np.sum(np.where(np.isfinite(lse), lse, 0.0) * grad_lse)
    return float(total)


def numeric_gradient(array: np.ndarray, evaluate) -> np.ndarray:
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        saved = array[index]
        array[index] = saved + STEP
        plus = evaluate()
        array[index] = saved - STEP
        minus = evaluate()
        array[index] = saved
        grad[index] = (plus - minus) / (2 * STEP)
    return grad


@pytest.mark.parametrize("feature", FEATURES)
def test_each_features_backward_matches_finite_differences(feature):
    options = dict(FEATURES[feature])
    q, k, v, grad_out, grad_lse = inputs(options)
    analytic = reference_feature_vjp(q, k, v, grad_out, scale=0.7, grad_lse=grad_lse, **options)
    arrays = {"q": q, "k": k, "v": v}
    if "sinks" in options:
        options["sinks"] = np.asarray(options["sinks"], np.float64)
        arrays["sinks"] = options["sinks"]
    assert set(analytic) == set(arrays)
    for name, array in arrays.items():
        numeric = numeric_gradient(array, lambda: loss(q, k, v, grad_out, grad_lse, options))
        np.testing.assert_allclose(
            analytic[name], numeric, atol=1e-7, rtol=1e-5, err_msg=f"d{name} [{feature}]"
        )


def test_rows_that_see_no_key_get_zero_gradients_never_nan():
    """Causal with Tq > Tk: the first rows see no key. Their dq is exactly 0, and every
    gradient, the lse's included, is finite."""
    rng = np.random.default_rng(3)
    q, grad_out = rng.standard_normal((2, 1, 2, 7, 4))
    k, v = rng.standard_normal((2, 1, 2, 4, 4))
    grads = reference_feature_vjp(q, k, v, grad_out, grad_lse=rng.standard_normal((1, 2, 7)))
    assert all(np.isfinite(g).all() for g in grads.values())
    assert (grads["q"][:, :, :3] == 0).all()  # rows 0..2 sit before the first key


def test_padding_and_hidden_keys_get_exactly_zero():
    rng = np.random.default_rng(4)
    q, k, v, grad_out = rng.standard_normal((4, 2, 2, 6, 3))
    grads = reference_feature_vjp(q, k, v, grad_out, key_lengths=[4, 6], window=1)
    assert (grads["k"][0, :, 4:] == 0).all()
    assert (grads["v"][0, :, 4:] == 0).all()


def test_a_feature_without_a_backward_is_refused_by_name():
    q = np.zeros((1, 1, 2, 2))
    with pytest.raises(ValueError, match="no backward for block_table"):
        reference_feature_vjp(q, q, q, q, block_table=[[0]])
