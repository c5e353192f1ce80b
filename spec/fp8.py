"""FP8 as serving kernels run attention: the formats, the two conventions their scales follow,
the quantisation recipes their callers use, and the points where a kernel rounds.

The true inputs are the dequantized values, float(x) * scale, and the truth is the float64
formula on them (:func:`spec.formula.reference_attention`): a scale dropped, applied twice or read
from the wrong head is then an O(1) error, apart from rounding, whatever the cosine says. The
budget's baseline is the naive formula rounded where the kernel declares it rounds
(:func:`fp8_baseline`), as every other budget of the suite is the naive formula in the dtype.

The formats are rounded here, in NumPy, from their definitions (no library needed to judge), and
checked against ml_dtypes, the package JAX uses, by the project's tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec.dtypes import round_to, rounded_in_storage
from spec.formula import repeat_kv_heads, resolve_scale, visible_keys


@dataclass(frozen=True)
class Fp8Format:
    name: str
    exponent_bias: int
    mantissa_bits: int
    largest_finite: float
    overflow: str  # what a value rounding past largest_finite becomes: "inf" or "nan"
    description: str

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.exponent_bias)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.exponent_bias - self.mantissa_bits)


FP8_FORMATS: dict[str, Fp8Format] = {
    fmt.name: fmt
    for fmt in (
        Fp8Format(
            "float8_e4m3fn", 7, 3, 448.0, "nan",
            "4 exponent bits, 3 mantissa bits, no infinity: 448 is the largest value, and a "
            "value rounding past it is NaN (OCP's E4M3; FlashAttention 3, FlashInfer, vLLM)",
        ),
        Fp8Format(
            "float8_e5m2", 15, 2, 57344.0, "inf",
            "5 exponent bits, 2 mantissa bits, IEEE-like with infinities (OCP's E5M2)",
        ),
        Fp8Format(
            "float8_e4m3fnuz", 8, 3, 240.0, "nan",
            "as e4m3fn with an exponent bias of 8, no negative zero, one NaN (AMD's MI300): "
            "the same bytes read as e4m3fn are values halved",
        ),
        Fp8Format(
            "float8_e5m2fnuz", 16, 2, 57344.0, "nan",
            "as e5m2 with an exponent bias of 16, no infinity or negative zero (AMD's MI300)",
        ),
    )
}  # fmt: skip


def fp8_format(name: str) -> Fp8Format:
    if name not in FP8_FORMATS:
        raise ValueError(f"fp8 format={name!r}, but should be one of {', '.join(FP8_FORMATS)}")
    return FP8_FORMATS[name]


def round_to_grid(values, smallest_normal: float, mantissa_bits: int) -> np.ndarray:
    """``values`` rounded to the nearest value of a binary format with ``mantissa_bits`` stored
    mantissa bits whose smallest normal value is ``smallest_normal`` (ties to even, subnormals
    kept, no largest value: the caller decides what lies past it), as float64."""
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log2(np.maximum(np.abs(x), smallest_normal)))
        quantum = np.exp2(exponent - mantissa_bits)  # the spacing of values near x
        rounded = np.round(x / quantum) * quantum  # numpy rounds half to even
    return np.where(np.isfinite(x), rounded, x)


def round_to_fp8(values, name: str) -> np.ndarray:
    """``values`` rounded to the FP8 format ``name`` (to nearest, ties to even, subnormals kept),
    as float64; past the largest finite value, inf or NaN as the format has it."""
    fmt = fp8_format(name)
    x = np.asarray(values, dtype=np.float64)
    rounded = round_to_grid(x, fmt.smallest_normal, fmt.mantissa_bits)
    past = np.abs(rounded) > fmt.largest_finite
    if fmt.overflow == "inf":
        rounded = np.where(past, np.copysign(np.inf, x), rounded)
    else:
        rounded = np.where(past | np.isinf(x), np.nan, rounded)
    if fmt.name.endswith("fnuz"):
        rounded = np.where(rounded == 0, 0.0, rounded)  # no negative zero
    return rounded


def values_of_bytes(name: str) -> np.ndarray:
    """(256,) float64: the value each byte holds in the format ``name`` (NaN for its NaNs): sign,
    exponent and mantissa fields, subnormal where the exponent field is 0."""
    fmt = fp8_format(name)
    exponent_bits = 7 - fmt.mantissa_bits
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> fmt.mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = codes & ((1 << fmt.mantissa_bits) - 1)
    fraction = mantissa / (1 << fmt.mantissa_bits)
    values = sign * np.where(
        exponent == 0,
        fraction * 2.0 ** (1 - fmt.exponent_bias),
        (1 + fraction) * np.exp2(exponent - fmt.exponent_bias),
    )
    top = exponent == (1 << exponent_bits) - 1
    if name.endswith("fnuz"):
        values[0x80] = np.nan  # the one NaN, where negative zero would be
    elif fmt.overflow == "inf":  # e5m2: IEEE's infinities and NaNs in the top exponent
        values = np.where(top & (mantissa == 0), sign * np.inf, values)
        values = np.where(top & (mantissa != 0), np.nan, values)
    else:  # e4m3fn: the top exponent holds values, but for the all-ones mantissa
        values = np.where(top & (mantissa == (1 << fmt.mantissa_bits) - 1), np.nan, values)
    return values


def codes_of(values, name: str) -> np.ndarray:
    """The bytes (uint8) holding FP8 ``values`` (float64, exact in ``name``; NaN as the format's
    first NaN, negative zero as 0x80)."""
    table = values_of_bytes(name)
    finite = np.where(np.isnan(table), np.inf, table)
    x = np.asarray(values, np.float64)
    order = np.argsort(finite, kind="stable")
    codes = order[np.clip(np.searchsorted(finite[order], x), 0, 255)]
    codes = np.where((x == 0) & np.signbit(x), 0x80, codes)  # negative zero's byte
    codes = np.where(np.isnan(x), int(np.flatnonzero(np.isnan(table))[0]), codes)
    return codes.astype(np.uint8)


def reinterpreted(values, written: str, read: str) -> np.ndarray:
    """FP8 ``values`` (float64, exact in ``written``) stored as ``written``'s bytes and read as
    ``read``'s: what a kernel that misreads the format sees."""
    return values_of_bytes(read)[codes_of(values, written)]


