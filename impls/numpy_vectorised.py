"""``numpy``: attention in NumPy for float32 and float64, computed in the input's dtype.

Unlike the oracle it never widens to float64, so it shows what a same-precision implementation
of the formula achieves; it works in place to keep one (B, H, Tq, Tk) buffer alive at a time.
"""

from __future__ import annotations

import numpy as np

from impls.contract import (
    Capabilities,
    Implementation,
    NumpyArrays,
    causal_mask,
    resolve_scale,
    validate_inputs,
)


class NumpyVectorised(NumpyArrays, Implementation):
    name = "numpy"
    capabilities = Capabilities(dtypes=("float64", "float32"))

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        if q.dtype not in (np.float32, np.float64):
            raise TypeError(f"q.dtype={q.dtype}, but should be float32 or float64 [{self.name}]")
        dtype = q.dtype
        scores = q @ k.swapaxes(-1, -2)  # (B, H, Tq, Tk)
        scores *= dtype.type(resolve_scale(scale, q.shape[-1]))
        if causal:
            tq, tk = scores.shape[-2:]
            scores[..., ~causal_mask(tq, tk)] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores @ v  # (B, H, Tq, Dv)
