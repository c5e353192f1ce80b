"""Broken attention implementations, one realistic bug each: the suite must reject every one.

Each docstring says what the bug is and where such bugs come from. ``hidden_at_easy_shape``
marks the bugs that give a correct answer at the easy shape (B = H = 1, Tq = Tk = 64, D = 64,
float32, unit-normal inputs, default scale): only the suite's harder cases can catch them.
"""

from __future__ import annotations

import math

import numpy as np

from impls.contract import causal_mask, resolve_scale
from tests.zoo import mutant
from tests.zoo.formula import attend, masked, scores_of, softmax
from tests.zoo.streaming import streaming_attention

# --- scaling ------------------------------------------------------------------------------------


@mutant("scaling", "SCALE-FORMULA", mistake="scale-one-over-d", alike=("scale-twice",))
def scale_by_one_over_d(q, k, v, *, causal=True, scale=None):
    """Scales scores by 1/D instead of 1/sqrt(D): the classic mix-up of the two, often from
    reading "divide by the dimension" in prose."""
    return attend(q, k, v, causal=causal, scale=1 / q.shape[-1] if scale is None else scale)


@mutant("scaling", "SCALE-FORMULA", hidden_at_easy_shape=True, mistake="scale-model-width")
def scale_by_model_width(q, k, v, *, causal=True, scale=None):
    """Scales by 1/sqrt(H * D), the model width d_model, instead of the head's d_k: code written
    for one head and then split into heads without revisiting the scale. Right when H = 1."""
    heads, d = q.shape[1], q.shape[-1]
    return attend(
        q, k, v, causal=causal, scale=1 / math.sqrt(heads * d) if scale is None else scale
    )


@mutant("scaling", "SCALE-FORMULA", hidden_at_easy_shape=True, mistake="scale-constant")
def constant_one_eighth(q, k, v, *, causal=True, scale=None):
    """Hard-codes the scale 0.125 = 1/sqrt(64): a kernel written for GPT-2's d_k = 64 and reused
    for another head size. Right exactly when D = 64."""
    return attend(q, k, v, causal=causal, scale=0.125 if scale is None else scale)


@mutant("scaling", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="scale-explicit-ignored")
def ignores_explicit_scale(q, k, v, *, causal=True, scale=None):
    """Accepts ``scale`` and ignores it, always using 1/sqrt(D): a wrapper that forgot to pass the
    argument down. Right whenever the caller leaves the default."""
    return attend(q, k, v, causal=causal, scale=None)


@mutant("scaling", "SCALE-FORMULA", mistake="scale-twice")
def scaled_twice(q, k, v, *, causal=True, scale=None):
    """Scales q by 1/sqrt(D) up front (as some kernels do to save a multiply) and the scores
    again: a refactor that moved the scale without removing the old one."""
    q = q * q.dtype.type(resolve_scale(scale, q.shape[-1]))
    return attend(q, k, v, causal=causal, scale=scale)


@mutant("scaling", "CONTRACT-DETERMINISM", hidden_at_easy_shape=True)
def scales_query_in_place(q, k, v, *, causal=True, scale=None):
    """Pre-scales q with ``q *= scale``, writing into the caller's array: the first call is right,
    every later call on the same arrays is scaled again."""
    q *= q.dtype.type(resolve_scale(scale, q.shape[-1]))
    return attend(q, k, v, causal=causal, scale=1.0)


@mutant("scaling", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="scale-padded-head-dim")
def scale_from_padded_head_dim(q, k, v, *, causal=True, scale=None):
    """Pads the head dim to a power of two of at least 16 for the tensor cores and takes the scale
    from the padded width: right for D = 16, 32, 64, 128, 256; wrong for D = 1, 40, 80, 96 ..."""
    padded = max(16, 1 << (q.shape[-1] - 1).bit_length())
    return attend(q, k, v, causal=causal, scale=1 / math.sqrt(padded) if scale is None else scale)


# --- masking ------------------------------------------------------------------------------------


def _attend_with_visibility(q, k, v, visible, scale):
    scores = np.where(visible, scores_of(q, k, scale), -np.inf)
    with np.errstate(invalid="ignore"):
        return (softmax(scores) @ v).astype(q.dtype)