def ml_dtypes_missing() -> str | None:
    """Why NumPy arrays cannot hold FP8 here (ml_dtypes, which gives NumPy its FP8 dtypes, is not
    installed), or None."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return "NumPy's FP8 dtypes come from ml_dtypes, which is not installed"
    return None


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype (ml_dtypes') of the FP8 format ``name``, or of bfloat16 (a query's under
    the key/value cache's convention); ImportError naming ml_dtypes."""
    if name != "bfloat16":
        fp8_format(name)
    reason = ml_dtypes_missing()
    if reason:
        raise ImportError(reason)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


# --- the conventions of the scales --------------------------------------------------------------

FP8_CONVENTIONS: dict[str, str] = {
    "descale": "FlashAttention 3's: q, k and v in FP8 with float32 q_descale, k_descale and "
    "v_descale of shape (B, Hkv), multipliers that dequantize; query head h reads its kv head's "
    "h // g ('(b, h_k), not (b, h)'); the output in the declared fp8_output dtype",
    "kv_scale": "the key/value cache's (FlashInfer, vLLM, SGLang): q in the call's 16- or 32-bit "
    "dtype, k and v in FP8 with k_scale and v_scale, multipliers that dequantize, a float32 "
    "scalar per tensor or a float32 (Hkv,) array per kv head; the output in q's dtype",
}
# the call's keyword arguments of each convention
SCALE_KEYWORDS: dict[str, tuple[str, ...]] = {
    "descale": ("q_descale", "k_descale", "v_descale"),
    "kv_scale": ("k_scale", "v_scale"),
}
# how fine the key/value cache's scales are
KV_SCALE_GRANULARITIES: dict[str, str] = {
    "tensor": "one float32 scalar for all of k (and one for v): vLLM's k_scale, v_scale",
    "kv_head": "a float32 (Hkv,) array, one per kv head: FlashInfer's, SGLang's per-head scales",
}

