"""A tiled attention with an online softmax, FlashAttention-style, for the zoo's tiling members.

Queries are taken in blocks of ``block_q``, keys in blocks of ``block_k``; a key block lying
wholly above the causal diagonal of a query block is skipped. Each query row keeps a running
maximum m, a running sum l and an accumulator acc; a key block with a larger maximum rescales
both by exp(m_old - m_new). The switches each turn one step off: the zoo's tiling mutants are
this algorithm with one switch flipped.
"""

from __future__ import annotations

import numpy as np

from impls.contract import resolve_scale


def streaming_attention(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float | None,
    block_q: int = 64,
    block_k: int = 64,
    accumulate_in=None,  # None: q's dtype
    rescale_accumulator: bool = True,
    keep_partial_tile: bool = True,
    skip_tiles_above_diagonal: bool = True,
    skip_by_absolute_position: bool = True,
) -> np.ndarray:
    work = np.dtype(accumulate_in or q.dtype)
    (batch, heads, tq, d), tk, dv = q.shape, k.shape[-2], v.shape[-1]
    scale = resolve_scale(scale, d)
    offset = tk - tq  # bottom-right alignment: query i sits at absolute position i + offset
    q, k, v = (x.astype(work) for x in (q, k, v))
    if keep_partial_tile:
        key_starts = range(0, tk, block_k)
    else:  # the bug: as many tiles as fit whole, at least one
        key_starts = range(0, max(block_k * (tk // block_k), 1), block_k)
    out = np.empty((batch, heads, tq, dv), dtype=work)
    for q_start in range(0, tq, block_q):
        q_stop = min(q_start + block_q, tq)
        q_block = q[..., q_start:q_stop, :]  # (B, H, bq, D)
        rows = np.arange(q_start, q_stop)[:, None] + offset  # absolute positions, (bq, 1)
        running_max = np.full((batch, heads, q_stop - q_start, 1), -np.inf, dtype=work)
        running_sum = np.zeros_like(running_max)
        acc = np.zeros((batch, heads, q_stop - q_start, dv), dtype=work)
        for k_start in key_starts:
            k_stop = min(k_start + block_k, tk)
            # The last query of the block sees keys up to its absolute position (the bug: up to
            # its index, which ignores the offset when Tq < Tk).
            last_seen = rows[-1, 0] if skip_by_absolute_position else q_stop - 1
            if causal and skip_tiles_above_diagonal and k_start > last_seen:
                break  # every later key block is in the future of every query of this block
            scores = (q_block @ np.swapaxes(k[..., k_start:k_stop, :], -1, -2)) * work.type(scale)
            if causal:
                visible = np.arange(k_start, k_stop)[None, :] <= rows  # (bq, bk)
                scores = np.where(visible, scores, -np.inf)
            new_max = np.maximum(running_max, scores.max(axis=-1, keepdims=True))
            # Rows with no visible key so far keep max -inf; shift them by 0 instead (exp -> 0).
            shift = np.where(np.isfinite(new_max), new_max, 0).astype(work)
            probs = np.exp(scores - shift)
            correction = np.exp(np.where(np.isfinite(running_max), running_max - shift, -np.inf))
            running_sum = running_sum * correction + probs.sum(axis=-1, keepdims=True)
            if rescale_accumulator:
                acc = acc * correction
            acc = acc + probs @ v[..., k_start:k_stop, :]
            running_max = new_max
        out[..., q_start:q_stop, :] = acc / running_sum
    return out
