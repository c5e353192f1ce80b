"""The mistakes of FP8 kernels: the scales' plumbing, the format the bytes are read in, and where
the kernel rounds, as public reports of serving kernels found them. Each is a variant of the
naive FP8 formula (:func:`spec.fp8.fp8_baseline`) with one thing wrong, in the arithmetic the
kernel declares, so that a failing output is named by the variant it matches within its budget
(``conformance/judge/fp8.py``); they are the fp8 family of :mod:`spec.mistakes`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from spec.fp8 import FP8_FORMATS, Fp8Scales, fp8_baseline, reinterpreted
from spec.mistakes.registry import Family, mistake


@dataclass(frozen=True)
class Fp8Call:
    """An FP8 call: its stored values (float64), scales, format, options (causal, scale) and the
    arithmetic the implementation declares."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scales: Fp8Scales
    fmt: str
    p_rounding: str
    out_dtype: str
    options: dict = field(default_factory=dict, hash=False)

    def baseline(self, **changes) -> np.ndarray:
        """:func:`fp8_baseline` of this call with ``changes`` (q, k, v, scales, p_rounding,
        accumulator)."""
        arguments = dict(q=self.q, k=self.k, v=self.v, scales=self.scales,
                         p_rounding=self.p_rounding, out_dtype=self.out_dtype)  # fmt: skip
        arguments |= changes
        with np.errstate(all="ignore"):
            return fp8_baseline(**arguments, **self.options)

    def scale_name(self, operand: str) -> str:
        suffix = "_descale" if self.scales.convention == "descale" else "_scale"
        return operand + suffix

    def with_scale(self, operand: str, change: Callable) -> Fp8Scales:
        """The scales with ``operand``'s replaced by ``change(its (B, Hkv) table)``."""
        batch, kv_heads = self.k.shape[:2]
        table = self.scales.per_batch_kv_head(operand, batch, kv_heads)
        keywords = {**self.scales.keywords, self.scale_name(operand): change(table)}
        return replace(self.scales, keywords=keywords)

    def scaled_operands(self) -> list[str]:
        """The operands whose scale is not 1 everywhere."""
        batch, kv_heads = self.k.shape[:2]
        return [
            operand
            for operand in "qkv"
            if self.scale_name(operand) in self.scales.keywords
            and np.any(self.scales.per_batch_kv_head(operand, batch, kv_heads) != 1)
        ]


def fp8_operands(call: Fp8Call) -> str:
    """The operands stored in FP8: all three under the descales, k and v under the key/value
    cache's scales."""
    return "qkv" if call.scales.convention == "descale" else "kv"


def fp8_mistake(name: str, text: str, hint: str, shows: Callable):
    """Register the decorated variant (Fp8Call -> the output, float64) as FP8 mistake ``name``."""
    return mistake(Family.FP8, name, text, hint, shows)


for _operand in "qkv":

    def _dropped(call: Fp8Call, operand=_operand) -> np.ndarray:
        return call.baseline(scales=call.with_scale(operand, np.ones_like))

    def _twice(call: Fp8Call, operand=_operand) -> np.ndarray:
        return call.baseline(scales=call.with_scale(operand, np.square))

    def _shows(call: Fp8Call, operand=_operand) -> bool:
        return operand in call.scaled_operands()

    fp8_mistake(
        f"fp8-{_operand}-scale-dropped",
        f"{_operand}'s scale never reaches the output: the stored values taken as the true ones",
        "a wrapper that does not pass the scale on (FlashInfer #4979, SGLang #5700, TensorRT-LLM "
        "PR #16916)",
        _shows,
    )(_dropped)
    fp8_mistake(
        f"fp8-{_operand}-scale-twice",
        f"{_operand}'s scale applied twice: once when the values are loaded, once on the result",
        "a scale folded into the softmax scale by the caller and applied again by the kernel "
        "(SGLang PR #34765)",
        _shows,
    )(_twice)


def _table_varies(call: Fp8Call, axis: int) -> bool:
    batch, kv_heads = call.k.shape[:2]
    return any(
        np.ptp(call.scales.per_batch_kv_head(operand, batch, kv_heads), axis=axis).max() > 0
        for operand in call.scaled_operands()
    )


