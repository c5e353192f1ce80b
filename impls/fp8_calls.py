"""The checks an FP8 kernel's entry point makes (spec.fp8), shared by every family's built-ins so
that each refuses the same calls in the same words: the scales of one convention, the operands in
declared formats, the scales' shapes and values.

Arrays are read through their ``.shape`` and the name of their dtype alone (``dtype_name``), so
NumPy arrays (FP8 through ml_dtypes) and torch tensors go through the same checks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from impls.validation import AttentionInputError, validate_inputs
from spec.fp8 import FP8_FORMATS, SCALE_KEYWORDS, Fp8Scales, output_dtype
from spec.masks import host_values

FP8_KEYWORDS = tuple(name for names in SCALE_KEYWORDS.values() for name in names)
# A paged FP8 cache's keywords: k and v page pools (pages, page_size, Hkv, D), as vLLM keeps them
PAGED_KEYWORDS = ("block_table", "page_size", "key_lengths")


def numpy_dtype_name(x) -> str:
    return str(x.dtype)


def is_fp8_call(q, k, v, keywords: dict, dtype_name: Callable = numpy_dtype_name) -> bool:
    """Whether a call is an FP8 one: a scale among its keywords, or an FP8 operand (an operand
    with no dtype at all is left to the entry point's own checks to refuse)."""
    return any(name in keywords for name in FP8_KEYWORDS) or any(
        hasattr(x, "dtype") and dtype_name(x) in FP8_FORMATS for x in (q, k, v)
    )


def checked_scales(
    capabilities, q, k, v, causal, scale, keywords: dict, *,
    dtype_name: Callable = numpy_dtype_name,
) -> Fp8Scales:  # fmt: skip
    """The call's scales in its convention, after the checks a kernel's entry point makes; an
    AttentionInputError names the first thing wrong. Under the key/value cache's convention q is
    not FP8, and of a dtype in ``capabilities.fp8_queries``. With PAGED_KEYWORDS, where the
    implementation declares paged, k and v are page pools."""
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
    paging = {name: keywords[name] for name in PAGED_KEYWORDS if name in keywords}
    if paging and not capabilities.paged:
        raise AttentionInputError(
            f"a paged FP8 call ({', '.join(paging)}), but paged is not declared"
        )
    others = sorted(set(keywords) - given - set(paging))
    if missing or others:
        raise AttentionInputError(
            f"an FP8 call in the {convention} convention takes "
            f"{', '.join(SCALE_KEYWORDS[convention])} and nothing else; missing "
            f"{missing or 'nothing'}, unexpected {others or 'nothing'}"
        )
    fp8_operands = ("q", "k", "v") if convention == "descale" else ("k", "v")
    dtypes = {name: dtype_name(x) for name, x in zip("qkv", (q, k, v), strict=True)}
    for name, dtype in dtypes.items():
        if name in fp8_operands and dtype not in capabilities.fp8_formats:
            raise AttentionInputError(
                f"{name}.dtype={dtype}, but should be one of {', '.join(capabilities.fp8_formats)}"
                f" in the {convention} convention"
            )
        if name not in fp8_operands and dtype not in capabilities.fp8_queries:
            raise AttentionInputError(
                f"q.dtype={dtype}, but should be one of {', '.join(capabilities.fp8_queries)}"
            )
    if dtypes["k"] != dtypes["v"] or (convention == "descale" and dtypes["q"] != dtypes["k"]):
        raise AttentionInputError(
            f"FP8 operands of one call share one format, but got q {dtypes['q']}, k "
            f"{dtypes['k']}, v {dtypes['v']}"
        )
    shapes_only = [np.broadcast_to(np.float32(0), tuple(x.shape)) for x in (q, k, v)]
    validate_inputs(*shapes_only, causal=causal, scale=scale, gqa=True, **paging)
    batch, kv_heads = q.shape[0], k.shape[2] if paging else k.shape[1]
    shapes = {
        "descale": [(batch, kv_heads)],
        "kv_scale": [()] * ("tensor" in capabilities.fp8_kv_scales)
        + [(kv_heads,)] * ("kv_head" in capabilities.fp8_kv_scales),
    }[convention]
    for name in SCALE_KEYWORDS[convention]:
        value = host_values(keywords[name])
        if value.shape not in shapes or not np.issubdtype(value.dtype, np.floating):
            raise AttentionInputError(
                f"{name} of shape {value.shape} and dtype {value.dtype}, but should be floats of "
                + " or ".join(str(s) for s in shapes)
            )
        if not np.all(np.isfinite(value)) or np.any(value <= 0):
            raise AttentionInputError(f"{name} holds {value}, but scales are finite and > 0")
    return Fp8Scales(convention, {name: keywords[name] for name in SCALE_KEYWORDS[convention]})


def declared_output(capabilities, query_dtype: str, scales: Fp8Scales) -> str:
    """The dtype the call returns: q's under kv_scale, the declared fp8_output under descale."""
    return output_dtype(scales.convention, query_dtype, capabilities.fp8_output)
