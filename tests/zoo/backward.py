"""Zoo members with a backward pass: a right forward and a backward with one bug each, as
training kernels shipped them (softcap without dtanh, a group reduced from one head, the
backward's mask not the forward's, a bias or a sink left out of the recomputed P, NaN on rows
that see nothing, packed sequences read across, a last partial tile without gradient), and
correct roads (FlashAttention 2's recompute from the lse, the same in base 2, the weights kept
from the forward).

Each member is a plain callable whose backward is its ``vjp`` attribute (the contract's
``fn.vjp``); its signature names the features it declares. The backward below is written here,
flash-style, not taken from the oracle.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from impls.contract import resolve_scale
from spec.catalogue import load_catalogue
from spec.formula import query_positions, visible_keys
from spec.mistakes.gradients import last_reader
from tests.zoo import correct_variant, mutant

TILE = 64  # the key tile of the members whose backward loops over tiles
# What the correct backwards other than flash_backward_from_the_lse are judged on in the project's
# tests: their forward is its forward, judged on every claim there
GRADIENT_CLAIMS = (
    "OUT-GRAD",
    "MASK-GRAD",
    *(claim.id for claim in load_catalogue() if claim.group == "gradients"),
)


def scores_and_mask(q, k, *, causal, scale, key_lengths=None, softcap=None, alibi_slopes=None,
                    **mask):  # fmt: skip
    """(x, capped, visible): the modified scores (B, H, Tq, Tk) in q's dtype with -inf where
    hidden, the capped scores before the bias (for dtanh), and the mask."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)  # (B, Hkv, T, D) -> (B, H, T, D)
    raw = q @ k.swapaxes(-1, -2) * q.dtype.type(resolve_scale(scale, q.shape[-1]))
    capped = raw if softcap is None else q.dtype.type(softcap) * np.tanh(raw / softcap)
    scores = capped
    tq, tk = raw.shape[-2:]
    if alibi_slopes is not None:
        distance = np.abs(query_positions(tq, tk, key_lengths) - np.arange(tk))  # (B, Tq, Tk)
        slopes = np.asarray(alibi_slopes, q.dtype)[:, None, None]  # (H, 1, 1)
        scores = scores - slopes * distance[:, None].astype(q.dtype)
    visible = visible_keys(tq, tk, causal=causal, heads=q.shape[1], key_lengths=key_lengths,
                           **mask)  # fmt: skip
    return np.where(visible, scores, -np.inf), capped, visible


def log_sum_exp(scores, sinks=None):
    """(B, H, Tq): log of each row's denominator, the sink's term in it where given; -inf for a
    row that sees nothing and has no sink."""
    top = scores.max(axis=-1)
    if sinks is not None:
        top = np.maximum(top, np.asarray(sinks, scores.dtype)[:, None])
    shift = np.where(np.isfinite(top), top, 0)
    total = np.exp(scores - shift[..., None]).sum(axis=-1)
    if sinks is not None:
        total += np.exp(np.asarray(sinks, scores.dtype)[:, None] - shift)
    with np.errstate(divide="ignore"):
        return shift + np.log(total)


def forward(q, k, v, *, causal=True, scale=None, sinks=None, key_lengths=None, **features):
    """The attention output in q's dtype: exp(x - lse) V, rows that see no key 0."""
    if k.shape[-2] == 0:
        return np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    scores, _, _ = scores_and_mask(q, k, causal=causal, scale=scale, key_lengths=key_lengths,
                                   **features)  # fmt: skip
    lse = log_sum_exp(scores, sinks)
    with np.errstate(invalid="ignore"):  # a row that sees no key: -inf - -inf, set to 0
        weights = np.where(np.isfinite(lse)[..., None], np.exp(scores - lse[..., None]), 0)
    v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    if key_lengths is not None:  # padding's values never read, whatever they hold
        padding = np.arange(v.shape[-2])[None, :] >= np.asarray(key_lengths)[:, None]
        v = np.where(padding[:, None, :, None], v.dtype.type(0), v)
    return (weights @ v).astype(q.dtype)


