"""Zoo members for the partial states: a log-sum-exp returned beside the output, and the merge of
states over split keys. The bugs reported in kernels that ship them (a base-2 log-sum-exp taken
for a natural one, an empty split merged into NaN, a merge that overflows), and correct roads.

Each member takes ``return_lse``, as a plain callable declaring the log-sum-exp does, and its
attention output is the formula's; a member with a merge carries it as ``merge_states``, and its
base as ``lse_base``, attributes of the function.
"""

from __future__ import annotations

import math

import numpy as np

from spec.formula import visible_keys
from tests.zoo import correct_variant, mutant
from tests.zoo.formula import scores_of
from tests.zoo.modifiers import attend_modified


def attend_with_lse(q, k, v, *, causal, scale, return_lse, lse_of=None):
    """The formula in q's dtype; with ``return_lse``, (out, lse), lse the natural log-sum-exp of
    each row's masked scores, or ``lse_of(masked_scores)`` where a member computes it otherwise."""
    scores = scores_of(q, k, scale)  # (B, H, Tq, Tk)
    scores = np.where(visible_keys(*scores.shape[-2:], causal=causal), scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)
    out = ((weights / total) @ v).astype(q.dtype)
    if not return_lse:
        return out
    lse = (top + np.log(total))[..., 0] if lse_of is None else lse_of(scores)
    return out, lse.astype(q.dtype)


def attend_in_base_2(q, k, v, *, causal, scale, return_lse):
    """:func:`attend_with_lse` with its log-sum-exp in base 2: log2 of each row's sum."""
    out = attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    if not return_lse:
        return out
    return out[0], (out[1] / math.log(2)).astype(q.dtype)


def merged(outputs, lses, *, exp=np.exp, subtract_max=True, skip_empty=True, guard_unseen=True):
    """The merge of states (P, B, H, Tq, Dv) and (P, B, H, Tq), in their dtype, each step a
    switch: ``exp`` the base's exponential, the largest lse subtracted first, parts that saw no
    key (-inf) skipped, a row no part saw kept from -inf - (-inf)."""
    top = lses.max(axis=0) if subtract_max else np.zeros(lses.shape[1:], lses.dtype)
    if guard_unseen:
        top = np.where(np.isneginf(top), lses.dtype.type(0), top)
    weights = exp(lses - top)  # (P, B, H, Tq)
    parts = weights[..., None] * outputs
    if skip_empty:
        parts = np.where(weights[..., None] > 0, parts, outputs.dtype.type(0))
    total = weights.sum(axis=0)
    out = parts.sum(axis=0) / np.where(total > 0, total, total.dtype.type(1))[..., None]
    log = np.log2 if exp is np.exp2 else np.log
    with np.errstate(divide="ignore"):
        return out.astype(outputs.dtype), (top + log(total)).astype(lses.dtype)


# --- the log-sum-exp ------------------------------------------------------------------------------


