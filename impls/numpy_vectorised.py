"""``numpy``: attention in NumPy for float32 and float64, computed in the input's dtype.

Unlike the oracle it never widens to float64, so it shows what a same-precision implementation
of the formula achieves. Queries go in blocks of 64 rows; a block's scores are computed only
against the keys its last row may see, so under the causal mask about half of the (Tq, Tk)
products and exponentials are never computed, and only the block's (Tq-block, keys) buffer is
alive at a time. Each row is normalised after the product with V (one division per output
element instead of one per weight). Matrix products use every core through BLAS; Python threads
over blocks on top of that measured slower on 2 cores (see ``perf/``), so there are none.
"""

from __future__ import annotations

import functools

import numpy as np

from impls.contract import (
    Capabilities,
    Implementation,
    NumpyArrays,
    resolve_scale,
    validate_inputs,
)

QUERY_BLOCK = 64


@functools.lru_cache(maxsize=8)
def future_corner(rows: int) -> np.ndarray:
    """(rows, rows) True strictly above the diagonal: a block's future keys."""
    corner = np.triu(np.ones((rows, rows), dtype=bool), 1)
    corner.setflags(write=False)
    return corner


class NumpyVectorised(NumpyArrays, Implementation):
    name = "numpy"
    capabilities = Capabilities(dtypes=("float64", "float32"))

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        if q.dtype not in (np.float32, np.float64):
            raise TypeError(f"q.dtype={q.dtype}, but should be float32 or float64 [{self.name}]")
        dtype = q.dtype
        scale = dtype.type(resolve_scale(scale, q.shape[-1]))
        tq, tk = q.shape[-2], k.shape[-2]
        offset = tk - tq  # bottom-right alignment: query row i sits at absolute position i + offset
        out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=dtype)  # (B, H, Tq, Dv)
        for start in range(0, tq, QUERY_BLOCK):
            stop = min(start + QUERY_BLOCK, tq)
            # Keys the block's last row may see; for a causal block, only the last (stop - start)
            # of them can lie in some row's future, in a strict upper triangle.
            keys = stop + offset if causal else tk
            scores = q[..., start:stop, :] @ k[..., :keys, :].swapaxes(-1, -2)  # (B, H, bq, keys)
            scores *= scale
            if causal:
                # Overwritten, not added to: a NaN or inf future score must not survive.
                np.copyto(
                    scores[..., keys - (stop - start) :], -np.inf, where=future_corner(stop - start)
                )
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            row_sums = scores.sum(axis=-1, keepdims=True)  # (B, H, bq, 1)
            np.divide(scores @ v[..., :keys, :], row_sums, out=out[..., start:stop, :])
        return out