# Where a kernel rounds P, the softmax's weights, before the PV product. The scores are summed
# in float32 and so is PV (a narrower accumulator is a bug, not a choice), and the output is
# rounded to its dtype: those points are the same in every FP8 kernel.
P_ROUNDINGS: dict[str, str] = {
    "float32": "P kept in float32 (dequantize, then attention in float32)",
    "bfloat16": "P rounded to bfloat16 for a 16-bit PV product",
    "e4m3": "P rounded to e4m3fn as it is: weights below 2^-10 of the row's largest become 0",
    "e4m3_offset8": "P * 2^8 rounded to e4m3fn and the 2^8 divided out after PV, so that small "
    "weights stay normal (FlashAttention 3)",
}
# What an implementation does with a NaN stored in an FP8 operand (Capabilities.fp8_nan)
NAN_HANDLINGS: dict[str, str] = {
    "propagate": "the formula's: every output that reads the NaN is NaN, and every other output "
    "is as it would be (FP8-NAN holds it)",
    "unspecified": "not declared: the outputs that read a NaN may be anything (FP8-NAN skipped)",
}
P_OFFSET_EXPONENT = 8  # e4m3_offset8's
ACCUMULATED_KEYS = 16  # the keys one tensor-core instruction sums into its accumulator


def round_p(weights: np.ndarray, p_rounding: str) -> np.ndarray:
    """``weights`` (float32, in [0, 1]) rounded as ``p_rounding`` declares, float32 out; the
    offset divided out again, which is exact."""
    if p_rounding == "float32":
        return weights
    if p_rounding == "bfloat16":
        return rounded_in_storage(weights, "bfloat16")
    offset = 2.0**P_OFFSET_EXPONENT if p_rounding == "e4m3_offset8" else 1.0
    if p_rounding not in ("e4m3", "e4m3_offset8"):
        raise ValueError(
            f"P rounding {p_rounding!r}, but should be one of {', '.join(P_ROUNDINGS)}"
        )
    return (round_to_fp8(weights * offset, "float8_e4m3fn") / offset).astype(np.float32)


