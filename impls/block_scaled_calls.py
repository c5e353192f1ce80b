"""The checks a block-scaled kernel's entry point makes (spec.block_scaled), shared by every
family's built-ins so that each refuses the same calls in the same words: one convention's
keywords, operands in a declared format, each scale tensor's shape and dtype, a block that divides
its axis, global scales that are finite and positive; beside them, return_lse and a cache's page
pools where declared, the pools' table and lengths checked as a float call's are.

Operands are read through their ``.shape`` and their dtype's name alone (``dtype_name``), scales
through :func:`spec.masks.host_values`, so NumPy arrays and torch tensors (on any device, with or
without grad) go through the same checks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from impls.fp8_calls import PAGED_KEYWORDS, numpy_dtype_name
from impls.validation import AttentionInputError, validate_inputs
from spec.block_scaled import (
    BLOCK_FORMATS,
    BLOCK_KEYWORDS,
    CACHE_CONVENTIONS,
    CACHE_LAYOUTS,
    GLOBAL_SCALE_KEYWORDS,
    LAYOUT_KEYWORD,
    BlockShapeError,
    block_format,
    scale_shape,
)
from spec.masks import host_values

# each convention's keywords: (the block scales, the global scales where its format has them)
CONVENTION_KEYWORDS = {
    "mx_attention": ("q_block_scales", "k_block_scales", "v_block_scales"),
    "fp4_cache": ("k_block_scales", "v_block_scales"),
    "mla_fp8_cache": (LAYOUT_KEYWORD,),
}


def is_block_scaled_call(keywords: dict) -> bool:
    return any(name in keywords for name in BLOCK_KEYWORDS)


def block_keywords(keywords: dict) -> dict:
    """A block-scaled call's own keywords: its scales, global scales and cache layout."""
    return {name: value for name, value in keywords.items() if name in BLOCK_KEYWORDS}


def other_keywords(keywords: dict) -> dict:
    """The rest: what the float path the blocks decode into takes (return_lse, a page pool's
    block table and key lengths)."""
    return {name: value for name, value in keywords.items() if name not in BLOCK_KEYWORDS}


def check_other_keywords(capabilities, convention: str, keywords: dict) -> None:
    """Check the call's keywords beyond its blocks: return_lse where lse is declared, a page
    pool's (PAGED_KEYWORDS, a block table among them) where paged is and the convention is a
    cache's; anything else an AttentionInputError naming it."""
    others = other_keywords(keywords)
    allowed = {"return_lse"} if capabilities.lse else set()
    if capabilities.paged and convention in CACHE_CONVENTIONS:
        allowed |= set(PAGED_KEYWORDS)
    unexpected = sorted(set(others) - allowed)
    if not unexpected and set(others) & set(PAGED_KEYWORDS) and "block_table" not in others:
        raise AttentionInputError(
            f"{sorted(set(others) & set(PAGED_KEYWORDS))} without block_table: beside its blocks "
            "a call takes key lengths and a page size only with a page pool's block table"
        )
    if unexpected:
        raise AttentionInputError(
            f"a block-scaled call in the {convention} convention takes "
            + (", ".join(sorted(allowed)) or "no keyword")
            + f" beside its blocks' here, but got {unexpected}"
            + ("" if convention in CACHE_CONVENTIONS else " (page pools are a cache's)")
        )


def call_convention(keywords: dict) -> str:
    """The block-scaled convention a call's keywords name."""
    if LAYOUT_KEYWORD in keywords:
        return "mla_fp8_cache"
    return "mx_attention" if "q_block_scales" in keywords else "fp4_cache"


def cache_format(keywords: dict) -> tuple[str, str] | None:
    """(convention, format) of a block-scaled cache's call as its keywords name them; None for
    any other call, or a layout no format has (which the entry point's checks refuse)."""
    if not is_block_scaled_call(keywords):
        return None
    convention = call_convention(keywords)
    if convention == "mla_fp8_cache":
        layout = keywords[LAYOUT_KEYWORD]
        return (convention, layout) if layout in CACHE_LAYOUTS else None
    if convention == "fp4_cache":
        return convention, fp4_format(keywords)
    return None


def checked_latent_cache(capabilities, q, k, v, causal, scale, keywords: dict,
                         dtype_name: Callable) -> str:  # fmt: skip
    """The layout of a latent cache's call (mla_fp8_cache), after its checks: a declared layout
    named and nothing else, q in a declared query dtype, k and v the same shape of uint8 bytes a
    token as the layout has, q's D the layout's key width."""
    others = sorted(set(block_keywords(keywords)) - {LAYOUT_KEYWORD})
    if others:
        raise AttentionInputError(
            f"an mla_fp8_cache call takes {LAYOUT_KEYWORD} and no other block keyword; "
            f"unexpected {others}"
        )
    fmt = keywords[LAYOUT_KEYWORD]
    if fmt not in CACHE_LAYOUTS:
        raise AttentionInputError(
            f"{LAYOUT_KEYWORD}={fmt!r}, but should be one of {', '.join(CACHE_LAYOUTS)}"
        )
    if fmt not in capabilities.block_formats:
        raise AttentionInputError(f"the {fmt} block format is not declared")
    layout = CACHE_LAYOUTS[fmt]
    check_cache_query(capabilities, dtype_name(q))
    for name, x in (("k", k), ("v", v)):
        if dtype_name(x) != "uint8" or len(x.shape) != 4 or x.shape[-1] != layout.token_bytes:
            raise AttentionInputError(
                f"{name} of shape {tuple(x.shape)} and dtype {dtype_name(x)}, but should be the "
                f"{fmt} cache's bytes: uint8 (B, Hkv, Tk, {layout.token_bytes}), or a page pool "
                f"of them (pages, page_size, Hkv, {layout.token_bytes})"
            )
    if tuple(k.shape) != tuple(v.shape):
        raise AttentionInputError(
            f"k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}, but a latent cache's k and v "
            "are the same cache: its values are its keys' latent part"
        )
    width = layout.latent + layout.rope
    if q.shape[-1] != width:
        raise AttentionInputError(
            f"q's head dimension is {q.shape[-1]}, but the {fmt} cache's keys have {width} "
            f"({layout.latent} latent and {layout.rope} rotary values)"
        )
    logical = [np.broadcast_to(np.float32(0), (*x.shape[:-1], n))
               for x, n in ((q, width), (k, width), (v, layout.latent))]  # fmt: skip
    validate_logical(*logical, causal, scale, keywords)
    return fmt


