"""A kernel that computes NaN in a few rows from finite inputs: its last, partial tile of query
rows multiplies the masked scores (-inf) by a 0/1 mask, and 0 * -inf is NaN. Its output memory is
all written (tests/test_nan_messages.py)."""

from __future__ import annotations

import numpy as np

TILE = 64


def nan_in_the_partial_tile(q, k, v, *, causal=True, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    tq, tk = s.shape[-2:]
    visible = np.tri(tq, tk, tk - tq, bool) if causal else np.ones((tq, tk), bool)
    s = np.where(visible, s, -np.inf)
    tail = tq - tq % TILE if tq % TILE and tq > TILE else tq
    with np.errstate(invalid="ignore"):
        s[..., tail:, :] = s[..., tail:, :] * visible[tail:]  # 0 * -inf where masked
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)