@dataclass(frozen=True)
class Fp8Scales:
    """The scales of one FP8 call in its convention, as the call's keywords carry them."""

    convention: str
    keywords: dict  # SCALE_KEYWORDS[convention] -> a float or a float32 array
    # the kv head whose scales each query head takes; None: its own, h // g (only a mistake
    # takes another's: spec.mistakes.fp8)
    scale_heads: tuple[int, ...] | None = None

    def per_batch_kv_head(self, operand: str, batch: int, kv_heads: int) -> np.ndarray:
        """The multiplier of ``operand`` ("q", "k" or "v") per (b, h_kv), float64 (B, Hkv): 1
        for a query in its own dtype."""
        name = f"{operand}_descale" if self.convention == "descale" else f"{operand}_scale"
        if name not in self.keywords:
            return np.ones((batch, kv_heads))
        scale = np.asarray(self.keywords[name], np.float64)
        return np.broadcast_to(scale, (batch, kv_heads)) if scale.ndim < 2 else scale

    def per_query_head(self, operand: str, batch: int, heads: int, kv_heads: int) -> np.ndarray:
        """The multiplier of ``operand`` as query head h applies it, float64 (B, H)."""
        table = self.per_batch_kv_head(operand, batch, kv_heads)
        if self.scale_heads is None:
            return np.repeat(table, heads // kv_heads, axis=1)  # (B, Hkv) -> (B, H)
        return table[:, list(self.scale_heads)]

    def applied(self, operand: str, q, k, kv_heads: int | None = None) -> np.ndarray:
        """:meth:`per_query_head` for a call of q (B, H, ...) and k (B, Hkv, ...), or ``kv_heads``
        where k is a page pool, as a kernel multiplies by it: float32 (B, H, 1, 1)."""
        kv_heads = k.shape[1] if kv_heads is None else kv_heads
        table = self.per_query_head(operand, q.shape[0], q.shape[1], kv_heads)
        return table.astype(np.float32)[:, :, None, None]


def output_dtype(convention: str, q_dtype: str, fp8_output: str) -> str:
    """The dtype an FP8 call returns: q's under the key/value cache's convention, the declared
    ``fp8_output`` under FlashAttention 3's."""
    return q_dtype if convention == "kv_scale" else fp8_output


def dequantized(q, k, v, scales: Fp8Scales) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The true inputs, float64: each FP8 operand (its values as float64) times its scale, query
    head h taking kv head h // g's."""
    batch, heads, kv_heads = q.shape[0], q.shape[1], k.shape[1]
    q_scale = scales.per_query_head("q", batch, heads, kv_heads)  # (B, H)
    k_scale, v_scale = (scales.per_batch_kv_head(x, batch, kv_heads) for x in "kv")  # (B, Hkv)
    return tuple(
        np.asarray(x, np.float64) * table[:, :, None, None]
        for x, table in ((q, q_scale), (k, k_scale), (v, v_scale))
    )


def fp8_baseline(
    q, k, v, scales: Fp8Scales, *, p_rounding: str, out_dtype: str, causal=True, scale=None,
    accumulator: str = "float32", **variant,
) -> np.ndarray:  # fmt: skip
    """The naive formula as an FP8 kernel rounds it: q k^T of the stored values summed in
    float32, then times the scale and the operands' scales; the softmax in float32, P rounded as
    ``p_rounding`` declares, P v summed in float32 and times v's scale; the output rounded to
    ``out_dtype``. P kept in float32 is a kernel that dequantizes first: each value times its
    scale in float32, then the formula in float32. Float64 out, (B, H, Tq, Dv).
    ``accumulator``: where P v is summed, a tensor core's 16 keys at a time (only a mistake sums
    narrower than float32)."""

    q32, k32, v32 = (np.asarray(x, np.float32) for x in (q, k, v))  # exact: FP8 values
    k32, v32 = repeat_kv_heads(q32, k32), repeat_kv_heads(q32, v32)  # (B, Hq, Tk, D)
    one = np.ones((1, 1, 1, 1), np.float32)
    if p_rounding == "float32":  # dequantized first: each value times its scale, in float32
        q32, k32, v32 = (
            x * scales.applied(name, q, k) for x, name in zip((q32, k32, v32), "qkv", strict=True)
        )
        q_scale = k_scale = v_scale = one
    else:  # the scales on the scores and the output
        q_scale, k_scale, v_scale = (scales.applied(name, q, k) for name in "qkv")
    scores = q32 @ k32.swapaxes(-1, -2)  # (B, Hq, Tq, Tk), float32 sums
    scores *= np.float32(resolve_scale(scale, q.shape[-1])) * q_scale
    scores *= k_scale
    seen = visible_keys(q.shape[-2], k.shape[-2], causal=causal, **variant)
    scores = np.where(seen, scores, np.float32(-np.inf))
    top = scores.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - np.where(np.isfinite(top), top, 0)).astype(np.float32)
    total = weights.sum(axis=-1, keepdims=True, dtype=np.float32)
    weights = round_p(weights, p_rounding)
    if accumulator == "float32":
        out = weights @ v32  # float32 sums
    else:
        out = np.zeros((*weights.shape[:-1], v32.shape[-1]), np.float32)  # (B, H, Tq, Dv)
        for start in range(0, weights.shape[-1], ACCUMULATED_KEYS):
            keys = slice(start, start + ACCUMULATED_KEYS)
            out = rounded_in_storage(out + weights[..., keys] @ v32[..., keys, :], accumulator)
    out = out * v_scale
    with np.errstate(invalid="ignore", divide="ignore"):  # a row that read a NaN stays NaN
        out = np.where(total == 0, 0, out / np.where(total == 0, 1, total)).astype(np.float32)
    return rounded_in_storage(out, out_dtype).astype(np.float64)


