"""Three kernels a new user might write, each with one classic mistake, and one that returns the
wrong shape: what the suite says of them must fit one screen and name the mistake
(tests/test_one_screen.py)."""

from __future__ import annotations

import numpy as np


def _attend(q, k, v, *, causal, scale, top_left=False):
    """The formula in plain NumPy, in q's dtype; the causal mask top-left where asked."""
    scores = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)  # (B, H, Tq, Tk)
    tq, tk = scores.shape[-2:]
    if causal:
        visible = np.tri(tq, tk, 0 if top_left else tk - tq, dtype=bool)
        scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


def top_left_mask(q, k, v, *, causal=True, scale=None):
    """Aligns the causal mask top-left: query i sees keys 0..i whatever Tk."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _attend(q, k, v, causal=causal, scale=scale, top_left=True)


def value_dim_scale(q, k, v, *, causal=True, scale=None):
    """Scales by 1/sqrt(Dv), v's head dim, where q's D belongs: right while Dv = D."""
    scale = v.shape[-1] ** -0.5 if scale is None else scale
    return _attend(q, k, v, causal=causal, scale=scale)


def unscaled_decode(q, k, v, *, causal=True, scale=None):
    """A fast path for one query row (a decoding step) that forgets the scale."""
    if q.shape[-2] == 1:
        scale = 1.0
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _attend(q, k, v, causal=causal, scale=scale)


def wrong_shape(q, k, v, *, causal=True, scale=None):
    """Returns (B, Tq, H, Dv) where (B, H, Tq, Dv) belongs."""
    return np.swapaxes(top_left_mask(q, k, v, causal=causal, scale=scale), 1, 2).copy()