@mutant("partial states", "LSE-VALUE", mistake="lse-other-base")
def lse_in_base_2_declared_natural(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Returns log2 of the sum, the base its exp2 kernel computes in, while declaring the
    natural base: a merge with another library's states weighs every part wrong."""

    def log2_sum(scores):
        top = scores.max(axis=-1, keepdims=True)
        return (top / math.log(2) + np.log2(np.exp(scores - top).sum(axis=-1, keepdims=True)))[
            ..., 0
        ]

    return attend_with_lse(
        q, k, v, causal=causal, scale=scale, return_lse=return_lse, lse_of=log2_sum
    )


@mutant("partial states", "LSE-VALUE", mistake="lse-unscaled")
def lse_of_unscaled_scores(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Takes the log-sum-exp of q k^T before the softmax scale (the scale folded into the
    exponent of the output's weights only)."""

    def unscaled(scores):
        factor = q.shape[-1] ** -0.5 if scale is None else scale
        raw = scores / scores.dtype.type(factor) if factor else scores
        top = raw.max(axis=-1, keepdims=True)
        return (top + np.log(np.exp(raw - top).sum(axis=-1, keepdims=True)))[..., 0]

    return attend_with_lse(
        q, k, v, causal=causal, scale=scale, return_lse=return_lse, lse_of=unscaled
    )


@mutant("partial states", "LSE-VALUE", mistake="lse-default-scale")
def lse_under_the_default_scale(q, k, v, *, causal=True, scale=None, return_lse=False):
    """The output under the call's scale, the log-sum-exp under 1/sqrt(D): a kernel whose row max
    is exported from a pass with its own default scale (TensorRT-LLM PR #19112)."""
    out = attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    if not return_lse:
        return out
    _, lse = attend_with_lse(q, k, v, causal=causal, scale=None, return_lse=True)
    return out[0], lse


@mutant("partial states", "LSE-VALUE", mistake="lse-max-not-added-back")
def lse_without_the_max(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Returns log(sum_j exp(x_j - m)), the running sum's log, without the row max m the kernel
    subtracted from every score added back."""

    def shifted(scores):
        top = scores.max(axis=-1, keepdims=True)
        return np.log(np.exp(scores - top).sum(axis=-1))

    return attend_with_lse(
        q, k, v, causal=causal, scale=scale, return_lse=return_lse, lse_of=shifted
    )


@mutant("partial states", "LSE-VALUE", mistake="lse-with-sink")
def lse_with_the_sink(q, k, v, *, causal=True, scale=None, sinks=None, return_lse=False):
    """Returns the state after the sink joined the running sum, log(sum_j exp(x_j) + exp(s_h)),
    where the scores' own log-sum-exp belongs: merged with another part's, it counts the sink
    twice."""
    out = attend_modified(q, k, v, causal=causal, scale=scale, sinks=sinks)
    if not return_lse:
        return out
    _, lse = attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=True)
    if sinks is not None:
        lse = np.logaddexp(lse, np.asarray(sinks, lse.dtype)[:, None])  # (B, H, Tq)
    return out, lse.astype(q.dtype)


# --- the merge ------------------------------------------------------------------------------------


@mutant("partial states", "LSE-MERGE", mistake="merge-no-max-subtraction")
def merge_without_max_subtraction(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Merges as sum_i exp(lse_i) o_i / sum_i exp(lse_i): exact arithmetic, but exp overflows
    once an lse passes 88 in float32 (709 in float64), and inf / inf is NaN."""
    return attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


merge_without_max_subtraction.merge_states = lambda o, lse: merged(o, lse, subtract_max=False)


@mutant("partial states", "LSE-MERGE", mistake="merge-empty-part-nan")
def merge_empty_part_into_nan(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Weighs every part, the empty ones too: a split that saw no key has weight 0, and 0 times
    the NaN its output holds is NaN in every row it touches."""
    return attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


merge_empty_part_into_nan.merge_states = lambda o, lse: merged(o, lse, skip_empty=False)


@mutant("partial states", "LSE-MERGE", mistake="merge-unseen-row-nan")
def merge_unseen_rows_into_nan(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Skips an empty part as it should, but subtracts the largest lse unguarded: a row that no
    part saw (every lse -inf) becomes NaN, -inf - (-inf), where the contract says 0 with lse -inf
    (FlashInfer #4975). Right wherever one part saw a key."""
    return attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


merge_unseen_rows_into_nan.merge_states = lambda o, lse: merged(o, lse, guard_unseen=False)


@mutant("partial states", "LSE-MERGE", mistake="merge-other-base")
def merge_base_2_as_natural(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Returns and declares a base-2 log-sum-exp, right, but merges with exp where exp2
    belongs: the parts' weights come out with the wrong exponent."""
    return attend_in_base_2(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


merge_base_2_as_natural.lse_base = "2"
merge_base_2_as_natural.merge_states = lambda o, lse: merged(o, lse, exp=np.exp)


@correct_variant
def lse_in_base_2_throughout(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Declares base 2 and keeps it throughout: log2 of the sum returned, and exp2 in its
    merge, as kernels computing with exp2 do."""
    return attend_in_base_2(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


lse_in_base_2_throughout.lse_base = "2"
lse_in_base_2_throughout.merge_states = lambda o, lse: merged(o, lse, exp=np.exp2)


def merge_in_the_natural_base(outputs, lses):
    """A base-2 merge that converts its lses to the natural base first (lse * ln 2) and merges
    there, converting back at the end, as a kernel whose softmax runs in base 2 and whose merge
    is written with exp does: each conversion rounds by the lse's magnitude, about |lse| u."""
    natural_out, natural_lse = merged(outputs, lses * lses.dtype.type(math.log(2)))
    return natural_out, natural_lse / natural_lse.dtype.type(math.log(2))


@correct_variant
def merge_converting_bases(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Keeps its log-sum-exp in base 2, as FlashAttention's kernels do (scores times log2 e),
    and merges in the natural base: right, to within the rounding of the conversion."""
    return attend_in_base_2(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


merge_converting_bases.lse_base = "2"
merge_converting_bases.merge_states = merge_in_the_natural_base


def merge_pairwise(outputs, lses):
    """Merges the states two at a time, left to right: the merge is associative."""
    out, lse = outputs[0], lses[0]
    for part_out, part_lse in zip(outputs[1:], lses[1:], strict=True):
        out, lse = merged(np.stack([out, part_out]), np.stack([lse, part_lse]))
    return out, lse


@correct_variant
def merge_by_pairs(q, k, v, *, causal=True, scale=None, return_lse=False):
    """Its merge folds the parts in two at a time, as a tree reduction of split-KV kernels does;
    associative, so the same state."""
    return attend_with_lse(q, k, v, causal=causal, scale=scale, return_lse=return_lse)


merge_by_pairs.merge_states = merge_pairwise