def validate_logical(q, k, v, causal, scale, keywords: dict) -> None:
    """The shapes the blocks stand for checked as a float call's are, a page pool's with its
    block table and key lengths."""
    paging = {name: keywords[name] for name in PAGED_KEYWORDS if name in keywords}
    validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **paging)


def check_cache_query(capabilities, dtype: str) -> None:
    """A cache's q, not block-scaled, in one of the query dtypes the implementation declares."""
    if dtype not in capabilities.fp8_queries:
        raise AttentionInputError(
            f"q.dtype={dtype}, but should be one of {', '.join(capabilities.fp8_queries)}"
        )


def fp4_format(keywords: dict) -> str:
    """An FP4 cache's format: NVFP4 where the call gives global scales, MXFP4 where not."""
    return "nvfp4" if any(name in keywords for name in GLOBAL_SCALE_KEYWORDS) else "mxfp4"


def call_format(convention: str, q, k, keywords: dict, dtype_name: Callable) -> str:
    """The block format a call is in: its elements' dtype under mx_attention, NVFP4 or MXFP4 by
    its global scales under fp4_cache."""
    if convention == "fp4_cache":
        return fp4_format(keywords)
    element = dtype_name(q)
    formats = [f.name for f in BLOCK_FORMATS.values() if f.element == element and not f.packed]
    if not formats:
        raise AttentionInputError(
            f"q.dtype={element}, but an mx_attention call's q, k and v are in one of "
            + ", ".join(f.element for f in BLOCK_FORMATS.values() if not f.packed)
        )
    return formats[0]


def checked_block_call(
    capabilities, q, k, v, causal, scale, keywords: dict, *,
    dtype_name: Callable = numpy_dtype_name,
) -> tuple[str, str]:  # fmt: skip
    """(convention, format) of a block-scaled call, after the checks its entry point makes; an
    AttentionInputError names the first thing wrong."""
    convention = call_convention(keywords)
    if convention not in capabilities.block_conventions:
        raise AttentionInputError(f"the {convention} block-scaled convention is not declared")
    check_other_keywords(capabilities, convention, keywords)
    if convention == "mla_fp8_cache":
        return convention, checked_latent_cache(capabilities, q, k, v, causal, scale, keywords,
                                                dtype_name)  # fmt: skip
    fmt = call_format(convention, q, k, keywords, dtype_name)
    spec = block_format(fmt)
    if fmt not in capabilities.block_formats:
        raise AttentionInputError(f"the {fmt} block format is not declared")
    expected = CONVENTION_KEYWORDS[convention] + (GLOBAL_SCALE_KEYWORDS * spec.global_scale)
    missing = [name for name in expected if name not in keywords]
    others = sorted(set(block_keywords(keywords)) - set(expected))
    if missing or others:
        raise AttentionInputError(
            f"a {fmt} call in the {convention} convention takes {', '.join(expected)} and no "
            f"other block keyword; missing {missing or 'nothing'}, unexpected {others or 'nothing'}"
        )
    dtypes = {name: dtype_name(x) for name, x in zip("qkv", (q, k, v), strict=True)}
    stored = {"q": spec.element, "k": spec.element, "v": spec.element}
    if spec.packed:
        stored = {"k": "uint8", "v": "uint8"}
        check_cache_query(capabilities, dtypes["q"])
    for name, dtype in stored.items():
        if dtypes[name] != dtype:
            what = "e2m1 two a byte" if spec.packed else fmt
            raise AttentionInputError(
                f"{name}.dtype={dtypes[name]}, but should be {dtype} ({what})"
            )
    shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape)}
    if spec.packed:  # two elements a byte
        shapes |= {name: (*shapes[name][:-1], 2 * shapes[name][-1]) for name in "kv"}
    logical = [np.broadcast_to(np.float32(0), shapes[name]) for name in "qkv"]
    validate_logical(*logical, causal, scale, keywords)
    for name in CONVENTION_KEYWORDS[convention]:
        operand = name[0]
        try:
            expected_shape = scale_shape(convention, operand, shapes[operand], spec.block)
        except BlockShapeError as exc:
            raise AttentionInputError(str(exc)) from None
        value = host_values(keywords[name])
        if value.shape != expected_shape or value.dtype != np.uint8:
            raise AttentionInputError(
                f"{name} of shape {value.shape} and dtype {value.dtype}, but should be the "
                f"{spec.scale} bytes (uint8) of one scale per {spec.block} elements: "
                f"{expected_shape}"
            )
    for name in GLOBAL_SCALE_KEYWORDS * spec.global_scale:
        value = host_values(keywords[name])
        if value.shape != () or not np.issubdtype(value.dtype, np.floating):
            raise AttentionInputError(
                f"{name} of shape {value.shape} and dtype {value.dtype}, but should be a float32 "
                "scalar"
            )
        if not np.isfinite(value) or value <= 0:
            raise AttentionInputError(f"{name} holds {value}, but scales are finite and > 0")
    return convention, fmt