def backward(q, k, v, grad_out, *, causal=True, scale=None, sinks=None, key_lengths=None,
             bug=None, base_2=False, keep_weights=False, **features):  # fmt: skip
    """(dq, dk, dv[, dsinks]) in q's dtype: P recomputed from the lse, as FlashAttention 2 does,
    with ``bug`` one of the mistakes below (None: none); ``base_2`` computes every exponential as
    exp2 of scores times log2(e); ``keep_weights`` takes P as the forward's softmax."""
    dtype = q.dtype
    window = features.get("window")
    scores, capped, _ = scores_and_mask(
        q, k, causal=causal, scale=scale, key_lengths=key_lengths, **features
    )
    lse = log_sum_exp(scores, sinks)  # the forward's, the sink's term in it
    recomputed = scores
    if bug in ("window-wider", "window-not-causal") and window is None:
        bug = None  # no window, no bug
    if bug == "no-custom-mask" and features.get("attn_mask") is None:
        bug = None
    if bug in ("sparse-minus-1-last", "sparse-assigned") and features.get("kv_indices") is None:
        bug = None
    if bug in ("window-wider", "window-not-causal", "no-bias", "no-custom-mask",
               "sparse-minus-1-last"):  # fmt: skip
        changed = dict(features)
        if bug == "no-custom-mask":
            changed["attn_mask"] = None
        if bug == "sparse-minus-1-last":  # an empty slot used as an index: the last key
            indices = features["kv_indices"]
            changed["kv_indices"] = np.where(indices < 0, k.shape[-2] - 1, indices)
        if bug == "window-wider":
            changed["window"] = window + 1
        if bug == "no-bias":
            changed["alibi_slopes"] = None
        recomputed, _, _ = scores_and_mask(
            q, k, causal=causal and bug != "window-not-causal", scale=scale,
            key_lengths=key_lengths, **changed,
        )  # fmt: skip
        if bug == "window-not-causal":  # the window on both sides of each row
            tq, tk = scores.shape[-2:]
            ahead = np.arange(tk) - query_positions(tq, tk, key_lengths) > window  # (B, Tq, Tk)
            recomputed = np.where(ahead[:, None], -np.inf, recomputed)
    if bug == "no-sink":  # the lse of the keys alone
        lse = log_sum_exp(scores)
    seen = np.isfinite(lse)[..., None]
    if bug == "nan-blind":
        seen = np.ones_like(seen)
    with np.errstate(invalid="ignore", over="ignore"):
        if base_2:
            log2e = dtype.type(math.log2(math.e))
            probs = np.exp2(recomputed * log2e - np.where(seen, lse[..., None], 0) * log2e)
        else:
            probs = np.exp(recomputed - np.where(seen, lse[..., None], 0))
    probs = np.where(seen, probs, 0)
    if keep_weights:  # the forward's softmax, kept instead of recomputed
        top = np.max(scores, axis=-1, keepdims=True)
        if sinks is not None:
            top = np.maximum(top, np.asarray(sinks, dtype)[:, None, None])
        top = np.where(np.isfinite(top), top, 0)
        weights = np.exp(scores - top)
        total = weights.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total += np.exp(np.asarray(sinks, dtype)[:, None, None] - top)
        probs = np.where(total > 0, weights / np.where(total > 0, total, 1), 0)
    group = q.shape[1] // k.shape[1]
    keys, values = (np.repeat(x, group, axis=1) for x in (k, v))  # (B, H, Tk, D)
    if key_lengths is not None:
        padding = np.arange(v.shape[-2])[None, :] >= np.asarray(key_lengths)[:, None]
        values = np.where(padding[:, None, :, None], dtype.type(0), values)
    out = forward(
        q, k, v, causal=causal, scale=scale, sinks=sinks, key_lengths=key_lengths, **features
    )  # the output the forward saved; fmt: skip
    row_dot = (grad_out * out).sum(axis=-1, keepdims=True)  # rowsum(dO * O), (B, H, Tq, 1)
    grad_values = probs.swapaxes(-1, -2) @ grad_out
    grad_scores = probs * (grad_out @ values.swapaxes(-1, -2) - row_dot)
    if (softcap := features.get("softcap")) and bug != "no-dtanh":
        grad_scores *= 1 - (capped / dtype.type(softcap)) ** 2
    scale = dtype.type(resolve_scale(scale, q.shape[-1]))
    grad_q = scale * grad_scores @ keys
    if bug == "random-order":  # dq's key tiles summed as they finish: in a new order each call
        grad_q = np.zeros_like(grad_q)
        for start in np.random.default_rng().permutation(range(0, k.shape[-2], 16)):
            tile = slice(start, start + 16)
            grad_q += scale * grad_scores[..., tile] @ keys[..., tile, :]
    grad_keys = scale * grad_scores.swapaxes(-1, -2) @ q
    if bug == "last-tile":  # the key loop over whole tiles only
        whole = k.shape[-2] // TILE * TILE
        grad_keys[..., whole:, :] = 0
        grad_values[..., whole:, :] = 0
    grads = []
    for grad in (grad_keys, grad_values):
        per_group = grad.reshape(grad.shape[0], k.shape[1], group, *grad.shape[2:])
        grads.append(per_group[:, :, 0] if bug == "one-head" else per_group.sum(axis=2))
    if bug == "sparse-assigned":  # each key's dk and dv stored by the last row that reads it
        read = probs > 0
        grads = [
            last_reader(scale * grad_scores[..., None] * q[..., :, None, :], read, k.shape[1]),
            last_reader(probs[..., None] * grad_out[..., :, None, :], read, k.shape[1]),
        ]
    answer = [grad_q, *grads]
    if sinks is not None:
        sink_share = np.where(seen, np.exp(np.asarray(sinks, dtype)[:, None, None] - np.where(
            seen, lse[..., None], 0)), 0)  # fmt: skip
        grad_sinks = -(sink_share * row_dot).sum(axis=(0, 2, 3))
        answer.append(np.zeros_like(grad_sinks) if bug in ("no-sink", "sink-constant")
                      else grad_sinks)  # fmt: skip
    return tuple(a.astype(dtype) for a in answer)