@fp8_mistake(
    "fp8-scale-by-query-head",
    "the per-head scale table read with the query head's index, wrapped to the kv heads (h % Hkv), "
    "not its kv head's (h // g)",
    "a table of shape (B, Hkv) indexed as if it were (B, H) (ROCm CK PR #10474)",
    lambda call: call.q.shape[1] != call.k.shape[1] and _table_varies(call, axis=1),
)
def _scale_by_query_head(call: Fp8Call) -> np.ndarray:
    heads, kv_heads = call.q.shape[1], call.k.shape[1]
    wrapped = tuple(int(h) for h in np.arange(heads) % kv_heads)  # (H,): h % Hkv
    return call.baseline(scales=replace(call.scales, scale_heads=wrapped))


@fp8_mistake(
    "fp8-scale-without-batch",
    "the descale table read without its batch term: item 0's scales for every item",
    "a (B, Hkv) table indexed by the kv head alone (ROCm CK PR #10474)",
    lambda call: call.scales.convention == "descale" and _table_varies(call, axis=0),
)
def _scale_without_batch(call: Fp8Call) -> np.ndarray:
    scales = call.scales
    for operand in call.scaled_operands():
        scales = replace(call, scales=scales).with_scale(
            operand, lambda table: np.broadcast_to(table[:1], table.shape)
        )
    return call.baseline(scales=scales)


for _read in FP8_FORMATS:

    def _misread(call: Fp8Call, read=_read) -> np.ndarray:
        operands = {
            name: reinterpreted(getattr(call, name), call.fmt, read) for name in fp8_operands(call)
        }
        return call.baseline(**operands)

    fp8_mistake(
        f"fp8-read-as-{_read.removeprefix('float8_')}",
        f"the FP8 bytes read as {_read}, whatever their format",
        "a dtype view or a kernel built for one format (vLLM PR #54341: e4m3 read as e5m2; "
        "vLLM #45562: e4m3fn as e4m3fnuz, every value halved)",
        lambda call, read=_read: call.fmt != read,
    )(_misread)


# The number a NaN byte would be without its format's NaN encoding, as a hand-written decoder
# reads it: e4m3fn's S.1111.111 as an IEEE-style e4m3 decodes it (1.875 x 2^8); e5m2's NaN 0x7E
# with exponent 31 taken as finite (1.5 x 2^16); the fnuz pair's 0x80 as negative zero
NAN_BYTE_AS_NUMBER = {
    "float8_e4m3fn": 480.0, "float8_e5m2": 98304.0, "float8_e4m3fnuz": 0.0, "float8_e5m2fnuz": 0.0,
}  # fmt: skip


@fp8_mistake(
    "fp8-nan-as-a-number",
    "a NaN stored in an FP8 operand read as the number its bits would be without the format's NaN "
    "(e4m3fn's 0x7F as 480, the fnuz pair's 0x80 as 0)",
    "a hand-written decoder (a lookup table, or bit shifts into a float32) without the format's "
    "special values",
    lambda call: any(np.isnan(getattr(call, name)).any() for name in fp8_operands(call)),
)
def _nan_as_a_number(call: Fp8Call) -> np.ndarray:
    number = NAN_BYTE_AS_NUMBER[call.fmt]
    return call.baseline(**{
        name: np.where(np.isnan(getattr(call, name)), number, getattr(call, name))
        for name in fp8_operands(call)
    })  # fmt: skip


@fp8_mistake(
    "fp8-p-without-offset",
    "P rounded to e4m3 as it is, where the kernel declares it scaled by 2^8 first: a long row's "
    "small weights fall to subnormals or 0",
    "the offset that keeps P's small weights normal left out (ROCm aiter PR #5642)",
    lambda call: call.p_rounding in ("e4m3_offset8", "float32", "bfloat16"),
)
def _p_without_offset(call: Fp8Call) -> np.ndarray:
    return call.baseline(p_rounding="e4m3")


@fp8_mistake(
    "fp8-narrow-accumulator",
    "P v summed in bfloat16, 16 keys at a time, not in float32",
    "an MMA whose accumulator is the inputs' 16-bit type (FlashAttention PR #2250)",
    lambda call: True,
)
def _narrow_accumulator(call: Fp8Call) -> np.ndarray:
    return call.baseline(accumulator="bfloat16")
