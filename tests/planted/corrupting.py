"""Kernels wrong at one length, T = 16, the preflight's: one of them also corrupts its process
there, as a kernel writing out of bounds without crashing corrupts its heap (or its CUDA
context), so that every later call in that process fails with nonsense; the other does not. The
suite must give both the same verdicts (tests/test_worker_restarts.py)."""

from __future__ import annotations

import numpy as np

BROKEN_LENGTH = 16
corrupted = False  # the process's state after the out-of-bounds write


def _attend(q, k, v, *, causal, scale):
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = np.where(np.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)


def wrong_at_16(q, k, v, *, causal=True, scale=None):
    """NaN where T = 16 (its tail block read past the end), right elsewhere."""
    if BROKEN_LENGTH in (q.shape[-2], k.shape[-2]):
        return np.full((*q.shape[:-1], v.shape[-1]), np.nan, q.dtype)
    return _attend(q, k, v, causal=causal, scale=scale)


def corrupts_its_worker_at_16(q, k, v, *, causal=True, scale=None):
    """As wrong_at_16, and once it has run at T = 16 every later call fails."""
    global corrupted
    if corrupted:
        raise TypeError("empty() takes 1 positional argument but 1 was given")
    if BROKEN_LENGTH in (q.shape[-2], k.shape[-2]):
        corrupted = True
    return wrong_at_16(q, k, v, causal=causal, scale=scale)
