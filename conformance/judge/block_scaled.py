"""The judge of block-scaled calls (spec.block_scaled): inputs drawn so that blocks differ and
quantized as callers quantize them, the call in its convention, and the output against the
float64 formula on the dequantized inputs.

The budget is FP8's rule (conformance.judge.fp8.fp8_budget) with the baseline the block-scaled
kernel's own: the naive formula on the blocks' values, P rounded where the implementation declares
(Capabilities.block_p), sums in float32 and the output in its dtype. A failure is named by the
block-scaled mistake (spec.mistakes.block_scaled) it matches, and says its norm's ratio to the
truth's: a scale lost shows there, where the cosine stays 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.diagnosis import diagnose_block
from conformance.judge.fp8 import (
    checked_output,
    compare_dequantized,
    fp8_budget,
    held_to_budget,
)
from conformance.judge.harness import Case, Subject
from spec.block_scaled import (
    BLOCK_FORMATS,
    BlockCall,
    block_format,
    output_dtype,
    quantize_call,
    scale_axis,
    stored_dtypes,
)
from spec.fp8 import ml_dtypes_missing

# Each declared convention with the formats it takes: MXFP8 for attention, FP4 for the cache
CONVENTION_FORMATS = {
    "mx_attention": [f.name for f in BLOCK_FORMATS.values() if not f.packed],
    "fp4_cache": [f.name for f in BLOCK_FORMATS.values() if f.packed],
}
BLOCK_CASES = [
    pytest.param(convention, fmt, id=f"{convention}-{fmt}")
    for convention, formats in CONVENTION_FORMATS.items()
    for fmt in formats
]
QUERY_DTYPES = ("bfloat16", "float16", "float32")  # fp4_cache's q: the narrowest declared
BLOCK_SPREAD = 8  # per-block magnitudes over 2^-8 .. 2^8


def block_case(subject: Subject, convention: str, fmt: str, **shape) -> Case:
    """A case of ``shape`` in a block-scaled convention and format, grouped heads where the
    implementation declares them; q's dtype the element format's under mx_attention."""
    caps = subject.client.capabilities
    if convention == "mx_attention":
        dtype = block_format(fmt).element
    else:
        dtype = next((d for d in QUERY_DTYPES if d in caps.fp8_queries), QUERY_DTYPES[-1])
    case = Case(dtype=dtype, block_convention=convention, block_format=fmt, **shape)
    if caps.gqa and case.kv_heads is None:
        case = case.with_(kv_heads=case.heads // 2)
    case = subject.fit(case)
    subject.require(case)
    if subject.client.family == "numpy" and ml_dtypes_missing():
        pytest.skip(f"{subject.name}: {ml_dtypes_missing()}")
    return case


def declared_call(subject: Subject, case: Case, q, k, v) -> BlockCall:
    """Model values quantized as the case's convention's callers do, with the arithmetic the
    implementation declares."""
    caps = subject.client.capabilities
    call = quantize_call(q, k, v, case.block_convention, case.block_format, case.dtype,
                         dict(causal=case.causal, scale=case.scale))  # fmt: skip
    out_dtype = output_dtype(case.block_convention, case.dtype, caps.block_output)
    return call.with_(p_rounding=caps.block_p, out_dtype=out_dtype)


def block_magnitudes(subject: Subject, shape, axis: int, block: int, spread: float) -> np.ndarray:
    """2^e per block of ``block`` along ``axis`` of ``shape``, e uniform in [-spread, spread],
    repeated over each block's elements."""
    blocked = list(shape)
    blocked[axis] //= block
    exponents = subject.rng.uniform(-spread, spread, blocked)
    return np.repeat(2.0**exponents, block, axis=axis)


def spread_draw(subject: Subject, case: Case):
    """q, k and v whose blocks differ: every block of q and k along D at its own magnitude over
    2^+-8 (q's block c and k's block c scaled inversely, with a jitter of 2^+-2 per token, so
    that the scores stay of order 1 while a scale taken from the neighbouring block is off by a
    large factor; q's too under fp4_cache, where q is not quantized), v's blocks over 2^+-3
    along their own axis; k's first block of key 1 all zeros."""
    fmt = block_format(case.block_format)
    rng = subject.rng
    q, k, v = (rng.standard_normal(s) for s in (case.q_shape, case.k_shape, case.v_shape))
    blocks = case.head_dim // fmt.block
    per_block = 2.0 ** rng.uniform(-BLOCK_SPREAD, BLOCK_SPREAD, blocks)  # (D / block,)
    along_d = np.repeat(per_block, fmt.block)  # (D,)
    jitter = [block_magnitudes(subject, s, 3, fmt.block, 2.0) for s in (case.q_shape, case.k_shape)]
    q = q * along_d * jitter[0]
    k = k / along_d * jitter[1]
    k[..., 1, : fmt.block] = 0.0  # a block of zeros: its scale the format's smallest
    v_axis = scale_axis(case.block_convention, "v")
    v = v * block_magnitudes(subject, case.v_shape, v_axis, fmt.block, 3.0)
    return q, k, v


def with_largest_elements(call: BlockCall) -> BlockCall:
    """``call`` with the element of largest magnitude in k's first block of key 0 (and q's, under
    mx_attention) set to the element format's largest value, its scale kept."""
    fmt = call.format
    stored = {}
    for operand in "qk" if call.convention == "mx_attention" else "k":
        values = np.array(getattr(call, operand))
        if fmt.packed:  # the byte holding the block's first element: its low nibble 6's code
            values[..., 0, 0] = (values[..., 0, 0] & 0xF0) | 0x7
        else:
            values[..., 0, 0] = fmt.element_largest
        stored[operand] = values
    return call.with_(**stored)


def call_block(subject: Subject, case: Case, call: BlockCall) -> np.ndarray:
    """The implementation's output for a block-scaled call, float64 (B, H, Tq, Dv), after checking
    that it came back in the dtype its convention says."""
    client = subject.client
    dtypes = stored_dtypes(call.convention, call.fmt, case.dtype)
    stored = (call.q, call.k, call.v)
    natives = [client.from_numpy(x, dtype) for x, dtype in zip(stored, dtypes, strict=True)]
    answer = client.attention(*natives, causal=case.causal, scale=case.scale, **call.keywords)
    return checked_output(subject, case, answer, call.out_dtype)


def assert_block_matches(subject: Subject, case: Case, out: np.ndarray, call: BlockCall) -> None:
    """``out`` within the budget of the arithmetic the implementation declares, element by
    element; a failure is named by the mistake it matches and says its norm's ratio."""
    __tracebackhide__ = True
    budget = fp8_budget(call.out_dtype, call.p_rounding)
    comparison = compare_dequantized(out, call.dequantized(), call.baseline(),
                                     options=call.options, budget=budget)  # fmt: skip
    label = f"{call.fmt}, P in {call.p_rounding}"
    held_to_budget(subject, case, out, call, comparison, diagnose_block, label)
