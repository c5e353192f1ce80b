"""An implementation that patches its own process's clock, so that its calls look twice as
fast to whatever times them there; the judge's clock, in another process, shows it."""

from __future__ import annotations

import time

import numpy as np


def correct(q, k, v, *, causal=True, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = np.where(np.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v


_real = time.perf_counter
_started = _real()


def _half_speed() -> float:
    return _started + (_real() - _started) / 2


def halves_its_clock(q, k, v, *, causal=True, scale=None):
    """Makes time.perf_counter run at half speed in its worker."""
    time.perf_counter = _half_speed
    return correct(q, k, v, causal=causal, scale=scale)
