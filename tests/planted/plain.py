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
