"""The judge of block-scaled calls (spec.block_scaled): inputs drawn so that blocks differ and
quantized as callers quantize them, the call in its convention, and the output against the
float64 formula on the dequantized inputs.

The budget is FP8's rule (conformance.judge.fp8.fp8_budget) with the baseline the block-scaled
kernel's own: the naive formula on the blocks' values, P rounded where the implementation declares
(Capabilities.block_p), sums in float32 and the output in its dtype. A failure is named by the
block-scaled mistake (spec.mistakes.block_scaled) it matches, and says its norm's ratio to the
truth's: a scale lost shows there, where the cosine stays 1. A returned log-sum-exp is held to a
float32 one's budget on the dequantized q and k; a cache's case may reach the kernel as page pools
the worker lays out (spec.block_scaled.unread_bytes: NaN wherever no item's keys are).
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_within_budget, fail
from conformance.judge.diagnosis import diagnose_block, diagnose_lse
from conformance.judge.fp8 import (
    checked_output,
    compare_dequantized,
    fp8_budget,
    held_to_budget,
    nan_values_zeroed,
)
from conformance.judge.fp8_calls import dominant_key
from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import compare_lse, natural_lse
from spec.block_scaled import (
    BLOCK_CONVENTIONS,
    BLOCK_FORMATS,
    CACHE_CONVENTIONS,
    CACHE_LAYOUTS,
    BlockCall,
    bfloat16_bytes,
    block_format,
    convention_of,
    output_dtype,
    quantize_call,
    scale_axis,
    stored_dtypes,
)
from spec.formula import naive_log_sum_exp
from spec.fp8 import codes_of, ml_dtypes_missing
from spec.mistakes.state import LseCall

# Each declared convention with the formats it takes: MXFP8 for attention, FP4 for the cache
CONVENTION_FORMATS = {
    convention: [name for name in BLOCK_FORMATS if convention_of(name) == convention]
    for convention in BLOCK_CONVENTIONS
}
BLOCK_CASES = [
    pytest.param(convention, fmt, id=f"{convention}-{fmt}")
    for convention, formats in CONVENTION_FORMATS.items()
    for fmt in formats
]
# the caches' conventions, whose k and v a kernel may take as page pools
PAGED_CASES = [case for case in BLOCK_CASES if case.values[0] in CACHE_CONVENTIONS]
QUERY_DTYPES = ("bfloat16", "float16", "float32")  # fp4_cache's q: the narrowest declared
BLOCK_SPREAD = 8  # per-block magnitudes over 2^-8 .. 2^8


def block_case(subject: Subject, convention: str, fmt: str, **shape) -> Case:
    """A case of ``shape`` in a block-scaled convention and format, grouped heads where the
    implementation declares them; q's dtype the element format's under mx_attention. A latent
    cache's case has its layout's widths (D = latent + rope, Dv = latent) and, where grouped
    heads are declared, one key/value head, as multi-head latent attention has; and at least
    three items (BLOCK-NAN plants a NaN in each)."""
    caps = subject.client.capabilities
    if convention == "mx_attention":
        dtype = block_format(fmt).element
    else:
        dtype = next((d for d in QUERY_DTYPES if d in caps.fp8_queries), QUERY_DTYPES[-1])
    case = Case(dtype=dtype, block_convention=convention, block_format=fmt, **shape)
    if caps.gqa and case.kv_heads is None:
        case = case.with_(kv_heads=1 if fmt in CACHE_LAYOUTS else case.heads // 2)
    case = subject.fit(case)
    if fmt in CACHE_LAYOUTS:  # the layout's widths, whatever the implementation's head dims
        layout = CACHE_LAYOUTS[fmt]
        case = case.with_(head_dim=layout.latent + layout.rope, value_dim=layout.latent,
                          batch=max(case.batch, 3))  # fmt: skip
    subject.require(case)
    if subject.client.family == "numpy" and ml_dtypes_missing():
        pytest.skip(f"{subject.name}: {ml_dtypes_missing()}")
    return case


def declared_call(subject: Subject, case: Case, q, k, v) -> BlockCall:
    """Model values quantized as the case's convention's callers do, with the arithmetic the
    implementation declares."""
    caps = subject.client.capabilities
    options = dict(causal=case.causal, scale=case.scale)
    if case.key_lengths is not None:
        options["key_lengths"] = tuple(case.key_lengths)
    call = quantize_call(q, k, v, case.block_convention, case.block_format, case.dtype, options)
    out_dtype = output_dtype(case.block_convention, case.dtype, caps.block_output)
    p_rounding = caps.block_p_of(case.block_convention)
    return call.with_(p_rounding=p_rounding, out_dtype=out_dtype, page_size=case.page_size)


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
    along their own axis; k's first block of key 1 all zeros. A latent cache's keys are its
    values (the latent) and a rotary part: there v's blocks take the magnitudes along D."""
    fmt = block_format(case.block_format)
    rng = subject.rng
    q, k, v = (rng.standard_normal(s) for s in (case.q_shape, case.k_shape, case.v_shape))
    if case.block_format in CACHE_LAYOUTS:
        latent = case.value_dim
        along_d = np.repeat(2.0 ** rng.uniform(-BLOCK_SPREAD, BLOCK_SPREAD, latent // fmt.block),
                            fmt.block)  # fmt: skip
        q[..., :latent] /= along_d
        v = v * along_d * block_magnitudes(subject, case.v_shape, 3, fmt.block, 2.0)
        v[..., 1, : fmt.block] = 0.0  # a block of zeros
        return q, k, v
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


def accuracy_draw(subject: Subject, case: Case):
    """BLOCK-ACCURACY's inputs: a dominant first key over a flat tail of weights near 2^-10.8,
    values with a common part of 1. A latent cache's scores come from its rotary part alone (q's
    latent part 0; its values are its keys' latent), scaled to the same gap."""
    if case.block_format not in CACHE_LAYOUTS:
        q, k, v = dominant_key(subject, case, gap=7.5, spread=0.05)
        return q, k, v + 1.0
    rope = case.head_dim - case.value_dim
    q_rope, k_rope, v = dominant_key(subject, case.with_(head_dim=rope), gap=7.5, spread=0.05)
    q, k = np.zeros(case.q_shape), np.zeros(case.k_shape)
    q[..., case.value_dim :] = q_rope
    k[..., case.value_dim :] = k_rope * np.sqrt(case.head_dim / rope)  # the call's 1/sqrt(D)
    return q, k, v + 1.0


def with_largest_elements(call: BlockCall) -> BlockCall:
    """``call`` with the element of largest magnitude in k's first block of key 0 (and q's, under
    mx_attention; a latent cache's one cache) set to the element format's largest value, its
    scale kept."""
    fmt = call.format
    if call.convention == "mla_fp8_cache":
        cache = np.array(call.k)
        cache[..., 0, 0] = codes_of(fmt.element_largest, fmt.element)
        return call.with_(k=cache, v=cache)
    stored = {}
    for operand in "qk" if call.convention == "mx_attention" else "k":
        values = np.array(getattr(call, operand))
        if fmt.packed:  # the byte holding the block's first element: its low nibble 6's code
            values[..., 0, 0] = (values[..., 0, 0] & 0xF0) | 0x7
        else:
            values[..., 0, 0] = fmt.element_largest
        stored[operand] = values
    return call.with_(**stored)


# Where BLOCK-NAN plants its NaN scales, all in one call: (operand, its index in the operand's
# scale tensor), each read by outputs the formula makes NaN and beside outputs none of them
# reads: q's row 5 of item 0, head 1, second block (that row); k's key 0 of item 1, kv head 0
# (every row of its query heads there); v's first block of item 0, kv head 0 at column 7
# (mx_attention: keys 0..31, so column 7 of every row of its query heads) or key 0's first
# block (fp4_cache: columns 0..15). Item 0's heads 2 and 3 and item 1's read none.
NAN_PLANTS = {"q": (0, 1, 5, 1), "k": (1, 0, 0, 0), "v": (0, 0, 0, 7)}
# And, in MXFP8's elements (e2m1 has no NaN), beside them: q's row 20 of item 1, its last head
# (that row), and v's key 40 of item 0, its last kv head, at column 11 (column 11 of the rows
# that see key 40 in its query heads). The index's -1 is the last head or kv head.
NAN_ELEMENTS = {"q": (1, -1, 20, 5), "v": (0, -1, 40, 11)}
# In a latent cache's tokens, as bytes, one item each (its keys are its values: a NaN anywhere in
# a token reaches every row that sees it): item 0's key 30 its third scale NaN, item 1's key 40
# a NaN latent element at 11, item 2's key 20 a NaN rotary value at 3; rows before those keys
# read none. q's row 20 of item 1, its last head, NaN at 5, as above.
LATENT_NAN_PLANTS = {"scale": (0, 0, 30, 2), "latent": (1, 0, 40, 11), "rope": (2, 0, 20, 3)}


def with_nan_planted(call: BlockCall) -> BlockCall:
    """``call`` with BLOCK-NAN's NaN scales and elements planted where its convention keeps
    them."""
    if call.convention == "mla_fp8_cache":
        return with_latent_nan_planted(call)
    fmt = call.format
    nan_byte = 0xFF if fmt.scale == "e8m0" else codes_of(np.nan, fmt.scale)
    keywords = dict(call.keywords)
    for operand, index in NAN_PLANTS.items():
        name = f"{operand}_block_scales"
        if name not in keywords:  # fp4_cache's q is not block-scaled
            continue
        scales = np.array(keywords[name])
        scales[index if scales.shape[-1] > index[-1] else (*index[:-1], 0)] = nan_byte
        keywords[name] = scales
    elements = {}
    if not fmt.packed:
        for operand, index in NAN_ELEMENTS.items():
            elements[operand] = np.array(getattr(call, operand))
            elements[operand][index] = np.nan
    return call.with_(keywords=keywords, **elements)


def with_latent_nan_planted(call: BlockCall) -> BlockCall:
    layout = CACHE_LAYOUTS[call.fmt]
    fmt = call.format
    cache = np.array(call.k)
    _, scale_part, rope_part = layout.parts
    *token, scale = LATENT_NAN_PLANTS["scale"]
    scales = cache[(*token, scale_part)].view("<f4")  # a view: writes reach the cache
    scales[scale] = np.nan
    cache[LATENT_NAN_PLANTS["latent"]] = codes_of(np.nan, fmt.element)
    *token, rope = LATENT_NAN_PLANTS["rope"]
    cache[(*token, rope_part)][2 * rope : 2 * rope + 2] = bfloat16_bytes(np.array([np.nan]))
    q = np.array(call.q)
    q[NAN_ELEMENTS["q"]] = np.nan
    return call.with_(q=q, k=cache, v=cache)


def call_block(subject: Subject, case: Case, call: BlockCall) -> np.ndarray:
    """The implementation's output for a block-scaled call, float64 (B, H, Tq, Dv), after checking
    that it came back in the dtype its convention says."""
    return checked_output(subject, case, answer_of(subject, case, call), call.out_dtype)


def call_block_with_lse(subject: Subject, case: Case, call: BlockCall):
    """(out, lse) of a block-scaled call with return_lse=True: the output as :func:`call_block`
    checks it, the log-sum-exp float64 (B, H, Tq) in the natural base."""
    answer = answer_of(subject, case, call, return_lse=True)
    if not isinstance(answer, tuple) or len(answer) != 2:
        fail(subject, case, "with return_lse=True, should return (out, lse)")
    out = checked_output(subject, case, answer[0], call.out_dtype)
    lse = subject.client.to_numpy(answer[1]).astype(np.float64)
    if lse.shape != case.q_shape[:-1]:
        fail(subject, case, f"lse of shape {lse.shape}, but should be {case.q_shape[:-1]}")
    return out, natural_lse(subject, lse)


def answer_of(subject: Subject, case: Case, call: BlockCall, **keywords):
    """The implementation's answer, as returned, to ``call`` in the dtypes its convention stores;
    a paged case's k and v laid out as page pools by the worker (the block scales with them)."""
    client = subject.client
    dtypes = stored_dtypes(call.convention, call.fmt, case.dtype)
    stored = (call.q, call.k, call.v)
    natives = [client.from_numpy(x, dtype) for x, dtype in zip(stored, dtypes, strict=True)]
    if case.page_size is not None:  # the worker lays the pools out (spec.formula.page_pool)
        keywords |= {"page_size": case.page_size, "key_lengths": call.options["key_lengths"]}
    return client.attention(*natives, causal=case.causal, scale=case.scale, **call.keywords,
                            **keywords)  # fmt: skip


def assert_block_lse_matches(subject: Subject, case: Case, lse: np.ndarray, call: BlockCall):
    """``lse`` (natural base) the log-sum-exp of the dequantized q k^T within the budget of a
    float32 one; a failure named by the log-sum-exp mistake it matches."""
    __tracebackhide__ = True
    q, k, _ = call.dequantized()
    lse_call = LseCall(q, k, dict(call.options), subject.client.capabilities.lse_base)
    naive = naive_log_sum_exp(q, k, dtype="float32", **call.options)
    comparison = compare_lse(lse, lse_call.truth, naive, dtype="float32")
    finding = None
    if not comparison.ok:
        finding = diagnose_lse(lse, lse_call, case=case, comparison=comparison)
    assert_within_budget(subject, case, "lse", comparison, finding)


def assert_block_matches(subject: Subject, case: Case, out: np.ndarray, call: BlockCall) -> None:
    """``out`` within the budget of the arithmetic the implementation declares, element by
    element; a failure is named by the mistake it matches and says its norm's ratio."""
    __tracebackhide__ = True
    budget = fp8_budget(call.out_dtype, call.p_rounding)
    true_q, true_k, true_v = call.dequantized()
    baseline = call.baseline(operands=(true_q, true_k, nan_values_zeroed(true_v)))
    comparison = compare_dequantized(out, (true_q, true_k, true_v), baseline,
                                     options=call.options, budget=budget)  # fmt: skip
    label = f"{call.fmt}, P in {call.p_rounding}"
    held_to_budget(subject, case, out, call, comparison, diagnose_block, label)