# --- the quantisation recipes callers use -------------------------------------------------------


def quantize_per_tensor(x, fmt: str) -> tuple[np.ndarray, float]:
    """vLLM's per-tensor recipe: scale = amax / largest finite (a float32), x / scale rounded to
    ``fmt``. Returns the FP8 values (float64) and the scale, a multiplier that dequantizes."""
    amax = float(np.max(np.abs(x), initial=0.0))
    scale = float(np.float32(amax / fp8_format(fmt).largest_finite)) if amax > 0 else 1.0
    return round_to_fp8(np.asarray(x, np.float64) / scale, fmt), scale


def quantize_per_kv_head(x, fmt: str, *, per_batch: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The per-head recipe of (B, Hkv, T, D) ``x``: one scale per kv head (Hkv,), FlashInfer's and
    SGLang's, or with ``per_batch`` per (b, h_kv), FlashAttention 3's descales (B, Hkv); float32
    scales of amax / largest finite, as multipliers that dequantize."""
    x = np.asarray(x, np.float64)
    axes = (2, 3) if per_batch else (0, 2, 3)
    amax = np.max(np.abs(x), axis=axes)  # (B, Hkv) or (Hkv,)
    scale = np.where(amax > 0, amax / fp8_format(fmt).largest_finite, 1.0).astype(np.float32)
    shaped = scale[:, :, None, None] if per_batch else scale[None, :, None, None]
    return round_to_fp8(x / shaped.astype(np.float64), fmt), scale


def quantize_call(q, k, v, fmt: str, convention: str, kv_scale: str | None = None,
                  query_dtype: str | None = None):  # fmt: skip
    """Model values q (B, Hq, Tq, D), k and v (B, Hkv, Tk, D) quantized as callers of a kernel in
    ``convention`` quantize them: per (b, h_kv) descales under FlashAttention 3's (q's heads
    grouped by their kv head); k and v per tensor or per kv head (``kv_scale``) under the
    key/value cache's, q then rounded to ``query_dtype``. Returns the stored q, k, v (float64,
    exact in their dtypes) and their Fp8Scales."""
    if convention == "descale":
        batch, kv_heads = k.shape[:2]
        grouped = q.reshape(batch, kv_heads, -1, q.shape[-1])  # (B, Hq, Tq, D) -> (B, Hkv, g Tq, D)
        stored_q, q_descale = quantize_per_kv_head(grouped, fmt, per_batch=True)
        (stored_k, k_descale), (stored_v, v_descale) = (
            quantize_per_kv_head(x, fmt, per_batch=True) for x in (k, v)
        )
        keywords = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        return stored_q.reshape(q.shape), stored_k, stored_v, Fp8Scales("descale", keywords)
    if kv_scale not in KV_SCALE_GRANULARITIES:
        raise ValueError(
            f"kv_scale={kv_scale!r}, but should be one of {', '.join(KV_SCALE_GRANULARITIES)}"
        )
    recipe = quantize_per_tensor if kv_scale == "tensor" else quantize_per_kv_head
    (stored_k, k_scale), (stored_v, v_scale) = (recipe(x, fmt) for x in (k, v))
    keywords = dict(k_scale=np.float32(k_scale), v_scale=np.float32(v_scale))  # as vLLM's
    return round_to(q, query_dtype), stored_k, stored_v, Fp8Scales("kv_scale", keywords)