@mutant("masking", "MASK-ZERO", mistake="mask-one-ahead")
def mask_off_by_one(q, k, v, *, causal=True, scale=None):
    """Lets query i see key i + 1: ``j <= i + 1`` where ``j <= i`` was meant, an off-by-one in the
    diagonal offset."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.tril(np.ones((tq, tk), bool), tk - tq + 1) if causal else True
    return _attend_with_visibility(q, k, v, visible, scale)


@mutant("masking", "MASK-ROW0", mistake="mask-excludes-diagonal")
def diagonal_masked(q, k, v, *, causal=True, scale=None):
    """Masks the diagonal too (``j < i``): position 0 is left with no key at all and every row
    loses itself, from reading "must not see the future" as "must not see itself"."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.tril(np.ones((tq, tk), bool), tk - tq - 1) if causal else True
    return _attend_with_visibility(q, k, v, visible, scale)


@mutant("masking", "MASK-PREFIX", hidden_at_easy_shape=True, mistake="mask-top-left")
def top_left_alignment(q, k, v, *, causal=True, scale=None):
    """Aligns the mask top-left when Tq < Tk (query i sees keys 0..i), as PyTorch's is_causal does:
    a decode step then sees only the first key of the cache. Right when Tq = Tk."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.tril(np.ones((tq, tk), bool)) if causal else True
    return _attend_with_visibility(q, k, v, visible, scale)


@mutant("masking", "MASK-FUTURE-INVARIANT", hidden_at_easy_shape=True, mistake="max-before-masking")
def max_before_masking(q, k, v, *, causal=True, scale=None):
    """Takes the row maximum over every key, future ones included, and masks afterwards: a huge
    future score makes every visible weight underflow. Right while scores are moderate."""
    scores = scores_of(q, k, scale)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    if causal:
        weights = weights * causal_mask(q.shape[-2], k.shape[-2])
    with np.errstate(invalid="ignore"):
        return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@mutant(
    "masking", "MASK-FUTURE-INVARIANT", hidden_at_easy_shape=True, mistake="mask-fill-minus-1e4"
)
def additive_mask_minus_1e4(q, k, v, *, causal=True, scale=None):
    """Adds -1e4 to future scores (the float16-era additive mask) instead of setting them to -inf:
    future keys whose scores exceed the visible ones by ~1e4 take the weight."""
    scores = scores_of(q, k, scale)
    if causal:
        scores = scores + np.where(causal_mask(*scores.shape[-2:]), 0, -1e4).astype(scores.dtype)
    return (softmax(scores) @ v).astype(q.dtype)


@mutant("masking", "MASK-ZERO", mistake="mask-fill-zero")
def mask_multiplies_scores_by_zero(q, k, v, *, causal=True, scale=None):
    """Applies the 0/1 mask to the scores by multiplication: future scores become 0, not -inf, and
    exp(0 - max) still gives them weight."""
    scores = scores_of(q, k, scale)
    if causal:
        scores = scores * causal_mask(*scores.shape[-2:])
    return (softmax(scores) @ v).astype(q.dtype)


@mutant("masking", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="mask-on-non-causal-call")
def always_causal(q, k, v, *, causal=True, scale=None):
    """Applies the causal mask whatever ``causal`` says: a decoder-only kernel exposed under a
    general signature. Right for every causal call."""
    return attend(q, k, v, causal=True, scale=scale)


# --- softmax ------------------------------------------------------------------------------------


@mutant(
    "softmax", "SOFTMAX-STABLE", hidden_at_easy_shape=True, mistake="softmax-no-max-subtraction"
)
def no_max_subtraction(q, k, v, *, causal=True, scale=None):
    """exp() of the raw scores: overflows to inf, then NaN, once scores pass ~88 in float32 (~709
    in float64). Right while scores are small."""
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(masked(scores_of(q, k, scale), causal))
        return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@mutant("softmax", "SOFTMAX-STABLE", hidden_at_easy_shape=True, mistake="softmax-clamped-scores")
def clamps_scores_instead_of_subtracting_max(q, k, v, *, causal=True, scale=None):
    """Clips scores to [-80, 80] before exp() to dodge overflow without subtracting the maximum:
    scores beyond the clip are flattened and their differences lost."""
    weights = np.exp(np.clip(masked(scores_of(q, k, scale), causal), -80, 80))
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@mutant("softmax", "SOFTMAX-STABLE", hidden_at_easy_shape=True, mistake="row-max-from-a-sentinel")
def running_max_from_a_sentinel(q, k, v, *, causal=True, scale=None):
    """Starts each row's running maximum at -5e4 instead of -inf, as FlashInfer's paged decode
    kernel once did, and writes 0 where the sum of exponentials is 0: a row whose every score
    lies far below -5e4 underflows whole and comes out 0 (FlashInfer #4450). Right for every
    row with one score above the sentinel, so for every case but those."""
    scores = masked(scores_of(q, k, scale), causal)
    top = np.maximum(scores.max(axis=-1, keepdims=True), scores.dtype.type(-5e4))
    weights = np.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        normalised = np.where(total > 0, weights / total, 0)
    return (normalised @ v).astype(q.dtype)


@mutant("softmax", "SOFTMAX-ROWSUM", mistake="softmax-over-queries")
def softmax_over_queries(q, k, v, *, causal=True, scale=None):
    """Normalises over axis -2 (the queries) instead of -1 (the keys): a transposed-layout
    habit."""
    scores = masked(scores_of(q, k, scale), causal)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((weights / weights.sum(axis=-2, keepdims=True)) @ v).astype(q.dtype)


@mutant("softmax", "OUT-FORMULA", mistake="row-sum-in-float16")
def row_sum_in_float16(q, k, v, *, causal=True, scale=None):
    """Accumulates the softmax denominator in float16, as a half-precision kernel that forgot its
    float32 accumulator: the sum is off by up to ~1e-3 relative."""
    scores = masked(scores_of(q, k, scale), causal)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    total = weights.astype(np.float16).sum(axis=-1, keepdims=True, dtype=np.float16)
    return ((weights / total.astype(q.dtype)) @ v).astype(q.dtype)


@mutant(
    "softmax", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="softmax-epsilon-in-denominator"
)
def epsilon_in_denominator(q, k, v, *, causal=True, scale=None):
    """Divides by (sum + 1e-10) to "avoid division by zero", which cannot happen once the maximum
    is subtracted (the sum is at least 1): a 1e-10 relative error, far below float32's rounding,
    far above float64's."""
    scores = masked(scores_of(q, k, scale), causal)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((weights / (weights.sum(axis=-1, keepdims=True) + 1e-10)) @ v).astype(q.dtype)


# --- tiling -------------------------------------------------------------------------------------


@mutant(
    "tiling",
    "OUT-FORMULA",
    hidden_at_easy_shape=True,
    mistake="online-softmax-stale-accumulator-64",
)
def stale_accumulator(q, k, v, *, causal=True, scale=None):
    """Online softmax that rescales the running sum but not the output accumulator when a later
    key tile raises the running maximum. Right while T fits one tile of 64."""
    return streaming_attention(q, k, v, causal=causal, scale=scale, rescale_accumulator=False)


@mutant("tiling", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="last-key-tile-dropped-64")
def drops_partial_tile(q, k, v, *, causal=True, scale=None):
    """Loops over ``Tk // 64`` key tiles, dropping the last partial one: keys past the last
    multiple of 64 are never seen. Right when T <= 64 or T is a multiple of 64."""
    return streaming_attention(q, k, v, causal=causal, scale=scale, keep_partial_tile=False)


@mutant("tiling", "OUT-FORMULA", hidden_at_easy_shape=True)
def requires_tile_multiple(q, k, v, *, causal=True, scale=None):
    """Rejects any T that is not a multiple of its tile size 64: a kernel without the boundary
    masking for partial tiles, guarded by an assertion instead of handling them."""
    if q.shape[-2] % 64 or k.shape[-2] % 64:
        raise ValueError(f"sequence lengths must be multiples of 64, got {q.shape[-2]}")
    return streaming_attention(q, k, v, causal=causal, scale=scale)


@mutant("tiling", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="tile-skip-by-row-index-64")
def tile_skip_ignores_offset(q, k, v, *, causal=True, scale=None):
    """Skips key tiles by the query's index instead of its absolute position i + Tk - Tq: with
    fewer queries than keys, visible key tiles at the end of the cache are never loaded."""
    return streaming_attention(q, k, v, causal=causal, scale=scale, skip_by_absolute_position=False)


@mutant("tiling", "CONTRACT-DETERMINISM", hidden_at_easy_shape=True)
def split_k_in_random_order(q, k, v, *, causal=True, scale=None):
    """Splits the keys into chunks reduced in whichever order they finish, as a split-K kernel
    combining partial results with atomics: right to rounding, but not the same bits twice."""
    order = np.random.default_rng().permutation(k.shape[-2])
    visible = causal_mask(q.shape[-2], k.shape[-2])[:, order] if causal else True
    scores = np.where(visible, scores_of(q, k[..., order, :], scale), -np.inf)
    return (softmax(scores) @ v[..., order, :]).astype(q.dtype)


# --- layout -------------------------------------------------------------------------------------


@mutant("layout", "CONTRACT-BATCH", hidden_at_easy_shape=True, mistake="heads-reversed")
def heads_swapped(q, k, v, *, causal=True, scale=None):
    """Returns the heads in reverse order: a layout bug invisible when H = 1."""
    return attend(q, k, v, causal=causal, scale=scale)[:, ::-1].copy()


@mutant("layout", "CONTRACT-BATCH", hidden_at_easy_shape=True, mistake="batch-items-rotated")
def batch_items_rotated(q, k, v, *, causal=True, scale=None):
    """Writes batch item b's output to slot b + 1: a pointer offset computed from the wrong
    stride. Invisible when B = 1."""
    return np.roll(attend(q, k, v, causal=causal, scale=scale), 1, axis=0)


@mutant("layout", "OUT-MULTIHEAD", hidden_at_easy_shape=True, mistake="heads-mixed-by-reshape")
def reshape_instead_of_transpose(q, k, v, *, causal=True, scale=None):
    """Views (B, H, T, D) as (B, T, H, D) with a reshape where a transpose was needed, computes
    per head, and views it back: heads and positions are mixed. Right when H = 1."""
    batch, heads, tq, _ = q.shape
    tk = k.shape[-2]
    q2 = q.reshape(batch, tq, heads, -1).transpose(0, 2, 1, 3)  # (B, H, Tq, D), wrongly built
    k2 = k.reshape(batch, tk, heads, -1).transpose(0, 2, 1, 3)  # (B, H, Tk, D)
    v2 = v.reshape(batch, tk, heads, -1).transpose(0, 2, 1, 3)  # (B, H, Tk, Dv)
    out = attend(q2, k2, v2, causal=causal, scale=scale)  # (B, H, Tq, Dv)
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(q.shape[:-1] + v.shape[-1:])


@mutant("layout", "OUT-FORMULA", hidden_at_easy_shape=True)
def value_dim_taken_from_query(q, k, v, *, causal=True, scale=None):
    """Sizes the output by q's head dim D instead of v's Dv, truncating or zero-padding: a kernel
    that assumes Dv = D. Right whenever Dv = D."""
    out = attend(q, k, v, causal=causal, scale=scale)
    fixed = np.zeros(q.shape, dtype=q.dtype)
    width = min(q.shape[-1], v.shape[-1])
    fixed[..., :width] = out[..., :width]
    return fixed


# --- dtype --------------------------------------------------------------------------------------


@mutant("dtype", "CONTRACT-DTYPE")
def float64_out_for_float32_in(q, k, v, *, causal=True, scale=None):
    """Computes in float64 and returns it for float32 inputs: a missing cast back to the input's
    dtype."""
    return attend(q.astype(np.float64), k.astype(np.float64), v, causal=causal, scale=scale)


@mutant("dtype", "OUT-FORMULA", mistake="probabilities-in-float16")
def probabilities_rounded_to_half(q, k, v, *, causal=True, scale=None):
    """Rounds the probabilities to float16 before the product with V, as a kernel that feeds P to
    a half-precision matmul even for float32 inputs."""
    weights = softmax(masked(scores_of(q, k, scale), causal))
    return (weights.astype(np.float16).astype(q.dtype) @ v).astype(q.dtype)


@mutant("dtype", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="float32-inside")
def computes_in_float32(q, k, v, *, causal=True, scale=None):
    """Returns float64 for float64 inputs but computes in float32 inside: a float32 kernel behind
    a float64 signature. Right in float32."""
    f32 = (x.astype(np.float32) for x in (q, k, v))
    return attend(*f32, causal=causal, scale=scale).astype(q.dtype)


# --- edge cases ---------------------------------------------------------------------------------


@mutant("edge case", "OUT-FORMULA", hidden_at_easy_shape=True, mistake="softmax-over-squeezed-axes")
def squeezes_singleton_axes(q, k, v, *, causal=True, scale=None):
    """Squeezes the scores before the softmax (code written for 2-D matrices): when Tk = 1 the key
    axis disappears and the softmax runs over queries or heads instead."""
    scores = masked(scores_of(q, k, scale), causal)
    weights = softmax(np.squeeze(scores)).reshape(scores.shape)
    return (weights @ v).astype(q.dtype)


@mutant("edge case", "MASK-PREFIX", hidden_at_easy_shape=True, mistake="scale-missing-at-decode")
def decode_fast_path_forgets_scale(q, k, v, *, causal=True, scale=None):
    """A separate fast path for Tq = 1 (one decoding step) that forgets to scale the scores: the
    main path is right, the decode path is not."""
    if q.shape[-2] == 1:
        return attend(q, k, v, causal=causal, scale=1.0)
    return attend(q, k, v, causal=causal, scale=scale)
