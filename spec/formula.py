"""The formula, in one place: the mask and scale rules, the softmax, the float64 oracle every
implementation is judged against, and the naive same-dtype baseline its error budget is measured
with.

    Attention(Q, K, V) = softmax(mask(Q K^T / sqrt(d_k))) V

Written to be read next to the document rather than to be fast. The judge (``conformance/``)
takes its truth from here, never from the package of things it judges; ``impls.numpy_reference``
wraps the oracle as an implementation, so the oracle is itself judged by the suite.

Causal attention is bottom-right aligned: query row i sits at absolute position i + Tk - Tq and
sees keys j <= i + Tk - Tq. ``scale=None`` means 1/sqrt(D).

The extensions (attention as kernels ship it, not in the document; spec/features.py) are keyword
arguments of the same functions: k and v with fewer heads than q (grouped-query attention), a left
``window``, per-item ``key_lengths``, sequences packed along the token axis (``cu_seqlens_q``,
``cu_seqlens_k``), a ``chunk``, and the score modifiers ``softcap``, ``alibi_slopes`` and
``sinks``; :func:`visible_keys` says which keys each query row sees, :func:`modified_scores` and
:func:`softmax` what the modifiers do, and :func:`per_sequence` what packing means.
:func:`attention_in_steps` is the formula with each step a parameter: the oracle runs it with every
step as given, and each mistake of spec.mistakes.forward with one replaced.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from spec.dtypes import check_dtype, rounded_in_storage
from spec.features import DIFFERENTIATED_KEYWORDS
from spec.masks import (
    MASK_CONVENTIONS,
    counted_keys,
    cut_to_item,
    mask_options,
    only_mask_options,
    visible_keys,
)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def causal_mask(tq: int, tk: int) -> np.ndarray:
    """Boolean (Tq, Tk) mask, True where query i may see key j: j <= i + Tk - Tq."""
    return np.tril(np.ones((tq, tk), dtype=bool), k=tk - tq)


def query_positions(tq: int, tk: int, key_lengths=None) -> np.ndarray:
    """(B or 1, Tq, 1): the absolute position of each query row, i + L_b - Tq (bottom-right
    aligned, L_b = Tk without key lengths)."""
    lengths = np.array([tk]) if key_lengths is None else np.asarray(key_lengths, dtype=np.int64)
    return np.arange(tq)[None, :, None] + (lengths - tq)[:, None, None]  # (B, Tq, 1)


def modified_scores(scores: np.ndarray, *, softcap=None, alibi_slopes=None, key_lengths=None):
    """The scaled scores (B, H, Tq, Tk) as the score-modifying features have them, before the
    mask: capped as c * tanh(x / c) (``softcap``), then ALiBi's -m_h * |p - j| added
    (``alibi_slopes``, p the query's position). In place; in the scores' own dtype."""
    if softcap is not None:
        cap = scores.dtype.type(softcap)
        scores /= cap
        np.tanh(scores, out=scores)
        scores *= cap
    if alibi_slopes is not None:
        tq, tk = scores.shape[-2:]
        distance = np.abs(query_positions(tq, tk, key_lengths) - np.arange(tk))  # (B, Tq, Tk)
        slopes = np.asarray(alibi_slopes, scores.dtype)[None, :, None, None]  # (1, H, 1, 1)
        scores -= slopes * distance[:, None].astype(scores.dtype)  # (B, H, Tq, Tk)
    return scores


def repeat_kv_heads(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """k or v with Hkv heads repeated to q's Hq = g * Hkv: query head h reads head h // g
    (PyTorch's ``enable_gqa``, FlashAttention), i.e. ``repeat_interleave`` along heads."""
    heads, kv_heads = q.shape[-3], kv.shape[-3]
    if heads == kv_heads:
        return kv
    return np.repeat(kv, heads // kv_heads, axis=-3)  # (B, Hkv, T, D) -> (B, Hq, T, D)


def softmax(scores: np.ndarray, sinks=None) -> np.ndarray:
    """Row softmax over the last axis, in the scores' own dtype. A row of -inf (no visible key)
    gives NaN: nothing defines its weights. ``sinks`` (one logit per head) join each row's
    denominator alone: p_j = exp(x_j) / (sum_k exp(x_k) + exp(s_h))."""
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = np.asarray(sinks, scores.dtype)[:, None, None]  # (H, 1, 1)
        top = np.maximum(top, sink)
    # Subtracting the row maximum leaves the softmax unchanged and keeps exp() from overflowing.
    with np.errstate(invalid="ignore"):  # -inf - -inf: a row that sees no key, NaN as said
        weights = scores - top
    # In place, the same values: on large scores a fresh array for exp() and another for the
    # division cost more than the arithmetic (ANDREA's twelve heads: several times slower).
    np.exp(weights, out=weights)
    total = weights.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sink - top)
    weights /= total
    return weights


def reference_scores(q: np.ndarray, k: np.ndarray, scale: float | None = None) -> np.ndarray:
    """Scaled scores Q K^T * scale, (B, H, Tq, Tk), in float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    scores = q @ k.swapaxes(-1, -2)
    scores *= resolve_scale(scale, q.shape[-1])  # in place: the same values, no second matrix
    return scores


def reference_masked_scores(
    q, k, *, causal: bool = True, scale: float | None = None, softcap=None, alibi_slopes=None,
    **mask,
):  # fmt: skip
    """Scaled scores, modified (softcap, ALiBi) and with -inf where the mask hides a key,
    (B, H, Tq, Tk), in float64. ``mask``: the keywords of spec.masks' kinds."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    scores = scores_in_steps(q, k, scale=scale, softcap=softcap, alibi_slopes=alibi_slopes,
                             key_lengths=mask.get("key_lengths"))  # fmt: skip
    return masked(scores, causal=causal, in_place=True, **mask)


# --- the formula in steps: the truth, and each mistake's variant with one step replaced -------


def grouped_heads(heads: int, kv_heads: int) -> np.ndarray:
    """Which key/value head each of ``heads`` query heads reads: h // g, g = heads / kv_heads."""
    return np.arange(heads) // (heads // kv_heads)


def masked_softmax(scores: np.ndarray, visible: np.ndarray, sinks=None) -> np.ndarray:
    """The softmax of ``scores`` over the keys ``visible`` (broadcast), hidden keys at -inf: in
    place, the caller's scores."""
    np.copyto(scores, -np.inf, where=~np.asarray(visible, bool))
    return softmax(scores, sinks)


def scores_in_steps(
    q, k, *, scale=None, key_heads=grouped_heads, modify=modified_scores, softcap=None,
    alibi_slopes=None, key_lengths=None,
):  # fmt: skip
    """Q K^T * scale for query head h against key head ``key_heads``'s h (B, H, Tq, Tk), modified
    by ``modify`` (the truth: :func:`modified_scores`), in q's and k's own dtype."""
    scores = q @ k[:, key_heads(q.shape[1], k.shape[1])].swapaxes(-1, -2)
    scores *= resolve_scale(scale, q.shape[-1])  # in place: the same values, no second matrix
    return modify(scores, softcap=softcap, alibi_slopes=alibi_slopes, key_lengths=key_lengths)


def attention_in_steps(
    q, k, v, *, causal: bool = True, scale=None, visible=None, key_heads=grouped_heads,
    value_heads=None, modify=modified_scores, weights=masked_softmax, zero_padding: bool = True,
    softcap=None, alibi_slopes=None, sinks=None, **mask,
):  # fmt: skip
    """The formula step by step, in q's, k's and v's own dtype: the scores of each query head
    against its key head (``key_heads``), scaled and modified (``modify``); the keys each query
    sees (``visible``, by default the mask the keywords declare, spec.masks), a key counted m
    times weighing m; the softmax over them (``weights(scores, visible, sinks)``); the values of
    each query head's value head (``value_heads``, by default its key head's), their unread
    padding zeroed. The truth is every step as given here (:func:`reference_attention`); a
    mistake of spec.mistakes.forward replaces one."""
    tq, tk, heads = q.shape[-2], k.shape[-2], q.shape[1]
    key_lengths = mask.get("key_lengths")
    scores = scores_in_steps(q, k, scale=scale, key_heads=key_heads, modify=modify,
                             softcap=softcap, alibi_slopes=alibi_slopes,
                             key_lengths=key_lengths)  # fmt: skip
    mask = only_mask_options(mask)
    if visible is None:
        visible = (visible_keys(tq, tk, causal=causal, heads=heads, **mask) if mask
                   else causal_mask(tq, tk) if causal else np.ones((tq, tk), bool))  # fmt: skip
    counts = counted_keys(tq, tk, heads=heads, causal=causal, **mask) if mask else None
    if counts is not None:  # a key counted m times weighs m: exp(s + log m) = m exp(s)
        with np.errstate(divide="ignore"):
            scores += np.log(np.maximum(counts, 1)).astype(scores.dtype)
    v = v[:, (value_heads or key_heads)(heads, v.shape[1])]
    if zero_padding:
        v = unread_padding_zeroed(v, key_lengths=key_lengths)
    return weights(scores, visible, sinks) @ v


def masked(scores: np.ndarray, *, causal: bool, in_place: bool = False, **mask) -> np.ndarray:
    """``scores`` with -inf where a key is hidden: the document's causal mask, intersected with
    the kinds of spec.masks that ``mask``'s keywords turn on. ``in_place`` writes the -inf into
    ``scores`` itself, for a caller that owns them."""
    tq, tk = scores.shape[-2:]
    mask = only_mask_options(mask)
    if mask:
        visible = visible_keys(tq, tk, causal=causal, heads=scores.shape[-3], **mask)
        counts = counted_keys(tq, tk, heads=scores.shape[-3], causal=causal, **mask)
    elif causal:
        visible, counts = causal_mask(tq, tk), None
    else:
        return scores
    if counts is not None:  # a key counted m times weighs m: exp(s + log m) = m exp(s)
        with np.errstate(divide="ignore"):
            scores = np.add(scores, np.log(np.maximum(counts, 1)), out=scores if in_place else None)
        in_place = True
    if in_place:
        np.copyto(scores, -np.inf, where=~visible)
        return scores
    return np.where(visible, scores, -np.inf)


def reference_log_sum_exp(
    q, k, *, causal: bool = True, scale: float | None = None, sinks=None, **variant
) -> np.ndarray:
    """log(sum_j exp(x_ij)) over each row's visible keys of its scaled, modified scores,
    (B, H, Tq), in float64: a flash kernel's second output. A sink is not a key: its logit is
    left out. A row that sees no key has -inf. With padded query rows or packed sequences, each
    item or sequence alone (the padding's rows 0: no claim is made of them)."""
    split = _log_sum_exp_of_each(reference_log_sum_exp, q, k, causal=causal, scale=scale, **variant)
    if split is not None:
        return split
    scores = reference_masked_scores(q, k, causal=causal, scale=scale, **variant)
    top = scores.max(axis=-1, keepdims=True)
    finite_top = np.where(np.isneginf(top), 0.0, top)
    with np.errstate(divide="ignore"):  # log(0) = -inf: a row that sees no key
        return (finite_top + np.log(np.exp(scores - finite_top).sum(axis=-1, keepdims=True)))[
            ..., 0
        ]


def merge_states(
    outputs, lses, base: str = "e", work_dtype: str = "float64"
) -> tuple[np.ndarray, np.ndarray]:
    """One attention state from P partial ones over disjoint keys (split-KV, FlashDecoding):
    outputs (P, B, H, Tq, Dv) and their log-sum-exps (P, B, H, Tq) in ``base`` ("e" or "2").
    o = sum_i exp(lse_i - L) o_i with L = logsumexp_i lse_i; a part with lse = -inf (it saw no
    key) contributes nothing, whatever its output holds. Returns (out, lse) in float64, lse in
    ``base``; rows no part saw are 0 with lse -inf. ``work_dtype``: the arithmetic's dtype (a
    kernel's accumulation dtype, for the naive baseline of a shipped merge)."""
    work = np.dtype(work_dtype)
    outputs, lses = np.asarray(outputs, work), np.asarray(lses, work)
    top = lses.max(axis=0)  # (B, H, Tq), in the lses' own base
    finite_top = np.where(np.isneginf(top), work.type(0), top)
    # The difference first, in the lses' base (exact where they are close): converting large
    # base-2 values to the natural base before it would round them by their magnitude.
    exponents = lses - finite_top  # (P, B, H, Tq)
    if base == "2":
        exponents = exponents * work.type(math.log(2))
    weights = np.exp(exponents)  # 0 for an empty part
    seen = weights > 0
    contributions = np.where(seen[..., None], weights[..., None] * outputs, work.type(0))
    total = weights.sum(axis=0)  # (B, H, Tq)
    out = contributions.sum(axis=0) / np.where(total > 0, total, work.type(1))[..., None]
    with np.errstate(divide="ignore"):
        lse = finite_top + (np.log2(total) if base == "2" else np.log(total))
    return out.astype(np.float64), lse.astype(np.float64)


def naive_log_sum_exp(q, k, *, dtype: str, causal: bool = True, scale=None, sinks=None, **variant):
    """The log-sum-exp as a straightforward kernel in ``dtype`` keeps it: the scores and their
    sum in the accumulation dtype (float32 below float64). Float64 out; the oracle's own for
    float64."""
    split = _log_sum_exp_of_each(
        naive_log_sum_exp, q, k, dtype=dtype, causal=causal, scale=scale, **variant
    )
    if split is not None:
        return split
    work = np.dtype(accumulation_dtype(dtype))
    q, k = (np.asarray(x, work) for x in (q, repeat_kv_heads(q, k)))
    scores = q @ k.swapaxes(-1, -2)
    scores *= work.type(resolve_scale(scale, q.shape[-1]))
    modified_scores(
        scores,
        softcap=variant.pop("softcap", None),
        alibi_slopes=variant.pop("alibi_slopes", None),
        key_lengths=variant.get("key_lengths"),
    )
    scores = masked(scores, causal=causal, in_place=True, **variant)
    top = scores.max(axis=-1, keepdims=True)
    finite_top = np.where(np.isneginf(top), work.type(0), top)
    with np.errstate(divide="ignore"):
        lse = finite_top + np.log(np.exp(scores - finite_top).sum(axis=-1, keepdims=True))
    return lse[..., 0].astype(np.float64)


def _log_sum_exp_of_each(log_sum_exp, q, k, **options):
    """``log_sum_exp(q, k, ...)`` on each padded item or packed sequence, joined again (a piece
    with no key -inf); None for a call that is neither (see :func:`each_item_or_sequence`)."""

    def of_piece(q, k, v, **piece_options):  # v: the pieces' keys stand in; it is not read
        if k.shape[-2] == 0:  # a sequence with no key
            return np.full(q.shape[:-1], -np.inf)
        return log_sum_exp(q, k, **piece_options)

    return each_item_or_sequence(of_piece, q, k, k, **options)


def reference_weights(
    q, k, *, causal: bool = True, scale: float | None = None, sinks=None, **variant
):
    """softmax(mask(scores)) row by row, (B, H, Tq, Tk), in float64."""
    return softmax(reference_masked_scores(q, k, causal=causal, scale=scale, **variant), sinks)


def reference_attention(q, k, v, *, causal: bool = True, scale: float | None = None, **variant):
    """output[i] = sum_j A[i, j] V[j], (B, H, Tq, Dv), in float64."""
    if variant.get("cu_seqlens_q") is not None:
        return per_sequence(reference_attention, q, k, v, causal=causal, scale=scale, **variant)
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    return attention_in_steps(q, k, v, causal=causal, scale=scale, **variant)


def score_rounding_sensitivity(
    q, k, v, *, causal: bool = True, scale: float | None = None, sinks=None, **variant
):
    """How far the output moves, per unit of relative error, when every score is rounded by the
    size of its dot product, (B, H, Tq, Dv), in float64: the bound sqrt(sum_j w_ij (v_jd -
    o_id)^2) * sqrt(sum_j w_ij m_ij^2), where m_ij = max(|s_ij|, |scale| sum_d |q_id k_jd|).

    A score off by e_ij moves o_id by sum_j w_ij (v_jd - o_id) e_ij to first order (the weights'
    own shift, w_ij (e_ij - sum_k w_ik e_ik), times V; a sink, which is not rounded, changes
    nothing of it); with |e_ij| <= m_ij, Cauchy-Schwarz bounds that by the product above, per
    unit. A dot product errs by a share of the sum of its terms' sizes, not of its result: where
    the terms cancel (D = 576 of MLA: that sum is tens of times |s| at the median key) the
    result's own size would understate it. The bound is large on a row whose top scores are
    large and nearly tied over different values: there any two correct evaluations of the scores
    disagree, whichever is exact by chance. Rows that see no key, and values no row reads, count
    0."""
    if variant.get("cu_seqlens_q") is not None:
        return per_sequence(
            score_rounding_sensitivity, q, k, v, causal=causal, scale=scale, sinks=sinks, **variant
        )
    scores = reference_masked_scores(q, k, causal=causal, scale=scale, **variant)
    weights = np.nan_to_num(softmax(scores, sinks), nan=0.0, copy=False)  # a row with no key: 0
    v = unread_padding_zeroed(repeat_kv_heads(q, np.asarray(v, np.float64)), **variant)
    v = np.where(np.isfinite(v), v, 0.0)  # a non-finite value is judged by its own tests
    out = weights @ v
    # sum_j w_ij (v_jd - o_id)^2, expanded into products; sinks leave sum_j w_ij below 1
    spread = weights @ (v * v) - 2 * out * out + out * out * weights.sum(-1, keepdims=True)
    # In place, as softmax: on ANDREA's twelve heads each fresh (Tq, Tk) array costs as much as
    # the arithmetic, so the terms' sizes are the one more. Hidden keys (-inf, weight 0) count 0.
    terms_size = reference_scores(
        np.abs(np.asarray(q, np.float64)),
        np.abs(repeat_kv_heads(q, np.asarray(k, np.float64))),
        abs(resolve_scale(scale, q.shape[-1])),
    )
    np.abs(scores, out=scores)
    np.maximum(scores, terms_size, out=scores)
    del terms_size
    np.copyto(scores, 0.0, where=weights == 0)
    np.multiply(scores, scores, out=scores)
    score_size = weights[..., None, :] @ scores[..., :, None]  # sum_j w_ij m_ij^2, (B, H, Tq, 1, 1)
    score_size = score_size[..., 0]  # (B, H, Tq, 1)
    return np.sqrt(np.maximum(spread, 0.0) * score_size)


# The query-token axis of what attention returns: outputs (B, H, Tq, Dv) and log-sum-exps
# (B, H, Tq) alike.
TOKEN_AXIS = 2


def joined(pieces: list, axis: int, concatenate=np.concatenate):
    """Arrays joined along ``axis``, or (out, lse) pairs joined pair by pair."""
    if isinstance(pieces[0], tuple):
        return tuple(concatenate(list(parts), axis) for parts in zip(*pieces, strict=True))
    return concatenate(pieces, axis)


def per_sequence(
    attend, q, k, v, *, cu_seqlens_q, cu_seqlens_k, concatenate=np.concatenate, **options
):
    """``attend`` on each packed sequence alone, what it returns (an output, or an output and
    its log-sum-exp) packed again by ``concatenate``, NumPy's or another library's: sequence s
    holds query rows cu_seqlens_q[s] .. cu_seqlens_q[s + 1] - 1 and keys cu_seqlens_k[s] ..
    cu_seqlens_k[s + 1] - 1 of a batch of one (FlashAttention's varlen form), and sees nothing
    of the others."""
    bounds = zip(itertools.pairwise(cu_seqlens_q), itertools.pairwise(cu_seqlens_k), strict=True)
    pieces = [
        attend(q[..., qa:qb, :], k[..., ka:kb, :], v[..., ka:kb, :],
               **cut_to_item(options, s, slice(qa, qb), slice(ka, kb)))
        for s, ((qa, qb), (ka, kb)) in enumerate(bounds)
    ]  # fmt: skip
    return joined(pieces, TOKEN_AXIS, concatenate)


def padded_items(
    attend,
    q,
    k,
    v,
    *,
    query_lengths,
    key_lengths=None,
    concatenate=np.concatenate,
    zeros=None,
    **options,
):
    """``attend`` on each batch item's first Lq_b queries and first L_b keys alone, the rows past
    Lq_b (padding) of what it returns (an output, or an output and its log-sum-exp) filled by
    ``zeros(shape, like)``, the items joined again along the batch axis (``concatenate`` and
    ``zeros`` are NumPy's unless another library's are given)."""
    zeros = zeros or (lambda shape, like: np.zeros(shape, dtype=like.dtype))
    key_lengths = [k.shape[-2]] * q.shape[0] if key_lengths is None else key_lengths
    items = []
    for b, (queries, keys) in enumerate(zip(query_lengths, key_lengths, strict=True)):
        rows = attend(
            q[b : b + 1, :, :queries], k[b : b + 1, :, :keys], v[b : b + 1, :, :keys],
            **cut_to_item(options, b, slice(0, queries), slice(0, keys)),
        )  # fmt: skip
        padding = padding_of(rows, q.shape[-2] - queries, zeros)
        items.append(joined([rows, padding], TOKEN_AXIS, concatenate))
    return joined(items, 0, concatenate)


def padding_of(rows, count: int, zeros):
    """Zeros for ``count`` padded query rows of ``rows`` (1, H, Lq_b, ...), or of each part of an
    (out, lse) pair."""
    if isinstance(rows, tuple):
        return tuple(padding_of(part, count, zeros) for part in rows)
    return zeros((*rows.shape[:TOKEN_AXIS], count, *rows.shape[TOKEN_AXIS + 1 :]), rows)


def each_item_or_sequence(
    attend,
    q,
    k,
    v,
    *,
    query_lengths=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    concatenate=np.concatenate,
    zeros=None,
    **options,
):
    """``attend`` on each item of a batch with padded query rows (:func:`padded_items`) or on
    each sequence of a packed batch (:func:`per_sequence`); None for a batch that is neither, which
    the caller computes whole."""
    if query_lengths is not None:
        return padded_items(
            attend, q, k, v, query_lengths=query_lengths, concatenate=concatenate, zeros=zeros,
            **options,
        )  # fmt: skip
    if cu_seqlens_q is not None:
        return per_sequence(
            attend, q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            concatenate=concatenate, **options,
        )  # fmt: skip
    return None


def unread_padding_zeroed(v: np.ndarray, *, key_lengths=None, **_) -> np.ndarray:
    """v with the padding past each item's key length set to 0: no row reads it, and a NaN there
    must not reach a row through a weight of 0 (0 * NaN is NaN)."""
    if key_lengths is None:
        return v
    beyond = np.arange(v.shape[-2])[None, :] >= np.asarray(key_lengths)[:, None]  # (B, Tk)
    return np.where(beyond[:, None, :, None], 0.0, v)


def reference_vjp(q, k, v, grad_out, *, causal: bool = True, scale: float | None = None):
    """Gradients (dq, dk, dv) of sum(attention(q, k, v) * grad_out), in float64: the plain
    formula's case of :func:`reference_feature_vjp`."""
    grads = reference_feature_vjp(q, k, v, grad_out, causal=causal, scale=scale)
    return grads["q"], grads["k"], grads["v"]


# Keywords whose backward reference_feature_vjp knows, and the masks' declared conventions (a
# key listed twice weighing twice: its weight, and so every gradient through it); others are
# refused by name.
DIFFERENTIATED_FEATURES = DIFFERENTIATED_KEYWORDS | frozenset(MASK_CONVENTIONS)


def reference_feature_vjp(
    q, k, v, grad_out, *, causal: bool = True, scale: float | None = None, grad_lse=None,
    sinks=None, **variant,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The gradients of L = sum(out * grad_out) + sum(lse * grad_lse) with respect to q, k, v
    and, where ``sinks`` are given, each head's sink logit, in float64, derived by hand (not by
    differentiating the forward): {"q", "k", "v"[, "sinks"]}, lse in the natural base.

    With x the modified, masked scores (softcap c tanh(s / c) of s = scale q k^T, ALiBi's bias,
    -inf where hidden), w = exp(x) / (sum exp(x) + exp(sink)), out = w V and lse = log sum exp(x):
      dV = w^T dO;  dw = dO V^T;  dx = w (dw - rowsum(w dw)) + dLSE exp(x - lse);
      ds = dx (1 - (x_cap / c)^2) under a softcap (x_cap the capped score);  dQ = scale ds K;
      dK = scale ds^T Q;  d(sink_h) = -sum over its rows of p_sink rowsum(w dw), p_sink = 1 -
      sum_j w_j.
    Grouped heads sum dK and dV over each group; hidden keys, padding and keys of other packed
    sequences get exactly 0, and so does every gradient of a row that sees no key (its weights
    are taken as 0, its lse's gradient too), never NaN."""
    _check_differentiated(variant)
    q, k, v, grad_out = (np.asarray(x, np.float64) for x in (q, k, v, grad_out))
    if variant.get("cu_seqlens_q") is not None:
        return _per_sequence_vjp(
            reference_feature_vjp, q, k, v, grad_out, causal=causal, scale=scale,
            grad_lse=grad_lse, sinks=sinks, **variant,
        )  # fmt: skip
    weights, capped = backward_weights(q, k, causal=causal, scale=scale, sinks=sinks, **variant)
    return backward_steps(
        weights, q, repeat_kv_heads(q, k), grad_out, k=k, v=v,
        scale=resolve_scale(scale, q.shape[-1]), capped=capped, softcap=variant.get("softcap"),
        grad_lse=grad_lse, sinks=sinks, key_lengths=variant.get("key_lengths"),
    )  # fmt: skip


def backward_weights(q, k, *, causal=True, scale=None, sinks=None, **variant):
    """What the backward pass starts from, in float64: the weights (B, H, Tq, Tk), 0 on a row that
    sees no key, and the softcapped scores before ALiBi and the mask (the scaled scores where
    there is no softcap), whose dtanh the backward needs."""
    raw = reference_scores(q, repeat_kv_heads(q, k), scale)  # (B, H, Tq, Tk)
    softcap = variant.get("softcap")
    capped = raw if softcap is None else softcap * np.tanh(raw / softcap)
    scores = modified_scores(capped.copy(), alibi_slopes=variant.get("alibi_slopes"),
                             key_lengths=variant.get("key_lengths"))  # fmt: skip
    scores = masked(scores, causal=causal, in_place=True, **mask_options(variant))
    with np.errstate(invalid="ignore"):
        weights = np.nan_to_num(softmax(scores, sinks), nan=0.0)  # a row with no key: 0
    return weights, capped


def keys_read_and_blind_rows(tq: int, tk: int, *, causal=True, heads: int = 1,
                             cu_seqlens_q=None, cu_seqlens_k=None, **options):  # fmt: skip
    """Which keys some query row of a head sees, (B or 1, H or 1, Tk), and which query rows see
    no key at all, (B or 1, H or 1, Tq): a key no row reads has gradient exactly 0, and so has a
    row that sees nothing (the packed sequences each alone)."""
    mask = mask_options(options)
    if cu_seqlens_q is None:
        visible = visible_keys(tq, tk, causal=causal, heads=heads, **mask)  # (B|1, H|1, Tq, Tk)
        return visible.any(axis=2), ~visible.any(axis=3)
    read, blind = np.zeros((1, 1, tk), bool), np.ones((1, 1, tq), bool)
    for s, ((q0, q1), (k0, k1)) in enumerate(zip(
        itertools.pairwise(cu_seqlens_q), itertools.pairwise(cu_seqlens_k), strict=True
    )):  # fmt: skip
        piece = cut_to_item(mask, s, slice(q0, q1), slice(k0, k1))
        visible = visible_keys(q1 - q0, k1 - k0, causal=causal, **piece)[0, 0]
        read[0, 0, k0:k1], blind[0, 0, q0:q1] = visible.any(axis=0), ~visible.any(axis=1)
    return read, blind


def backward_steps(
    weights, q, keys, grad_out, *, k, v, scale, capped, softcap, grad_lse, sinks, key_lengths,
    rounded=lambda x: x, row_dot=None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The backward pass from the weights (B, H, Tq, Tk) on: the steps of
    :func:`reference_feature_vjp`, each product passed through ``rounded`` (the naive baseline's
    rounding to its dtype; nothing for the oracle). ``row_dot``: rowsum(P dP), (B, H, Tq, 1),
    where a caller takes it from elsewhere (a flash kernel: rowsum(dO * O) of its saved O)."""
    values = unread_padding_zeroed(repeat_kv_heads(q, v), key_lengths=key_lengths)
    grad_values = rounded(weights.swapaxes(-1, -2) @ grad_out)  # (B, H, Tk, Dv)
    grad_weights = rounded(grad_out @ values.swapaxes(-1, -2))  # (B, H, Tq, Tk)
    if row_dot is None:
        row_dot = (weights * grad_weights).sum(axis=-1, keepdims=True)  # (B, H, Tq, 1)
    grad_scores = weights * (grad_weights - row_dot)
    seen = weights.sum(axis=-1, keepdims=True)  # 1 - p_sink; 0 on a row that sees no key
    if grad_lse is not None:
        share = weights / np.where(seen > 0, seen, 1.0)  # exp(x - lse): the sink's not in lse
        grad_scores = grad_scores + np.asarray(grad_lse, np.float64)[..., None] * share
    if softcap is not None:
        grad_scores = grad_scores * (1.0 - (capped / softcap) ** 2)  # dtanh
    grad_scores = rounded(grad_scores)
    grads = {
        "q": rounded(scale * grad_scores @ keys),
        "k": rounded(_summed_over_groups(scale * grad_scores.swapaxes(-1, -2) @ q, k)),
        "v": rounded(_summed_over_groups(grad_values, v)),
    }
    if sinks is not None:
        grads["sinks"] = rounded(-((1.0 - seen) * row_dot).sum(axis=(0, 2, 3)))  # (H,)
    return grads


def gradient_magnitudes(
    q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, sinks=None, **variant
) -> dict[str, float]:
    """The size of the terms each gradient of :func:`reference_feature_vjp` sums, its largest
    element with every term taken by its absolute value: dS's |P| (|dP| + |rowsum(P dP)|) (+
    |dLSE| exp(x - lse)), times |dtanh|, through |K| or |Q|; |P|^T |dO| for dV. Rounding errors
    scale with these, not with the gradient, which cancels to 0 where a row's weight sits on one
    key. {"q", "k", "v"[, "sinks"]}."""
    if variant.get("cu_seqlens_q") is not None:
        pieces = _per_sequence_vjp(
            _magnitude_arrays, q, k, v, grad_out, causal=causal, scale=scale, grad_lse=grad_lse,
            sinks=sinks, **variant,
        )  # fmt: skip
    else:
        pieces = _magnitude_arrays(q, k, v, grad_out, causal=causal, scale=scale,
                                   grad_lse=grad_lse, sinks=sinks, **variant)  # fmt: skip
    return {name: float(np.max(piece, initial=0.0)) for name, piece in pieces.items()}


def _magnitude_arrays(q, k, v, grad_out, *, causal, scale, grad_lse, sinks, **variant):
    """:func:`gradient_magnitudes` before the maximum, as arrays of the gradients' shapes."""
    q, k, v, grad_out = (np.asarray(x, np.float64) for x in (q, k, v, grad_out))
    weights, capped = backward_weights(q, k, causal=causal, scale=scale, sinks=sinks, **variant)
    scale = resolve_scale(scale, q.shape[-1])
    values = unread_padding_zeroed(repeat_kv_heads(q, v), key_lengths=variant.get("key_lengths"))
    grad_weights = grad_out @ values.swapaxes(-1, -2)  # (B, H, Tq, Tk)
    row_dot = (weights * grad_weights).sum(axis=-1, keepdims=True)  # (B, H, Tq, 1)
    terms = weights * (np.abs(grad_weights) + np.abs(row_dot))  # |dS|'s bound, (B, H, Tq, Tk)
    seen = weights.sum(axis=-1, keepdims=True)
    if grad_lse is not None:
        share = weights / np.where(seen > 0, seen, 1.0)
        terms += np.abs(np.asarray(grad_lse, np.float64))[..., None] * share
    softcap = variant.get("softcap")
    if softcap is not None:
        terms *= np.abs(1.0 - (capped / softcap) ** 2)
    keys = np.abs(repeat_kv_heads(q, k))
    magnitudes = {
        "q": scale * terms @ keys,
        "k": _summed_over_groups(scale * terms.swapaxes(-1, -2) @ np.abs(q), k),
        "v": _summed_over_groups(weights.swapaxes(-1, -2) @ np.abs(grad_out), v),
    }
    if sinks is not None:
        magnitudes["sinks"] = ((1.0 - seen) * np.abs(row_dot)).sum(axis=(0, 2, 3))
    return magnitudes


def _check_differentiated(variant: dict) -> None:
    unknown = sorted(name for name, value in variant.items()
                     if value is not None and name not in DIFFERENTIATED_FEATURES)  # fmt: skip
    if unknown:
        raise ValueError(f"no backward for {', '.join(unknown)}: the backward's features are "
                         f"{', '.join(sorted(DIFFERENTIATED_FEATURES))}")  # fmt: skip


def _summed_over_groups(grad: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """A gradient over Hq query heads' copies of k or v summed back onto its Hkv heads: each
    key/value head's gradient is the sum over the query heads of its group."""
    heads, kv_heads = grad.shape[-3], kv.shape[-3]
    if heads == kv_heads:
        return grad
    group = heads // kv_heads
    # (B, Hq, T, D) -> (B, Hkv, g, T, D), summed over g
    return grad.reshape(*grad.shape[:-3], kv_heads, group, *grad.shape[-2:]).sum(axis=-3)


def _per_sequence_vjp(vjp, q, k, v, grad_out, *, cu_seqlens_q, cu_seqlens_k, grad_lse=None,
                      sinks=None, **options):  # fmt: skip
    """``vjp`` of packed sequences: each sequence alone, its gradients placed back at its rows;
    nothing flows across a boundary."""
    grads = {"q": np.zeros_like(q), "k": np.zeros_like(k), "v": np.zeros_like(v)}
    if sinks is not None:
        grads["sinks"] = np.zeros(q.shape[-3])
    bounds_q, bounds_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    for s, ((q0, q1), (k0, k1)) in enumerate(zip(
        itertools.pairwise(bounds_q), itertools.pairwise(bounds_k), strict=True
    )):  # fmt: skip
        rows, keys = slice(q0, q1), slice(k0, k1)
        piece = vjp(
            q[..., rows, :], k[..., keys, :], v[..., keys, :], grad_out[..., rows, :],
            grad_lse=None if grad_lse is None else np.asarray(grad_lse)[..., rows],
            sinks=sinks, **cut_to_item(options, s, rows, keys),
        )  # fmt: skip
        grads["q"][..., rows, :] = piece["q"]
        grads["k"][..., keys, :] = piece["k"]
        grads["v"][..., keys, :] = piece["v"]
        if sinks is not None:
            grads["sinks"] += piece["sinks"]
    return grads


# The naive baseline: the yardstick of the error budget (conformance/judge/tolerance.py): the
# formula above evaluated step by step in the dtype under test, every intermediate rounded to it
# and sums in float32, as a straightforward kernel in that dtype computes it.


def naive_baseline_weights(
    q, k, *, dtype: str, causal: bool = True, scale: float | None = None, **variant
):
    """The weights softmax(mask(q k^T * scale)) as a straightforward kernel in ``dtype`` has them:
    the score matmul and the weights stored in the dtype, float32 accumulation. Float64 out."""
    return _naive_weights(q, k, dtype=dtype, causal=causal, scale=scale, **variant).astype(
        np.float64
    )


def _naive_weights(
    q,
    k,
    *,
    dtype: str,
    causal: bool,
    scale: float | None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    **variant,
):
    """:func:`naive_baseline_weights` held in the accumulation dtype, where the products that
    follow read them. The modified scores are rounded to the dtype, as a kernel storing them
    there has them."""
    scores = _naive_scores(q, repeat_kv_heads(q, k), dtype=dtype, scale=scale)
    if softcap is not None or alibi_slopes is not None:
        scores = np.array(scores)  # the rounded scores may be a view of the inputs' products
        modified_scores(
            scores,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            key_lengths=variant.get("key_lengths"),
        )
        scores = np.array(_rounded(scores, dtype))
    weights = softmax(masked(scores, causal=causal, in_place=True, **variant), sinks)
    return _rounded(weights, dtype)


def _naive_scores(q, keys, *, dtype: str, scale: float | None) -> np.ndarray:
    """The scaled scores (B, H, Tq, Tk) as a kernel in ``dtype`` stores them: the product and
    its scaling each rounded to the dtype."""
    q, keys = _rounded(q, dtype), _rounded(keys, dtype)
    scale = _accumulation(dtype)(resolve_scale(scale, q.shape[-1]))
    return _rounded(_rounded(q @ keys.swapaxes(-1, -2), dtype) * scale, dtype)


def naive_baseline(
    q, k, v, *, dtype: str, causal: bool = True, scale: float | None = None, **variant
):
    """The formula in ``dtype``: every intermediate rounded to it, accumulation in float32.

    This is what a straightforward kernel in that dtype computes (matmul outputs and the softmax
    weights stored in the dtype), so its error is the yardstick for the dtype. Returns float64.
    """
    if variant.get("cu_seqlens_q") is not None:
        return per_sequence(
            naive_baseline, q, k, v, dtype=dtype, causal=causal, scale=scale, **variant
        )
    weights = _naive_weights(q, k, dtype=dtype, causal=causal, scale=scale, **variant)
    v = unread_padding_zeroed(repeat_kv_heads(q, v), **variant)
    return _rounded(weights @ _rounded(v, dtype), dtype).astype(np.float64)


def naive_baseline_vjp(
    q, k, v, grad_out, *, dtype: str, causal=True, scale=None, grad_lse=None, sinks=None,
    **variant,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The gradients of :func:`reference_feature_vjp` as a straightforward backward pass in
    ``dtype`` computes them: the same steps with every product rounded to the dtype and sums in
    the accumulation dtype. Float64 out, {"q", "k", "v"[, "sinks"]}."""
    _check_differentiated(variant)
    if variant.get("cu_seqlens_q") is not None:
        return _per_sequence_vjp(
            naive_baseline_vjp, q, k, v, grad_out, dtype=dtype, causal=causal, scale=scale,
            grad_lse=grad_lse, sinks=sinks, **variant,
        )  # fmt: skip
    q, k, v, grad_out = (_rounded(x, dtype) for x in (q, k, v, grad_out))
    with np.errstate(invalid="ignore"):  # a row with no key: 0
        weights = _naive_weights(q, k, dtype=dtype, causal=causal, scale=scale, sinks=sinks,
                                 **variant)  # fmt: skip
    weights = np.nan_to_num(weights, nan=0.0)
    softcap = variant.get("softcap")
    capped = None
    if softcap is not None:
        scores = _naive_scores(q, repeat_kv_heads(q, k), dtype=dtype, scale=scale)
        capped = _rounded(softcap * np.tanh(scores / softcap), dtype)
    grads = backward_steps(
        weights, q, repeat_kv_heads(q, k), grad_out, k=k, v=v,
        scale=_accumulation(dtype)(resolve_scale(scale, q.shape[-1])), capped=capped,
        softcap=softcap, grad_lse=grad_lse, sinks=sinks, key_lengths=variant.get("key_lengths"),
        rounded=lambda x: _rounded(x, dtype),
    )  # fmt: skip
    return {name: grad.astype(np.float64) for name, grad in grads.items()}


def accumulation_dtype(dtype: str) -> str:
    """Where a kernel in ``dtype`` sums: float64 for float64, float32 for everything narrower."""
    return "float64" if check_dtype(dtype) == "float64" else "float32"


def _accumulation(dtype: str):
    return np.dtype(accumulation_dtype(dtype)).type


def _rounded(x, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` and held where a kernel in it accumulates: the values of
    ``round_to(x, dtype).astype(accumulation)``, without its float64 round trip (four fresh
    copies of every score matrix, a third of the default run's time). ``x`` itself when it is
    already there: never write into the result."""
    return rounded_in_storage(np.asarray(x), dtype).astype(_accumulation(dtype), copy=False)


# --- paged key/value caches (the paged feature) ---------------------------------------------------


def page_pool(kv: np.ndarray, key_lengths, page_size: int, rng: np.random.Generator, *,
              unowned=np.nan, past=np.inf):  # fmt: skip
    """A dense (B, Hkv, Tk, D) cache laid out as a serving engine's page pool: (pages, page_size,
    Hkv, D) with twice the pages the items need, in random order, and the block table (B,
    max_pages) of int32 page indices. Pages no table points to hold ``unowned`` (NaN), the slots
    of an item's last page past its length ``past`` (+inf), and a table's entries past an item's
    pages point at an unowned page: a kernel that reads any of them shows it. A pool of bytes
    takes the bytes that read as NaN in its format (spec.block_scaled.unread_bytes), a value or
    a token's worth. Returns (pool, block_table)."""
    batch, heads, tk, dim = kv.shape
    lengths = [tk] * batch if key_lengths is None else [int(n) for n in key_lengths]
    pages_of = [-(-n // page_size) for n in lengths]  # ceil(L_b / page_size)
    needed = sum(pages_of)
    total = 2 * needed + 1  # unused pages, at least one for the tables' spare entries
    dtype = kv.dtype if kv.dtype == np.uint8 else np.float64
    pool = np.empty((total, page_size, heads, dim), dtype)
    pool[...] = unowned
    order = rng.permutation(total)
    table = np.full((batch, max(max(pages_of), 1)), order[-1], dtype=np.int32)  # a NaN page
    used = iter(order[:needed])
    for b, (length, pages) in enumerate(zip(lengths, pages_of, strict=True)):
        for p in range(pages):
            page = next(used)
            table[b, p] = page
            slots = min(page_size, length - p * page_size)
            pool[page, :slots] = kv[b, :, p * page_size : p * page_size + slots].transpose(1, 0, 2)
            pool[page, slots:] = past  # past the item's length
    return pool, table


def gathered_pages(pool: np.ndarray, block_table, key_lengths) -> np.ndarray:
    """The dense (B, Hkv, max L_b, D) cache of a page pool: item b's pages in table order, cut at
    its length L_b, zeros past it (never read where the key lengths mask them)."""
    table = np.asarray(block_table)
    lengths = [int(n) for n in key_lengths]
    page_size, heads, dim = pool.shape[1:]
    dense = np.zeros((len(lengths), heads, max(max(lengths), 1), dim), dtype=pool.dtype)
    for b, length in enumerate(lengths):
        pages = table[b, : -(-length // page_size)]
        keys = pool[pages].reshape(-1, heads, dim)[:length]  # (L_b, Hkv, D)
        dense[b, :, :length] = keys.transpose(1, 0, 2)
    return dense