def packed_backward(q, k, v, grad_out, *, cu_seqlens_q, cu_seqlens_k, bug=None, **options):
    """:func:`backward` of each packed sequence alone, or with ``bug`` "packed-cross", of the
    whole batch as one sequence."""
    if bug == "packed-cross":
        return backward(q, k, v, grad_out, **options)
    grads = [np.zeros_like(x) for x in (q, k, v)]
    for (q0, q1), (k0, k1) in zip(
        itertools.pairwise(cu_seqlens_q), itertools.pairwise(cu_seqlens_k), strict=True
    ):
        piece = backward(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1],
                         grad_out[:, :, q0:q1], **options)  # fmt: skip
        grads[0][:, :, q0:q1], grads[1][:, :, k0:k1], grads[2][:, :, k0:k1] = piece
    return tuple(grads)


def packed_forward(q, k, v, *, cu_seqlens_q, cu_seqlens_k, **options):
    out = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    for (q0, q1), (k0, k1) in zip(
        itertools.pairwise(cu_seqlens_q), itertools.pairwise(cu_seqlens_k), strict=True
    ):
        out[:, :, q0:q1] = forward(q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], **options)
    return out


def with_backward(**how):
    """Gives the decorated forward its backward, :func:`backward` with ``how``."""

    def attach(fn):
        def vjp(q, k, v, grad_out, *, enable_gqa=False, **options):
            if options.get("cu_seqlens_q") is not None:
                return packed_backward(q, k, v, grad_out, **how, **options)
            return backward(q, k, v, grad_out, **how, **options)

        fn.vjp = vjp
        return fn

    return attach


# --- mutants -------------------------------------------------------------------------------------


