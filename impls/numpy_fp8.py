"""FP8 calls (spec.fp8) for the NumPy built-ins: the checks a kernel's entry point makes, and the
two arithmetics they declare.

* ``numpy`` dequantizes first, x * scale in float32, and runs its float32 path: the reference's
  arithmetic, P kept in float32;
* ``numpy_flash`` computes as FlashAttention 3 does: the scores of the stored FP8 values summed in
  float32, times the scale and the q and k scales; the online softmax over 64-key tiles, each
  tile's P * 2^8 rounded to e4m3fn for the PV product and the 2^8 divided out with the sum; v's
  scale on the output, rounded to bfloat16.

NumPy holds FP8 through ml_dtypes: without it, the FP8 tests of a NumPy implementation are
skipped, saying so.
"""

from __future__ import annotations

import numpy as np

from impls.fp8_calls import PAGED_KEYWORDS, checked_scales, declared_output
from spec.dtypes import rounded_in_storage
from spec.formula import resolve_scale
from spec.fp8 import dequantized, round_p

# q's dtypes under the key/value cache's convention: the 16-bit ones through ml_dtypes (q is
# widened to float32 first, exactly), though the NumPy built-ins compute in float32 and float64
FP8_QUERY_DTYPES = ("bfloat16", "float16", "float32", "float64")


def dequantized_attention(impl, q, k, v, *, causal, scale, **keywords):
    """``numpy``'s FP8 path: each operand times its scale in float32, then its float32 path."""
    scales = checked_scales(impl.capabilities, q, k, v, causal, scale, keywords)
    inputs = [x.astype(np.float32) for x in dequantized(q, k, v, scales)]  # float64 products
    out = impl.attention(*inputs, causal=causal, scale=scale)
    return as_output(out, declared_output(impl.capabilities, q.dtype.name, scales))


def flash3_attention(
    q, k, v, *, capabilities, causal, scale, tiled_attention, paged_attention, **keywords
):
    """``numpy_flash``'s FP8 path: FlashAttention 3's arithmetic over ``tiled_attention``'s
    tiles, or ``paged_attention``'s where k and v are page pools (see the module's docstring)."""
    scales = checked_scales(capabilities, q, k, v, causal, scale, keywords)
    paging = {name: keywords[name] for name in PAGED_KEYWORDS if name in keywords}
    kv_heads = k.shape[2] if paging else k.shape[1]  # (pages, page_size, Hkv, D) or (B, Hkv, ..)
    score_scale = (
        np.float32(resolve_scale(scale, q.shape[-1]))
        * scales.applied("q", q, k, kv_heads)
        * scales.applied("k", q, k, kv_heads)
    )  # (B, H, 1, 1)
    stored = [x.astype(np.float32) for x in (q, k, v)]  # exact: the stored values
    rounded = {"rounded_weights": lambda weights: round_p(weights, capabilities.fp8_p)}
    if paging:
        out = paged_attention(*stored, paging["block_table"], causal=causal, scale=score_scale,
                              key_lengths=paging["key_lengths"], window=None, return_lse=False,
                              **rounded)  # fmt: skip
    else:
        out = tiled_attention(*stored, causal=causal, scale=score_scale, **rounded)
    out_dtype = declared_output(capabilities, q.dtype.name, scales)
    return as_output(out * scales.applied("v", q, k, kv_heads), out_dtype)


def as_output(out: np.ndarray, dtype: str) -> np.ndarray:
    """``out`` rounded to ``dtype``, as a NumPy array of it (bfloat16: ml_dtypes')."""
    if dtype != "bfloat16":
        return out.astype(dtype)
    import ml_dtypes

    return rounded_in_storage(out.astype(np.float32), dtype).astype(ml_dtypes.bfloat16)
