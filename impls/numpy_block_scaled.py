"""Block-scaled calls (spec.block_scaled) for the NumPy built-ins: the checks a kernel's entry
point makes (impls.block_scaled_calls), the blocks dequantized (each element times its scale in
float32), then the implementation's float32 path with the call's other keywords (return_lse, a
page pool's block table and key lengths, where declared):

* ``numpy``: its float32 path, P kept in float32;
* ``numpy_flash``: its tiles, each tile's P * 2^8 rounded to e4m3fn for the P v product, as
  MXFP8 attention kernels round it; a page pool's pages decoded where they lie, read through the
  block table by its paged path.
"""

from __future__ import annotations

import numpy as np

from impls.block_scaled_calls import block_keywords, checked_block_call, other_keywords
from impls.numpy_fp8 import as_output
from spec.block_scaled import LAYOUT_KEYWORD, BlockCall, output_dtype
from spec.masks import host_values


def block_scaled_attention(attention, capabilities, q, k, v, *, causal, scale, **keywords):
    """``attention`` (a float32 path taking causal, scale and the call's other keywords) on the
    dequantized operands: its output in the call's dtype, its log-sum-exp in float32."""
    convention, fmt = checked_block_call(capabilities, q, k, v, causal, scale, keywords)
    stored = [x if x.dtype == np.uint8 else x.astype(np.float64) for x in (q, k, v)]
    # the scales' bytes; a latent cache's are in its tokens, its layout named by the format
    scales = {name: host_values(value) for name, value in block_keywords(keywords).items()
              if name != LAYOUT_KEYWORD}  # fmt: skip
    operands = [x.astype(np.float32) for x in BlockCall(convention, fmt, *stored, scales)
                .dequantized()]  # fmt: skip
    others = other_keywords(keywords)
    answer = attention(*operands, causal=causal, scale=scale, **others)
    out_dtype = output_dtype(convention, q.dtype.name, capabilities.block_output)
    if others.get("return_lse"):
        out, lse = answer
        return as_output(out, out_dtype), lse.astype(np.float32)
    return as_output(answer, out_dtype)