@mutant("backward", "GRAD-SOFTCAP", mistake="grad-softcap-no-dtanh")
@with_backward(bug="no-dtanh")
def backward_without_dtanh(q, k, v, *, causal=True, scale=None, softcap=None):
    """The softcap in the forward, and a backward written for plain scores: dS without the cap's
    derivative 1 - (x_cap / c)^2 (FlashAttention #1065)."""
    return forward(q, k, v, causal=causal, scale=scale, softcap=softcap)


@mutant("backward", "GRAD-GQA", mistake="grad-group-from-one-head")
@with_backward(bug="one-head")
def group_gradient_from_one_head(q, k, v, *, causal=True, scale=None, enable_gqa=False):
    """dk and dv of each key/value head taken from the first query head of its group, the
    reduction over the group left out (cudnn-frontend #384)."""
    return forward(q, k, v, causal=causal, scale=scale)


@mutant("backward", "GRAD-WINDOW", mistake="grad-window-one-wider")
@with_backward(bug="window-wider")
def backward_window_one_wider(q, k, v, *, causal=True, scale=None, window=None):
    """The backward's window one key wider than the forward's: its bound written <= where the
    forward's is <."""
    return forward(q, k, v, causal=causal, scale=scale, window=window)


@mutant("backward", "GRAD-WINDOW", mistake="grad-window-not-causal")
@with_backward(bug="window-not-causal")
def backward_window_not_causal(q, k, v, *, causal=True, scale=None, window=None):
    """is_causal = causal and window is None: the backward of a windowed call masks the window on
    both sides of each row and not the future (meta-pytorch/MSLK PR #263)."""
    return forward(q, k, v, causal=causal, scale=scale, window=window)


