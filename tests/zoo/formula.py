"""The attention formula in steps, for zoo members that change one step and keep the others."""

from __future__ import annotations

import numpy as np

from impls.contract import causal_mask, resolve_scale
from spec.formula import softmax, visible_keys


def scores_of(q, k, scale: float | None) -> np.ndarray:
    """(B, H, Tq, Tk) scaled dot products, in q's dtype."""
    scores = q @ np.swapaxes(k, -1, -2)
    scores *= q.dtype.type(resolve_scale(scale, q.shape[-1]))  # in place: see spec.formula.softmax
    return scores


def masked(scores: np.ndarray, causal: bool) -> np.ndarray:
    """Future scores set to -inf, bottom-right aligned, in place."""
    if causal:
        np.copyto(scores, -np.inf, where=~causal_mask(*scores.shape[-2:]))
    return scores


def attend(q, k, v, *, causal: bool, scale: float | None) -> np.ndarray:
    """softmax(mask(q k^T * scale)) v in q's dtype: the formula, plainly."""
    return (softmax(masked(scores_of(q, k, scale), causal)) @ v).astype(q.dtype)


def attend_extended(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float | None,
    window: int | None = None,
    key_lengths=None,
    kv_head_of=None,
    visible=None,
    zero_padded_values: bool = True,
) -> np.ndarray:
    """The formula with the extensions, in q's dtype, each step a switch for the zoo's extension
    members: query head h reads key/value head ``kv_head_of(heads, kv_heads)[h]`` (h // g), keys
    are masked by ``visible`` ((B or 1, 1, Tq, Tk) booleans; the spec's own by default) and the
    values past each item's key length are zeroed before the product."""
    heads, kv_heads = q.shape[1], k.shape[1]
    index = (kv_head_of or grouped_heads)(heads, kv_heads)
    k, v = k[:, index], v[:, index]  # (B, Hkv, T, D) -> (B, Hq, T, D)
    if visible is None:
        visible = visible_keys(
            q.shape[-2], k.shape[-2], causal=causal, window=window, key_lengths=key_lengths
        )
    if zero_padded_values and key_lengths is not None:
        padding = np.arange(v.shape[-2])[None, :] >= np.asarray(key_lengths)[:, None]  # (B, Tk)
        v = np.where(padding[:, None, :, None], v.dtype.type(0), v)
    scores = scores_of(q, k, scale)
    np.copyto(scores, -np.inf, where=~visible)
    weights = softmax(scores)
    return (weights @ v).astype(q.dtype)


def grouped_heads(heads: int, kv_heads: int) -> np.ndarray:
    """The key/value head each query head reads: h // g, g = Hq / Hkv."""
    return np.arange(heads) // (heads // kv_heads)
