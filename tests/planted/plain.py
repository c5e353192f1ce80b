"""Plain callables (the --impl contract) with one planted defect each."""

from __future__ import annotations

import numpy as np

from impls.contract import causal_mask, validate_inputs


def _attention(q, k, v, *, causal, scale):
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        scores = np.where(causal_mask(*scores.shape[-2:]), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return (weights @ v).astype(q.dtype)


def correct(q, k, v, *, causal=True, scale=None):
    """A correct plain implementation: the suite must accept it."""
    validate_inputs(q, k, v, causal=causal, scale=scale)
    d = q.shape[-1]
    return _attention(q, k, v, causal=causal, scale=1 / np.sqrt(d) if scale is None else scale)


def scale_by_one_over_d(q, k, v, *, causal=True, scale=None):
    """Scales scores by 1/D instead of 1/sqrt(D): the classic mix-up of the two."""
    validate_inputs(q, k, v, causal=causal, scale=scale)
    return _attention(q, k, v, causal=causal, scale=1 / q.shape[-1] if scale is None else scale)


def computes_in_float32(q, k, v, *, causal=True, scale=None):
    """Declares float64 by returning it, but computes in float32 inside."""
    out = correct(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), causal=causal, scale=scale
    )
    return out.astype(q.dtype)


def returns_a_list(q, k, v, *, causal=True, scale=None):
    """Returns a nested list instead of an array."""
    return correct(q, k, v, causal=causal, scale=scale).tolist()


def wrong_signature(q, k):
    """Takes no v and no keywords."""
    return q


NOT_CALLABLE = 42


def _masked_scores(q, k, scale, visible):
    scores = (q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    return np.where(visible, scores, -np.inf)


def _softmax_times_v(scores, v, dtype):
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(dtype)


def mask_off_by_one(q, k, v, *, causal=True, scale=None):
    """Lets query i see key i + 1: `j <= i + 1` where `j <= i` was meant."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.tril(np.ones((tq, tk), bool), tk - tq + 1) if causal else True
    return _softmax_times_v(_masked_scores(q, k, scale, visible), v, q.dtype)


def top_left_alignment(q, k, v, *, causal=True, scale=None):
    """Aligns the mask top-left when Tq < Tk (query i sees keys 0..i), as PyTorch's is_causal."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.tril(np.ones((tq, tk), bool)) if causal else True
    return _softmax_times_v(_masked_scores(q, k, scale, visible), v, q.dtype)


def no_max_subtraction(q, k, v, *, causal=True, scale=None):
    """exp() of the raw scores: overflows to inf, then NaN, once scores pass ~88 in float32."""
    visible = causal_mask(q.shape[-2], k.shape[-2]) if causal else True
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(_masked_scores(q, k, scale, visible))
        return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


def max_before_masking(q, k, v, *, causal=True, scale=None):
    """Takes the row maximum over every key, future ones included, and masks afterwards: a huge
    future score makes every visible weight underflow."""
    scores = _masked_scores(q, k, scale, True)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    if causal:
        weights = weights * causal_mask(q.shape[-2], k.shape[-2])
    with np.errstate(invalid="ignore"):
        return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


def heads_swapped(q, k, v, *, causal=True, scale=None):
    """Returns the heads in reverse order: a layout bug invisible when H = 1."""
    return correct(q, k, v, causal=causal, scale=scale)[:, ::-1].copy()