@mutant("backward", "GRAD-CUSTOM-MASK", mistake="grad-custom-mask-ignored")
@with_backward(bug="no-custom-mask")
def backward_without_the_custom_mask(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """The attn_mask applied in the forward and not in the backward: P recomputed from the lse
    over every key the causal mask leaves, so hidden keys get dk and dv."""
    return forward(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


@mutant("backward", "GRAD-SPARSE", mistake="grad-sparse-minus-1-as-last-key")
@with_backward(bug="sparse-minus-1-last")
def sparse_backward_reads_minus_1_as_last_key(q, k, v, *, causal=True, scale=None,
                                              enable_gqa=False, kv_indices=None):  # fmt: skip
    """The forward skips empty slots; the backward gathers them, and -1 wraps to the last key:
    it gets dk and dv, and the rows listing an empty slot a share of its gradient (FlashAttention
    PR #2755)."""
    return forward(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices)


@mutant("backward", "GRAD-SPARSE", mistake="grad-sparse-assigned")
@with_backward(bug="sparse-assigned")
def sparse_backward_assigns(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                            kv_indices=None):  # fmt: skip
    """Stores each row's dk and dv contribution at its listed keys instead of adding it: a key
    several rows select keeps the last one's (cudnn-frontend #384)."""
    return forward(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices)


@mutant("backward", "GRAD-ALIBI", mistake="grad-bias-left-out")
@with_backward(bug="no-bias")
def backward_without_the_bias(q, k, v, *, causal=True, scale=None, alibi_slopes=None):
    """ALiBi's bias added in the forward's score loop and not in the backward's: P recomputed
    from the lse without it (mlx PR #2909)."""
    return forward(q, k, v, causal=causal, scale=scale, alibi_slopes=alibi_slopes)


@mutant("backward", "GRAD-SINK", mistake="grad-sink-left-out")
@with_backward(bug="no-sink")
def backward_without_the_sink(q, k, v, *, causal=True, scale=None, sinks=None):
    """The sink in the forward's denominator and not in the backward's: P renormalised over the
    keys, and no gradient for the sink (FlashAttention #1973, PR #2706)."""
    return forward(q, k, v, causal=causal, scale=scale, sinks=sinks)


@mutant("backward", "GRAD-SINK", mistake="grad-sink-not-differentiated")
@with_backward(bug="sink-constant")
def sink_taken_as_constant(q, k, v, *, causal=True, scale=None, sinks=None):
    """dq, dk and dv right, and the sink's own gradient 0: a learnable sink whose backward was
    never written."""
    return forward(q, k, v, causal=causal, scale=scale, sinks=sinks)


@mutant("backward", "GRAD-PADDING", mistake="grad-nan-on-blind-rows")
@with_backward(bug="nan-blind")
def nan_gradient_on_rows_that_see_nothing(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """exp(s - lse) unguarded in the backward where lse = -inf: NaN in the gradients of an item
    with no key, whose forward is 0 (FlashAttention #443)."""
    return forward(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)


@mutant("backward", "GRAD-PACKED", mistake="grad-packed-sequences-cross")
@with_backward(bug="packed-cross")
def packed_backward_reads_across(q, k, v, *, causal=True, scale=None, cu_seqlens_q=None,
                                 cu_seqlens_k=None):  # fmt: skip
    """The forward per sequence, the backward over the packed batch as one sequence: offsets
    that let a sequence's gradient reach the others' keys (FlashAttention PRs #2337, #2333)."""
    if cu_seqlens_q is None:
        return forward(q, k, v, causal=causal, scale=scale)
    return packed_forward(q, k, v, causal=causal, scale=scale, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k)  # fmt: skip


@mutant("backward", "OUT-GRAD", mistake="grad-last-tile-dropped")
@with_backward(bug="last-tile")
def last_partial_tile_without_gradient(q, k, v, *, causal=True, scale=None):
    """The backward's key loop over whole tiles of 64: keys of a last partial tile get no dk or
    dv (FlashAttention #334). Right whenever Tk is a multiple of 64."""
    return forward(q, k, v, causal=causal, scale=scale)


@mutant("tiling", "GRAD-DETERMINISM")
@with_backward(bug="random-order")
def backward_tiles_summed_as_they_finish(q, k, v, *, causal=True, scale=None):
    """dq accumulated over key tiles in the order they finish, as atomics add them: right to
    rounding, and not the same bits twice (FlashAttention #414, #988)."""
    return forward(q, k, v, causal=causal, scale=scale)


# --- correct variants ----------------------------------------------------------------------------


@correct_variant
@with_backward()
def flash_backward_from_the_lse(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                window=None, key_lengths=None, chunk=None, softcap=None,
                                alibi_slopes=None, sinks=None):  # fmt: skip
    """FlashAttention 2's backward: P recomputed as exp(x - lse) from the forward's lse, dS = P
    (dP - rowsum(dO * O)), every feature's mask and modifier as the forward's."""
    features = dict(window=window, key_lengths=key_lengths, chunk=chunk, softcap=softcap,
                    alibi_slopes=alibi_slopes, sinks=sinks)  # fmt: skip
    return forward(q, k, v, causal=causal, scale=scale, **features)


@correct_variant(judged_on=GRADIENT_CLAIMS)
@with_backward(base_2=True)
def flash_backward_in_base_2(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                             window=None, key_lengths=None, chunk=None, softcap=None,
                             alibi_slopes=None, sinks=None):  # fmt: skip
    """The same backward with exp2 of scores scaled by log2(e), as FlashAttention 3's kernels
    compute their exponentials."""
    features = dict(window=window, key_lengths=key_lengths, chunk=chunk, softcap=softcap,
                    alibi_slopes=alibi_slopes, sinks=sinks)  # fmt: skip
    return forward(q, k, v, causal=causal, scale=scale, **features)


@correct_variant(judged_on=GRADIENT_CLAIMS)
@with_backward(keep_weights=True)
def backward_from_kept_weights(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               window=None, key_lengths=None, chunk=None, softcap=None,
                               alibi_slopes=None, sinks=None):  # fmt: skip
    """The textbook backward: the forward's softmax kept (T x T of memory), not recomputed."""
    features = dict(window=window, key_lengths=key_lengths, chunk=chunk, softcap=softcap,
                    alibi_slopes=alibi_slopes, sinks=sinks)  # fmt: skip
    return forward(q, k, v, causal=causal, scale=scale, **features)
