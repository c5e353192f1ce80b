"""``cupy_naive``: the document's CUDA kernel (``cupy_naive.cu``), one thread per score."""

from __future__ import annotations

import math

import numpy as np

from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.cupy_arrays import (
    NAIVE_SCORE_THREADS,
    NAIVE_VALUE_THREADS,
    SOFTMAX_THREADS,
    CupyArrays,
    cupy,
    kernel_module,
    scalar_scale,
)


class CupyNaive(CupyArrays, Implementation):
    """The document's kernel: one thread per score, the (Tq, Tk) scores materialised."""

    name = "cupy_naive"
    capabilities = Capabilities(dtypes=("float32",), conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        self.check_arrays(q=q, k=k, v=v)
        batch, heads, tq, d = q.shape
        tk, dv = k.shape[-2], v.shape[-1]
        self.check_grid(batch * heads, tq)
        module = kernel_module("cupy_naive")
        scores = cupy.empty((batch * heads, tq, tk), dtype=cupy.float32)  # (B*H, Tq, Tk)
        out = cupy.empty((batch, heads, tq, dv), dtype=cupy.float32)  # (B, H, Tq, Dv)
        module.get_function("attention_scores")(
            (math.ceil(tk / NAIVE_SCORE_THREADS), tq, batch * heads),
            (NAIVE_SCORE_THREADS,),
            (q, k, scores, np.int32(tq), np.int32(tk), np.int32(d),
             scalar_scale(scale, d), np.int32(scale is None), np.int32(causal)),
        )  # fmt: skip
        module.get_function("softmax_rows")(
            (batch * heads * tq,), (SOFTMAX_THREADS,), (scores, np.int32(tk))
        )
        module.get_function("weighted_values")(
            (math.ceil(dv / NAIVE_VALUE_THREADS), tq, batch * heads),
            (NAIVE_VALUE_THREADS,),
            (scores, v, out, np.int32(tq), np.int32(tk), np.int32(dv), np.int32(causal)),
        )
        return out
