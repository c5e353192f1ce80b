"""Zoo members for custom masks (attn_mask): the bugs reported in kernels that take one, and a
correct road that is not the formula's own.

Each member declares the mask by naming the ``attn_mask`` keyword, as any plain callable does,
and follows :func:`tests.zoo.formula.attend_extended` with the spec's mask (spec.masks) except in
the one step its docstring names. Rows a mask leaves no key give zeros, as declared by default.
"""

from __future__ import annotations

import numpy as np

from spec.masks import as_four_dims, visible_keys
from tests.zoo import correct_variant, mutant
from tests.zoo.formula import attend_extended, scores_of, softmax


def attend_masked(q, k, v, *, causal, scale, attn_mask, **mask) -> np.ndarray:
    """The formula under ``attn_mask`` and the call's other mask keywords, blind rows zeros."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = visible_keys(tq, tk, causal=causal, attn_mask=attn_mask, **mask)
    with np.errstate(invalid="ignore"):
        out = attend_extended(q, k, v, causal=causal, scale=scale, visible=visible, **mask)
    return np.where(visible.any(axis=-1, keepdims=True), out, out.dtype.type(0))


def _first_of(mask, axis: int):
    mask = as_four_dims(mask)
    return np.broadcast_to(np.take(mask, [0], axis=axis), mask.shape)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-ignored")
def custom_mask_ignored(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Accepts attn_mask and attends as if it were not given: the causal mask alone (SGLang PR
    #20278: EAGLE's tree mask dropped on one path, garbage drafts)."""
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-of-item-0")
def custom_mask_of_item_0(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Reads every batch item's rows with item 0's mask: a mask pointer never advanced by the
    batch stride."""
    mask = None if attn_mask is None else _first_of(attn_mask, 0)
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=mask)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-of-head-0")
def custom_mask_of_head_0(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Reads every query head with head 0's mask: a per-head mask taken as broadcast over heads."""
    mask = None if attn_mask is None else _first_of(attn_mask, 1)
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=mask)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-without-causal")
def custom_mask_instead_of_causal(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Applies the mask instead of the causal mask when both are given (PyTorch's SDPA takes
    attn_mask or is_causal), so a row sees the future keys its mask marks."""
    if attn_mask is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return attend_masked(q, k, v, causal=False, scale=scale, attn_mask=attn_mask)


_kept_mask: list = []


@mutant("masking", "MASK-CUSTOM-AS-CAUSAL")
def custom_mask_kept_for_later_calls(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Keeps the last mask it was given in a buffer and applies it to later causal calls of the
    same shape too (FlashInfer PR #1028: a stale mask reused after switching back to causal)."""
    if attn_mask is not None:
        _kept_mask[:] = [attn_mask]
    elif _kept_mask and as_four_dims(_kept_mask[0]).shape[-2:] == (q.shape[-2], k.shape[-2]):
        attn_mask = _kept_mask[0]
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


@correct_variant
def custom_mask_row_by_row(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Gathers each row's visible keys and attends over them alone, as an index-sparse kernel
    does: no -inf anywhere, a row with no key left at zeros."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.broadcast_to(
        visible_keys(tq, tk, causal=causal, attn_mask=attn_mask), (*q.shape[:2], tq, tk)
    )
    group = q.shape[1] // k.shape[1]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    for b, h, i in np.ndindex(*q.shape[:-1]):
        keys = np.flatnonzero(visible[b, h, i])
        if keys.size == 0:
            continue
        row = q[b, h, i : i + 1]  # (1, D)
        scores = scores_of(row[None, None], k[b, h // group, keys][None, None], scale)
        out[b, h, i] = (softmax(scores) @ v[b, h // group, keys])[0, 0, 0]
    return out
