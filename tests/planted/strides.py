"""Kernels that read memory the way pointer arithmetic does, each with the stride bug of a real
Triton kernel: FlagAttention's built k's pointers with v's strides and v's with k's, which reads
right while both have the same layout (tests/test_mixed_layouts.py)."""

from __future__ import annotations

import numpy as np

from impls.capabilities import LAYOUTS


def read_with_strides(x: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
    """The elements a kernel reads from ``x``'s memory at the byte ``strides`` it was given
    (another array's): what lies past ``x``'s own memory reads as NaN, as garbage would."""
    item = x.itemsize
    span = 1 + sum((n - 1) * s // item for n, s in zip(x.shape, x.strides, strict=True))
    memory = np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(item,))
    offsets = sum(
        np.arange(n).reshape([-1 if a == axis else 1 for a in range(x.ndim)]) * (s // item)
        for axis, (n, s) in enumerate(zip(x.shape, strides, strict=True))
    )
    return np.where(offsets < span, memory[np.minimum(offsets, span - 1)], np.nan)


def swapped_kv_strides(q, k, v, *, causal=True, scale=None):
    """The formula, reading k with v's strides and v with k's."""
    if k.shape == v.shape:
        k, v = read_with_strides(k, v.strides), read_with_strides(v, k.strides)
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = np.where(np.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)


swapped_kv_strides.layouts = tuple(LAYOUTS)  # it claims to read every view
