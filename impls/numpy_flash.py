"""``numpy_flash``: the tiling of ``cupy_flash``, step for step, in NumPy.

A GPU kernel cannot be validated on a machine without a GPU; its algorithm can. This module is
that algorithm with the kernel's own tile sizes (``cupy_flash`` compiles its CUDA source with
these constants), so every CPU run holds the tiling to the claims:

* queries in blocks of :data:`BLOCK_M` rows (one CUDA thread block each), keys streamed in tiles
  of :data:`BLOCK_N`, the last tile of each partial when T is not a multiple;
* tile skipping: a causal query block stops after the tile holding its last row's last visible
  key (bottom-right aligned: row i sees keys j <= i + Tk - Tq);
* the online softmax: a running row max m and sum l; each new tile rescales the accumulator and
  l by exp(m_old - m_new); a row that has seen only masked keys shifts by 0 instead of -inf;
* one division by l at the end, and optionally the log-sum-exp m + log(l) of each row.

The arithmetic is in the input's dtype (float32 or float64), as the kernel's float32 path.
"""

from __future__ import annotations

import numpy as np

from impls.contract import (
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    NumpyArrays,
    resolve_scale,
    validate_inputs,
)

BLOCK_M = 64  # query rows per block: 4 warps x 16 rows in the tensor-core kernel
BLOCK_N = 64  # keys per tile streamed through shared memory


def key_tiles(block_start: int, block_stop: int, tk: int, offset: int, causal: bool):
    """(start, stop) of each key tile a query block [block_start, block_stop) visits."""
    # The block's last row sits at absolute position block_stop - 1 + offset; no row sees past it.
    end = min(tk, block_stop + offset) if causal else tk
    return [(start, min(start + BLOCK_N, tk)) for start in range(0, end, BLOCK_N)]


def tiled_attention(q, k, v, *, causal: bool, scale: float, with_lse: bool = False):
    """Attention of (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv) arrays by the kernel's tiling;
    returns out (B, H, Tq, Dv), and lse (B, H, Tq) when ``with_lse``."""
    dtype = q.dtype
    scale = dtype.type(scale)
    tq, tk = q.shape[-2], k.shape[-2]
    offset = tk - tq
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=dtype)  # (B, H, Tq, Dv)
    lse = np.empty(q.shape[:-1], dtype=dtype)  # (B, H, Tq)
    for block_start in range(0, tq, BLOCK_M):
        block_stop = min(block_start + BLOCK_M, tq)
        rows = np.arange(block_start, block_stop)[:, None]  # (bm, 1)
        q_block = q[..., block_start:block_stop, :]  # (B, H, bm, D)
        running_max = np.full(q_block.shape[:-1], -np.inf, dtype=dtype)  # (B, H, bm)
        running_sum = np.zeros(q_block.shape[:-1], dtype=dtype)  # (B, H, bm)
        acc = np.zeros(q_block.shape[:-1] + v.shape[-1:], dtype=dtype)  # (B, H, bm, Dv)
        for start, stop in key_tiles(block_start, block_stop, tk, offset, causal):
            scores = q_block @ k[..., start:stop, :].swapaxes(-1, -2)  # (B, H, bm, bn)
            scores *= scale
            if causal:
                future = np.arange(start, stop)[None, :] > rows + offset  # (bm, bn)
                # Overwritten, not added to: a NaN or inf future score must not survive.
                np.copyto(scores, -np.inf, where=future)
            new_max = np.maximum(running_max, scores.max(axis=-1))  # (B, H, bm)
            shift = np.where(new_max == -np.inf, dtype.type(0), new_max)
            correction = np.exp(running_max - shift)  # (B, H, bm); exp(-inf) = 0 on first tile
            probs = np.exp(scores - shift[..., None])  # (B, H, bm, bn)
            running_sum = running_sum * correction + probs.sum(axis=-1)
            acc = acc * correction[..., None] + probs @ v[..., start:stop, :]
            running_max = new_max
        out[..., block_start:block_stop, :] = acc / running_sum[..., None]
        lse[..., block_start:block_stop] = running_max + np.log(running_sum)
    return (out, lse) if with_lse else out


class NumpyFlash(NumpyArrays, Implementation):
    name = "numpy_flash"
    capabilities = Capabilities(dtypes=("float64", "float32"), conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        return self.attention_and_lse(q, k, v, causal=causal, scale=scale)[0]

    def attention_and_lse(self, q, k, v, *, causal=True, scale=None):
        """(out, lse): the output and each row's log-sum-exp of its scaled, masked scores."""
        validate_inputs(q, k, v, causal=causal, scale=scale)
        if q.dtype not in (np.float32, np.float64):
            raise TypeError(f"q.dtype={q.dtype}, but should be float32 or float64 [{self.name}]")
        return tiled_attention(
            q, k, v, causal=causal, scale=resolve_scale(scale, q.shape[-1]), with_lse=True
        )
