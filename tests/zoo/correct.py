"""Unusual but correct attention implementations: the suite must accept every one.

Each takes a road the reference does not - another mask, another order of summation, another
precision inside - and stays within the tolerance budget of its dtype.
"""

from __future__ import annotations

import numpy as np

from impls.contract import causal_mask
from tests.zoo import correct_variant
from tests.zoo.formula import attend, scores_of, softmax
from tests.zoo.streaming import streaming_attention


@correct_variant
def fill_minus_1e9(q, k, v, *, causal=True, scale=None):
    """The document's own code: future scores set to -1e9 rather than -inf. Exact while real
    scores stay far above -1e9, which finite float32 and float64 inputs at these sizes do."""
    scores = scores_of(q, k, scale)
    if causal:
        scores = np.where(causal_mask(*scores.shape[-2:]), scores, scores.dtype.type(-1e9))
    return (softmax(scores) @ v).astype(q.dtype)


@correct_variant
def mask_after_exp_then_renormalise(q, k, v, *, causal=True, scale=None):
    """Exponentiates every score against the maximum of the visible ones, then selects the visible
    weights (np.where, never 0 * inf) and renormalises: the mask applied to probabilities."""
    scores = scores_of(q, k, scale)
    visible = causal_mask(*scores.shape[-2:]) if causal else np.ones(scores.shape[-2:], bool)
    row_max = np.where(visible, scores, -np.inf).max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        weights = np.where(visible, np.exp(scores - row_max), 0)
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@correct_variant
def streaming_odd_tiles_float64(q, k, v, *, causal=True, scale=None):
    """Online softmax over key tiles of odd width 37 and query tiles of 29, accumulating in
    float64 whatever the input dtype: no tile boundary lines up with the mask's diagonal."""
    out = streaming_attention(
        q, k, v, causal=causal, scale=scale, block_q=29, block_k=37, accumulate_in=np.float64
    )
    return out.astype(q.dtype)


@correct_variant
def flash_tiles_in_input_dtype(q, k, v, *, causal=True, scale=None):
    """FlashAttention-2 style: 64 x 64 tiles, online softmax and tile skipping, accumulating in the
    input's own dtype, as a float32 kernel does."""
    return streaming_attention(q, k, v, causal=causal, scale=scale)


@correct_variant
def keys_summed_in_reverse(q, k, v, *, causal=True, scale=None):
    """Processes the keys last to first (reversed K, V and mask): every sum in another order."""
    reverse = slice(None, None, -1)
    visible = causal_mask(q.shape[-2], k.shape[-2])[:, reverse] if causal else True
    scores = np.where(visible, scores_of(q, k[..., reverse, :], scale), -np.inf)
    return (softmax(scores) @ v[..., reverse, :]).astype(q.dtype)


@correct_variant
def float64_inside(q, k, v, *, causal=True, scale=None):
    """Computes in float64 whatever the input dtype and rounds the output once at the end."""
    wide = (x.astype(np.float64) for x in (q, k, v))
    return attend(*wide, causal=causal, scale=scale).astype(q.dtype)


@correct_variant
def log_sum_exp_form(q, k, v, *, causal=True, scale=None):
    """Weights as exp(s - logsumexp(s)) with the log-sum-exp kept per row, as kernels that save it
    for the backward pass do."""
    scores = scores_of(q, k, scale)
    if causal:
        scores = np.where(causal_mask(*scores.shape[-2:]), scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    lse = row_max + np.log(np.exp(scores - row_max).sum(axis=-1, keepdims=True))
    return (np.exp(scores - lse) @ v).astype(q.dtype)
