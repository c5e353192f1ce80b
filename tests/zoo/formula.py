"""The attention formula in steps, for zoo members that change one step and keep the others."""

from __future__ import annotations

import numpy as np

from impls.contract import causal_mask, resolve_scale
from spec.formula import softmax


def scores_of(q, k, scale: float | None) -> np.ndarray:
    """(B, H, Tq, Tk) scaled dot products, in q's dtype."""
    return (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(resolve_scale(scale, q.shape[-1]))


def masked(scores: np.ndarray, causal: bool) -> np.ndarray:
    """Future scores set to -inf, bottom-right aligned."""
    return np.where(causal_mask(*scores.shape[-2:]), scores, -np.inf) if causal else scores


def attend(q, k, v, *, causal: bool, scale: float | None) -> np.ndarray:
    """softmax(mask(q k^T * scale)) v in q's dtype: the formula, plainly."""
    return (softmax(masked(scores_of(q, k, scale), causal)) @ v).astype(q.dtype)
