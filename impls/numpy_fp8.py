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

from impls.validation import AttentionInputError, validate_inputs
from spec.dtypes import rounded_in_storage
from spec.formula import resolve_scale
from spec.fp8 import (
    FP8_FORMATS,
    SCALE_KEYWORDS,
    Fp8Scales,
    dequantized,
    output_dtype,
    round_p,
)

FP8_KEYWORDS = tuple(name for names in SCALE_KEYWORDS.values() for name in names)


def is_fp8_call(q, k, v, keywords: dict) -> bool:
    """Whether a call is an FP8 one: a scale among its keywords, or an FP8 operand."""
    return any(name in keywords for name in FP8_KEYWORDS) or any(
        str(x.dtype) in FP8_FORMATS for x in (q, k, v)
    )


def checked_scales(capabilities, q, k, v, causal, scale, keywords: dict) -> Fp8Scales:
    """The call's scales in its convention, after the checks a kernel's entry point makes; an
    AttentionInputError names the first thing wrong."""
    given = {name for name in FP8_KEYWORDS if name in keywords}
    conventions = [c for c, names in SCALE_KEYWORDS.items() if given & set(names)]
    if len(conventions) != 1:
        raise AttentionInputError(
            "an FP8 call takes the scales of one convention, "
            + " or ".join(", ".join(names) for names in SCALE_KEYWORDS.values())
            + f", but got {sorted(given) or 'none'}"
        )
    convention = conventions[0]
    if convention not in capabilities.fp8_conventions:
        raise AttentionInputError(f"the {convention} convention is not declared")
    missing = [name for name in SCALE_KEYWORDS[convention] if name not in keywords]
    others = sorted(set(keywords) - given)
    if missing or others:
        raise AttentionInputError(
            f"an FP8 call in the {convention} convention takes "
            f"{', '.join(SCALE_KEYWORDS[convention])} and nothing else; missing "
            f"{missing or 'nothing'}, unexpected {others or 'nothing'}"
        )
    fp8_operands = ("q", "k", "v") if convention == "descale" else ("k", "v")
    for name, x in zip("qkv", (q, k, v), strict=True):
        dtype = str(x.dtype)
        if name in fp8_operands and dtype not in capabilities.fp8_formats:
            raise AttentionInputError(
                f"{name}.dtype={dtype}, but should be one of {', '.join(capabilities.fp8_formats)}"
                f" in the {convention} convention"
            )
        if name not in fp8_operands and x.dtype not in (np.float32, np.float64):
            raise AttentionInputError(f"q.dtype={dtype}, but should be float32 or float64")
    if len({str(x.dtype) for x in (k, v)}) != 1 or (convention == "descale" and q.dtype != k.dtype):
        raise AttentionInputError(
            f"FP8 operands of one call share one format, but got q {q.dtype}, k {k.dtype}, "
            f"v {v.dtype}"
        )
    as_float = [np.asarray(x, np.float32) for x in (q, k, v)]
    validate_inputs(*as_float, causal=causal, scale=scale, gqa=True)
    batch, kv_heads = k.shape[0], k.shape[1]
    shapes = {
        "descale": [(batch, kv_heads)],
        "kv_scale": [()] * ("tensor" in capabilities.fp8_kv_scales)
        + [(kv_heads,)] * ("kv_head" in capabilities.fp8_kv_scales),
    }[convention]
    for name in SCALE_KEYWORDS[convention]:
        value = np.asarray(keywords[name])
        if value.shape not in shapes or not np.issubdtype(value.dtype, np.floating):
            raise AttentionInputError(
                f"{name} of shape {value.shape} and dtype {value.dtype}, but should be floats of "
                + " or ".join(str(s) for s in shapes)
            )
        if not np.all(np.isfinite(value)) or np.any(value <= 0):
            raise AttentionInputError(f"{name} holds {value}, but scales are finite and > 0")
    return Fp8Scales(convention, {name: keywords[name] for name in SCALE_KEYWORDS[convention]})


def declared_output(capabilities, q, scales: Fp8Scales) -> str:
    return output_dtype(scales.convention, q.dtype.name, capabilities.fp8_output)


def dequantized_attention(impl, q, k, v, *, causal, scale, **keywords):
    """``numpy``'s FP8 path: each operand times its scale in float32, then its float32 path."""
    scales = checked_scales(impl.capabilities, q, k, v, causal, scale, keywords)
    inputs = [x.astype(np.float32) for x in dequantized(q, k, v, scales)]  # float64 products
    out = impl.attention(*inputs, causal=causal, scale=scale)
    return as_output(out, declared_output(impl.capabilities, q, scales))


def flash3_attention(q, k, v, *, capabilities, causal, scale, tiled_attention, **keywords):
    """``numpy_flash``'s FP8 path: FlashAttention 3's arithmetic over ``tiled_attention``'s
    tiles (see the module's docstring)."""
    scales = checked_scales(capabilities, q, k, v, causal, scale, keywords)

    score_scale = (
        np.float32(resolve_scale(scale, q.shape[-1]))
        * scales.applied("q", q, k)
        * scales.applied("k", q, k)
    )
    out = tiled_attention(
        *(x.astype(np.float32) for x in (q, k, v)),  # exact: the stored values
        causal=causal,
        scale=score_scale,
        rounded_weights=lambda weights: round_p(weights, capabilities.fp8_p),
    )
    return as_output(out * scales.applied("v", q, k), declared_output(capabilities, q, scales))


def as_output(out: np.ndarray, dtype: str) -> np.ndarray:
    """``out`` rounded to ``dtype``, as a NumPy array of it (bfloat16: ml_dtypes')."""
    if dtype != "bfloat16":
        return out.astype(dtype)
    import ml_dtypes

    return rounded_in_storage(out.astype(np.float32), dtype).astype(ml_dtypes.bfloat16)
