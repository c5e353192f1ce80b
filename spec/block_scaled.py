"""Block-scaled low precision as Blackwell kernels run attention: every small block of an operand
carries its own scale. The formats (OCP's microscaling MXFP8 and MXFP4, NVIDIA's NVFP4), the two
conventions kernels take them in, the recipes their callers quantize with, and how the bytes read.

* e8m0, MX's scale: a byte holding 2^(code - 127); 0xFF is NaN.
* e2m1, FP4's element: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, two a byte, the first element in the low
  nibble.
* A block's scale multiplies its elements; NVFP4's block scales are e4m3fn values under one
  float32 global scale per tensor.

The truth is the float64 formula on the dequantized inputs (element times its block's scale,
times the global scale), so a scale read along the wrong axis, from the neighbouring block or
with its bias off by one is an O(1) error. How the bytes are read is one :class:`Reading`: the
truth reads them as the formats define, and each mistake of spec.mistakes.block_scaled reads them
with one thing changed.

Scales travel as their bytes (uint8), as caches store them, so that every array library carries
them alike; packed FP4 operands are uint8 arrays of half the head dimension.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from spec.dtypes import round_to
from spec.fp8 import (
    Fp8Scales,
    codes_of,
    fp8_baseline,
    fp8_format,
    round_to_fp8,
    round_to_grid,
    values_of_bytes,
)

# --- the formats --------------------------------------------------------------------------------

E8M0_BIAS = 127
E8M0_NAN = 0xFF
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # codes 0..7; bit 3 the sign
E2M1_LARGEST = 6.0


def e8m0_values(codes, bias: int = E8M0_BIAS) -> np.ndarray:
    """The values of e8m0 bytes, float64: 2^(code - bias), NaN for 0xFF."""
    codes = np.asarray(codes).astype(np.int64)
    return np.where(codes == E8M0_NAN, np.nan, np.exp2(codes - bias))


def e8m0_codes(exponents) -> np.ndarray:
    """The e8m0 bytes of the powers of two 2^``exponents`` (integers in [-127, 127])."""
    exponents = np.asarray(exponents)
    if np.any((exponents < -E8M0_BIAS) | (exponents > E8M0_NAN - 1 - E8M0_BIAS)):
        raise ValueError("e8m0 holds the powers of two 2^-127 .. 2^127")
    return (exponents + E8M0_BIAS).astype(np.uint8)


def scale_byte_values(scale: str, e8m0_bias: int = E8M0_BIAS) -> np.ndarray:
    """The value of each of the 256 bytes of a block scale format (BlockFormat.scale: e8m0, or an
    FP8 format's name), float64, indexed by the byte."""
    codes = np.arange(256)
    return e8m0_values(codes, e8m0_bias) if scale == "e8m0" else values_of_bytes(scale)[codes]


def round_to_e2m1(values) -> np.ndarray:
    """``values`` rounded to e2m1 (to nearest, ties to even), saturating at +-6 as the OCP
    recipe's conversion does; float64. e2m1 has no NaN: a NaN is a ValueError."""
    x = np.asarray(values, np.float64)
    if np.isnan(x).any():
        raise ValueError("e2m1 has no NaN")
    return np.clip(round_to_grid(x, 1.0, 1), -E2M1_LARGEST, E2M1_LARGEST)


def e2m1_codes(values) -> np.ndarray:
    """The 4-bit codes (uint8, 0..15) of e2m1 ``values`` (exact in e2m1; -0 is 0x8)."""
    x = np.asarray(values, np.float64)
    magnitude = np.searchsorted(E2M1_VALUES, np.abs(x))
    if np.any(E2M1_VALUES[np.minimum(magnitude, 7)] != np.abs(x)):
        raise ValueError("values that are not e2m1's")
    return (magnitude | (np.signbit(x) << 3)).astype(np.uint8)


def e2m1_values(codes) -> np.ndarray:
    codes = np.asarray(codes).astype(np.int64)
    return np.where(codes & 8, -1.0, 1.0) * E2M1_VALUES[codes & 7]


def packed_e2m1(codes, low_first: bool = True) -> np.ndarray:
    """e2m1 codes (..., D), D even, two a byte: (..., D / 2) uint8, the first of each pair in the
    low nibble (``low_first``; the other order only in a mistake)."""
    codes = np.asarray(codes).astype(np.uint8)
    if codes.shape[-1] % 2:
        raise ValueError(f"packing e2m1 two a byte needs an even last axis, got {codes.shape}")
    first, second = codes[..., 0::2], codes[..., 1::2]
    return (first | (second << 4)) if low_first else ((first << 4) | second)


def unpacked_e2m1(packed, low_first: bool = True) -> np.ndarray:
    """The e2m1 codes (..., 2 n) of packed bytes (..., n)."""
    packed = np.asarray(packed).astype(np.uint8)
    low, high = packed & 0xF, packed >> 4
    first, second = (low, high) if low_first else (high, low)
    return np.stack([first, second], axis=-1).reshape(*packed.shape[:-1], -1)


@dataclass(frozen=True)
class BlockFormat:
    name: str
    element: str  # an FP8 format's name (spec.fp8), or "e2m1"
    block: int  # elements a scale covers
    scale: str  # "e8m0", or "float8_e4m3fn" (NVFP4's, under a float32 global scale)
    description: str

    @property
    def global_scale(self) -> bool:
        return self.scale == "float8_e4m3fn"

    @property
    def packed(self) -> bool:
        return self.element == "e2m1"

    @property
    def element_largest(self) -> float:
        return E2M1_LARGEST if self.packed else fp8_format(self.element).largest_finite

    def round_elements(self, values) -> np.ndarray:
        """``values`` (already divided by their scale) in the element format, saturating."""
        if self.packed:
            return round_to_e2m1(values)
        largest = self.element_largest
        return round_to_fp8(np.clip(values, -largest, largest), self.element)


BLOCK_FORMATS: dict[str, BlockFormat] = {
    fmt.name: fmt
    for fmt in (
        BlockFormat("mxfp8_e4m3", "float8_e4m3fn", 32, "e8m0",
                    "OCP MXFP8: e4m3fn elements, one e8m0 scale per 32 (cuDNN's sdpa_mxfp8, "
                    "TransformerEngine's MXFP8BlockScaling)"),
        BlockFormat("mxfp8_e5m2", "float8_e5m2", 32, "e8m0",
                    "OCP MXFP8 with e5m2 elements, one e8m0 scale per 32"),
        BlockFormat("nvfp4", "e2m1", 16, "float8_e4m3fn",
                    "NVIDIA's NVFP4: e2m1 elements two a byte, one e4m3fn scale per 16, one "
                    "float32 global scale per tensor (FlashInfer's NVFP4 key/value cache)"),
        BlockFormat("mxfp4", "e2m1", 32, "e8m0",
                    "OCP MXFP4: e2m1 elements two a byte, one e8m0 scale per 32"),
        BlockFormat("deepseek_v32", "float8_e4m3fn", 128, "float32",
                    "DeepSeek V3.2's FP8 MLA cache (FlashMLA): 656 bytes a token, its 512 latent "
                    "values in e4m3fn, one power-of-two float32 scale per 128 of them, then its "
                    "64 rotary values in bfloat16, unquantized"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class CacheLayout:
    """A multi-head latent attention cache that stores each token as one run of bytes: its latent
    vector in the format's elements, one scale per block of them, then its rotary part in
    bfloat16, left unquantized. A key is the latent and the rotary part (D = latent + rope); a
    value is the latent alone (Dv = latent)."""

    format: str  # a BLOCK_FORMATS name
    latent: int
    rope: int
    scale_bytes: int  # each scale's

    @property
    def scales(self) -> int:
        return self.latent // block_format(self.format).block

    @property
    def rope_offset(self) -> int:
        return self.latent + self.scales * self.scale_bytes

    @property
    def token_bytes(self) -> int:
        return self.rope_offset + 2 * self.rope

    @property
    def parts(self) -> tuple[slice, slice, slice]:
        """Where a token's latent elements, scales and rotary values lie in its bytes."""
        return (slice(0, self.latent), slice(self.latent, self.rope_offset),
                slice(self.rope_offset, self.token_bytes))  # fmt: skip


CACHE_LAYOUTS = {"deepseek_v32": CacheLayout("deepseek_v32", latent=512, rope=64, scale_bytes=4)}


def block_format(name: str) -> BlockFormat:
    if name not in BLOCK_FORMATS:
        raise ValueError(f"block format {name!r}, but should be one of {', '.join(BLOCK_FORMATS)}")
    return BLOCK_FORMATS[name]


# --- the conventions ----------------------------------------------------------------------------

BLOCK_CONVENTIONS: dict[str, str] = {
    "mx_attention": "MXFP8 attention (cuDNN's sdpa_mxfp8, TransformerEngine's fp8_dpa): q, k "
    "and v in e4m3fn (or e5m2); q_block_scales (B, H, Tq, D/32) and k_block_scales (B, Hkv, "
    "Tk, D/32) along D, the axis q k^T sums over; v_block_scales (B, Hkv, Tk/32, Dv) along the "
    "keys, the axis P v sums over; e8m0 bytes; the output in the declared block_output dtype",
    "fp4_cache": "an FP4 key/value cache (FlashInfer's NVFP4 cache, MXFP4 caches): q in the "
    "call's 16- or 32-bit dtype; k and v as uint8 (B, Hkv, Tk, D/2), e2m1 two a byte, the first "
    "in the low nibble; k_block_scales (B, Hkv, Tk, D/n) and v_block_scales (B, Hkv, Tk, Dv/n) "
    "along D, each token's own; NVFP4 (n = 16, e4m3fn bytes) where the call gives the float32 "
    "k_global_scale and v_global_scale, MXFP4 (n = 32, e8m0 bytes) where it does not; the "
    "output in q's dtype",
    "mla_fp8_cache": "DeepSeek's FP8 cache of multi-head latent attention (FlashMLA): q (B, H, "
    "Tq, 576) in the call's 16- or 32-bit dtype; k and v the same uint8 cache (B, Hkv, Tk, 656), "
    "each token's bytes its 512 latent values in e4m3fn, 4 float32 scales (one per 128, little "
    "endian) and 64 rotary values in bfloat16; a key is the latent and the rotary part (D = 576), "
    'a value the latent (Dv = 512); kv_cache_layout="deepseek_v32" names the layout; the '
    "output in q's dtype",
}
BLOCK_SCALE_KEYWORDS = ("q_block_scales", "k_block_scales", "v_block_scales")
GLOBAL_SCALE_KEYWORDS = ("k_global_scale", "v_global_scale")
LAYOUT_KEYWORD = "kv_cache_layout"  # mla_fp8_cache's: the layout's name
BLOCK_KEYWORDS = BLOCK_SCALE_KEYWORDS + GLOBAL_SCALE_KEYWORDS + (LAYOUT_KEYWORD,)
# The conventions whose q is not block-scaled: a cache's, q in the call's own dtype
CACHE_CONVENTIONS = ("fp4_cache", "mla_fp8_cache")


# What a cache's page pool holds beside k and v, token by token: an FP4 cache's block scales
PAGED_SCALES = ("k_block_scales", "v_block_scales")


def unread_bytes(convention: str, fmt: str) -> dict:
    """What a page pool of a block-scaled cache holds where no item's keys are, for k, v and the
    scales that travel with them: bytes that read as NaN in the format, so that a kernel reading a
    page or a slot it does not own shows it. e2m1 has no NaN: an FP4 cache's elements hold 0
    there and its scales NaN (e8m0's 0xFF, e4m3fn's 0x7F); a latent cache's tokens are NaN in
    each part (latent, scales and rotary values)."""
    if convention == "mla_fp8_cache":
        layout = CACHE_LAYOUTS[fmt]
        latent_part, scale_part, rope_part = layout.parts
        token = np.zeros(layout.token_bytes, np.uint8)
        token[latent_part] = codes_of(np.nan, block_format(fmt).element)
        token[scale_part] = np.full(layout.scales, np.nan, "<f4").view(np.uint8)
        token[rope_part] = bfloat16_bytes(np.full(layout.rope, np.nan))
        return {"k": token, "v": token}
    spec = block_format(fmt)
    nan_scale = E8M0_NAN if spec.scale == "e8m0" else int(codes_of(np.nan, spec.scale))
    return {"k": 0, "v": 0} | dict.fromkeys(PAGED_SCALES, nan_scale)


def convention_of(fmt: str) -> str:
    """The convention a format's calls are in: an FP4 format's, a key/value cache's; a cache
    layout's, the latent cache's; an MXFP8 format's, MXFP8 attention's."""
    if fmt in CACHE_LAYOUTS:
        return "mla_fp8_cache"
    return "fp4_cache" if block_format(fmt).packed else "mx_attention"


def stored_dtypes(convention: str, fmt: str, query_dtype: str) -> tuple[str, str, str]:
    """The dtypes q, k and v reach a kernel in: the element format's (q in ``query_dtype``
    under fp4_cache), e2m1 pairs as uint8 bytes."""
    packed = block_format(fmt).packed or convention == "mla_fp8_cache"
    element = "uint8" if packed else block_format(fmt).element
    return (query_dtype if convention in CACHE_CONVENTIONS else element, element, element)


def output_dtype(convention: str, query_dtype: str, block_output: str) -> str:
    """The dtype a block-scaled call returns: the declared ``block_output`` under mx_attention,
    q's under fp4_cache."""
    return block_output if convention == "mx_attention" else query_dtype


class BlockShapeError(ValueError):
    """An axis a block does not divide, or a scale tensor of the wrong shape or dtype."""


def scale_axis(convention: str, operand: str) -> int:
    """The axis of an operand (B, heads, T, D) its scales run along: the keys for MX attention's
    v, the head dimension otherwise."""
    return 2 if (convention == "mx_attention" and operand == "v") else 3


def scale_shape(convention: str, operand: str, shape, block: int) -> tuple[int, ...]:
    """The shape of ``operand``'s block scales for an operand of (logical) ``shape``; a
    BlockShapeError naming the axis where ``block`` does not divide it."""
    axis = scale_axis(convention, operand)
    if shape[axis] % block:
        what = "keys" if axis == 2 else "head dimension"
        raise BlockShapeError(
            f"{operand}'s {what} ({shape[axis]}) is not a multiple of the block ({block}) its "
            f"scales cover in the {convention} convention"
        )
    return tuple(n // block if i == axis else n for i, n in enumerate(shape))


@dataclass(frozen=True)
class Reading:
    """How a kernel reads a block-scaled call's bytes. The default is the formats' own; each
    mistake (spec.mistakes.block_scaled) changes one field."""

    v_axis: int | None = None  # the axis v's scales are applied along; None: the convention's
    e8m0_bias: int = E8M0_BIAS
    low_first: bool = True  # e2m1's first element in the low nibble
    block: int | None = None  # the elements one scale covers; None: the format's
    global_scales: bool = True  # NVFP4's global scales applied
    scale_block_shift: int = 0  # each element takes the scale of the block this many after
    rope_as_e4m3: bool = False  # a latent cache's rotary part read as e4m3fn bytes, unscaled


@dataclass(frozen=True)
class BlockCall:
    """A block-scaled call: its stored operands (float64 values of FP8 elements, or uint8 packed
    bytes; q in its dtype under fp4_cache), the keywords carrying the scales' bytes and the
    global scales, its convention and format, and its options (causal, scale)."""

    convention: str
    fmt: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    keywords: dict
    options: dict = field(default_factory=dict, hash=False)
    # the arithmetic the implementation declares, which the baseline rounds as: where P is
    # rounded (spec.fp8.P_ROUNDINGS) and the output's dtype
    p_rounding: str = "float32"
    out_dtype: str = "float32"
    # a cache's: the page size of the pools k, v and their scales reach the kernel in (their
    # pages and slots no item owns read as NaN: unread_bytes); None: dense
    page_size: int | None = None

    @property
    def format(self) -> BlockFormat:
        return block_format(self.fmt)

    def scale_values(self, operand: str, reading: Reading) -> np.ndarray:
        codes = np.asarray(self.keywords[f"{operand}_block_scales"])
        return scale_byte_values(self.format.scale, reading.e8m0_bias)[codes.astype(np.int64)]

    def elements(self, operand: str, reading: Reading) -> np.ndarray:
        stored = getattr(self, operand)
        if self.format.packed:
            return e2m1_values(unpacked_e2m1(stored, reading.low_first))
        return np.asarray(stored, np.float64)

    def dequantized(self, reading: Reading = Reading()) -> tuple[np.ndarray, ...]:
        """q, k, v as ``reading`` reads them, float64; the truth's under the default reading."""
        if self.convention == "mla_fp8_cache":
            keys, values = decoded_tokens(self.k, CACHE_LAYOUTS[self.fmt], reading)
            return np.asarray(self.q, np.float64), keys, values
        operands = []
        for operand in "qkv":
            if operand == "q" and self.convention == "fp4_cache":
                operands.append(np.asarray(self.q, np.float64))
                continue
            elements = self.elements(operand, reading)
            axis = scale_axis(self.convention, operand)
            if operand == "v" and reading.v_axis is not None:
                axis = reading.v_axis
            block = self.format.block if reading.block is None else reading.block
            scales = self.scale_values(operand, reading)
            values = elements * expanded(scales, axis, elements.shape, block,
                                         reading.scale_block_shift)  # fmt: skip
            if self.format.global_scale and reading.global_scales:
                values = values * float(self.keywords[f"{operand}_global_scale"])
            operands.append(values)
        return tuple(operands)

    def baseline(self, reading: Reading = Reading(), operands=None, **changes) -> np.ndarray:
        """The naive formula as a block-scaled kernel rounds it, on the operands as ``reading``
        reads them (or the dequantized ``operands`` given): each block's elements times its scale
        in float32 (exact for e8m0's powers of two), q k^T and P v summed in float32, P rounded as
        the call's p_rounding says, the output in its out_dtype; ``changes`` to the call's options
        (key_lengths) or spec.fp8.fp8_baseline's arguments (p_rounding, accumulator). Float64,
        (B, H, Tq, Dv)."""
        with np.errstate(all="ignore"):
            operands = self.dequantized(reading) if operands is None else operands
            q, k, v = (x.astype(np.float32) for x in operands)
            arithmetic = dict(p_rounding=self.p_rounding, out_dtype=self.out_dtype)
            arithmetic |= self.options | changes
            return fp8_baseline(q, k, v, Fp8Scales("kv_scale", {}), **arithmetic)

    def one_head(self, batch: int, head: int, group: int) -> BlockCall:
        """Query head ``head`` of item ``batch`` alone, with its key/value head (``group`` query
        heads share one): operands and block scales sliced alike, the global scales kept."""
        items, kv = slice(batch, batch + 1), slice(head // group, head // group + 1)
        heads = {"q": slice(head, head + 1), "k": kv, "v": kv}
        keywords = dict(self.keywords)
        for operand, along in heads.items():
            if f"{operand}_block_scales" in keywords:
                keywords[f"{operand}_block_scales"] = np.asarray(
                    keywords[f"{operand}_block_scales"]
                )[items, along]
        sliced = {name: getattr(self, name)[items, along] for name, along in heads.items()}
        return replace(self, keywords=keywords, **sliced)

    def with_(self, **changes) -> BlockCall:
        return replace(self, **changes)


def expanded(scales: np.ndarray, axis: int, shape, block: int, shift: int = 0) -> np.ndarray:
    """Block scales (B, heads, ...) as a kernel applies them to elements of ``shape`` (B, heads,
    T, D): each head's scales one flat buffer, element (t, d) taking the scale at (t D + d) //
    block where they run along D (axis 3), at (t // block) D + d where they run along the keys
    (axis 2), ``shift`` blocks on. The format's own block and axis give each element its
    block's scale; another block, axis or shift reads the buffer as a kernel with that mistake
    does (past its end: its last scale)."""
    flat = scales.reshape(*scales.shape[:2], -1)
    tokens, width = shape[2], shape[3]
    t, d = np.arange(tokens)[:, None], np.arange(width)[None, :]
    if axis == 3:
        index = (t * width + d) // block + shift
    else:
        index = (t // block) * width + d + shift * width
    return flat[..., np.clip(index, 0, flat.shape[-1] - 1)]


# --- the recipes callers quantize with ----------------------------------------------------------


def quantize_blocks(x, fmt: BlockFormat, axis: int, global_dequant: float = 1.0):
    """``x`` (float64) quantized in blocks of ``fmt.block`` along ``axis``: (the element values,
    float64; the scale bytes, uint8). MX's recipe as cuBLAS and TransformerEngine round it: the
    scale the power of two 2^ceil(log2(amax / the element's largest)), so that no element
    saturates (OCP MX v1.0's floor of log2 amax leaves a block's largest values past the format's
    largest), a block of zeros 2^-127; NVFP4's: the block's amax / 6 over the global scale,
    rounded to e4m3fn."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    blocks = x.reshape(*x.shape[:-1], -1, fmt.block)
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    if fmt.scale == "e8m0":
        with np.errstate(divide="ignore"):
            exponent = np.where(amax > 0, np.ceil(np.log2(amax / fmt.element_largest)), -E8M0_BIAS)
        exponent = np.clip(exponent, -E8M0_BIAS, E8M0_BIAS)
        scale, codes = np.exp2(exponent), e8m0_codes(exponent)
    else:
        largest = fp8_format(fmt.scale).largest_finite
        scale = round_to_fp8(np.minimum(amax / fmt.element_largest / global_dequant, largest),
                             fmt.scale)  # fmt: skip
        codes = codes_of(scale, fmt.scale)
        scale = scale * global_dequant
    with np.errstate(invalid="ignore", divide="ignore"):
        divided = blocks / np.where(scale > 0, scale, 1)
        elements = fmt.round_elements(np.where(scale > 0, divided, 0))
    elements = np.moveaxis(elements.reshape(x.shape), -1, axis)
    return elements, np.moveaxis(codes[..., 0], -1, axis)


def nvfp4_global_scale(x) -> float:
    """NVFP4's global scale of a tensor, a float32 multiplier that dequantizes: amax / (6 * 448),
    so that the largest block scale is e4m3fn's largest value."""
    amax = float(np.max(np.abs(x), initial=0.0))
    return float(np.float32(amax / (E2M1_LARGEST * 448.0))) if amax > 0 else 1.0


def quantize_call(q, k, v, convention: str, fmt: str, query_dtype: str | None = None,
                  options: dict | None = None) -> BlockCall:  # fmt: skip
    """Model values q (B, H, Tq, D), k and v (B, Hkv, Tk, D) quantized as callers of a kernel in
    ``convention`` quantize them; under a cache's convention q rounded to ``query_dtype``.
    A latent cache (mla_fp8_cache) holds v as each token's latent and k's last D - Dv values as
    its rotary part: the call's keys are v's values and those (k's first Dv are not stored)."""
    spec = block_format(fmt)
    keywords, stored = {}, {}
    if convention == "mla_fp8_cache":
        cache = encoded_tokens(v, k[..., v.shape[-1] :], CACHE_LAYOUTS[fmt])
        return BlockCall(convention, fmt, round_to(q, query_dtype), cache, cache,
                         {LAYOUT_KEYWORD: fmt}, dict(options or {}))  # fmt: skip
    for operand, x in zip("qkv", (q, k, v), strict=True):
        if operand == "q" and convention == "fp4_cache":
            stored["q"] = round_to(q, query_dtype)
            continue
        scale_shape(convention, operand, x.shape, spec.block)  # the block divides the axis
        global_dequant = nvfp4_global_scale(x) if spec.global_scale else 1.0
        elements, codes = quantize_blocks(x, spec, scale_axis(convention, operand),
                                          global_dequant)  # fmt: skip
        stored[operand] = packed_e2m1(e2m1_codes(elements)) if spec.packed else elements
        keywords[f"{operand}_block_scales"] = codes
        if spec.global_scale:
            keywords[f"{operand}_global_scale"] = np.float32(global_dequant)
    return BlockCall(convention, fmt, stored["q"], stored["k"], stored["v"], keywords,
                     dict(options or {}))  # fmt: skip


# --- a latent cache's tokens: each one run of bytes -----------------------------------------------

# FlashMLA's recipe floors a block's amax at this before its power-of-two scale
LATENT_AMAX_FLOOR = 1e-4


def bfloat16_bytes(values) -> np.ndarray:
    """(..., 2 n) uint8: ``values`` (..., n) rounded to bfloat16, each little-endian."""
    rounded = np.asarray(round_to(np.asarray(values, np.float64), "bfloat16"), np.float32)
    return (rounded.view(np.uint32) >> 16).astype("<u2").view(np.uint8)


def bfloat16_of_bytes(raw) -> np.ndarray:
    """(..., n) float64: the bfloat16 values of little-endian bytes (..., 2 n)."""
    bits = np.ascontiguousarray(raw).view("<u2").astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def encoded_tokens(latent, rope, layout: CacheLayout) -> np.ndarray:
    """(B, Hkv, T, token_bytes) uint8: each token's ``latent`` (B, Hkv, T, latent) quantized in
    blocks with the power-of-two float32 scale 2^ceil(log2(amax / 448)) (amax floored at
    :data:`LATENT_AMAX_FLOOR`), as FlashMLA quantizes it, then its ``rope`` in bfloat16."""
    fmt = block_format(layout.format)
    latent = np.asarray(latent, np.float64)
    blocks = latent.reshape(*latent.shape[:-1], layout.scales, fmt.block)
    amax = np.maximum(np.max(np.abs(blocks), axis=-1, keepdims=True), LATENT_AMAX_FLOOR)
    scales = np.exp2(np.ceil(np.log2(amax / fmt.element_largest)))
    elements = fmt.round_elements(blocks / scales).reshape(latent.shape)
    parts = [
        codes_of(elements, fmt.element),
        scales[..., 0].astype("<f4").view(np.uint8),
        bfloat16_bytes(rope),
    ]
    return np.concatenate(parts, axis=-1)


def decoded_tokens(cache, layout: CacheLayout, reading: Reading = Reading()):
    """(keys (..., latent + rope), values (..., latent)), float64, of a latent cache's bytes
    (..., token_bytes) as ``reading`` reads them: each latent element times its block's scale,
    then the rotary part (bfloat16; e4m3fn bytes under ``reading.rope_as_e4m3``)."""
    fmt = block_format(layout.format)
    cache = np.asarray(cache)
    latent_part, scale_part, rope_part = layout.parts
    scales = np.ascontiguousarray(cache[..., scale_part]).view("<f4").astype(np.float64)
    elements = values_of_bytes(fmt.element)[cache[..., latent_part].astype(np.int64)]
    block = fmt.block if reading.block is None else reading.block
    index = np.arange(layout.latent) // block + reading.scale_block_shift
    latent = elements * scales[..., np.clip(index, 0, layout.scales - 1)]
    rope_bytes = cache[..., rope_part]
    if reading.rope_as_e4m3:
        rope = values_of_bytes(fmt.element)[rope_bytes[..., : layout.rope].astype(np.int64)]
    else:
        rope = bfloat16_of_bytes(rope_bytes)
    return np.concatenate([latent, rope], axis=-1), latent
