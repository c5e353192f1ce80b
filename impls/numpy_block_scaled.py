"""Block-scaled calls (spec.block_scaled) for the NumPy built-ins: the checks a kernel's entry
point makes (impls.block_scaled_calls), then

* ``numpy``: the blocks dequantized, each element times its scale in float32, and its float32
  path (P kept in float32);
* ``numpy_flash``: the same operands through its tiles, each tile's P * 2^8 rounded to e4m3fn
  for the P v product, as MXFP8 attention kernels round it.
"""

from __future__ import annotations

import numpy as np

from impls.block_scaled_calls import checked_block_call
from impls.numpy_fp8 import as_output
from spec.block_scaled import LAYOUT_KEYWORD, BlockCall, output_dtype
from spec.masks import host_values


def dequantized_operands(capabilities, q, k, v, *, causal, scale, **keywords):
    """(the call's q, k, v dequantized to float32, the dtype it returns)."""
    convention, fmt = checked_block_call(capabilities, q, k, v, causal, scale, keywords)
    stored = [x if x.dtype == np.uint8 else x.astype(np.float64) for x in (q, k, v)]
    # the scales' bytes; a latent cache's are in its tokens, its layout named by the format
    scales = {name: host_values(value) for name, value in keywords.items()
              if name != LAYOUT_KEYWORD}  # fmt: skip
    call = BlockCall(convention, fmt, *stored, scales)
    operands = [x.astype(np.float32) for x in call.dequantized()]
    return operands, output_dtype(convention, q.dtype.name, capabilities.block_output)


def block_scaled_attention(attention, capabilities, q, k, v, *, causal, scale, **keywords):
    """``attention`` (a float32 path taking causal and scale) on the dequantized operands, its
    output in the call's dtype."""
    operands, out_dtype = dequantized_operands(capabilities, q, k, v, causal=causal, scale=scale,
                                               **keywords)  # fmt: skip
    return as_output(attention(*operands, causal=causal, scale=scale), out_dtype)
