"""The mistakes of backward passes: a kernel whose forward is right and whose gradients are not
has one of these, each a variant of the float64 backward (:func:`spec.formula.
reference_feature_vjp`) with one step wrong, as public reports of training kernels found them.

They are the gradient family of :mod:`spec.mistakes`: ``conformance/judge/gradients.py``
names those whose every gradient a failing backward matches within the budget it failed against.
A variant gives {"q", "k", "v"[, "sinks"]}, as the oracle does.

A flash backward recomputes the weights from the forward's log-sum-exp, P = exp(x - lse), with a
mask and score modifiers of its own: where those are not the forward's, P is not the forward's
weights, and it is not normalised either. :func:`recomputed_backward` is that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from spec.formula import (
    backward_steps,
    backward_weights,
    keys_read_and_blind_rows,
    reference_attention,
    reference_feature_vjp,
    reference_log_sum_exp,
    reference_masked_scores,
    repeat_kv_heads,
    resolve_scale,
)
from spec.mistakes.registry import Family, mistake


@dataclass(frozen=True)
class GradientCall:
    """A backward call: float64 q, k, v, grad_out and its options (causal, scale, grad_lse,
    sinks and the features' keywords)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    grad_out: np.ndarray
    options: dict = field(hash=False)

    @cached_property
    def truth(self) -> dict[str, np.ndarray]:
        return reference_feature_vjp(self.q, self.k, self.v, self.grad_out, **self.options)

    def get(self, name: str, default=None):
        return self.options.get(name, default)

    @property
    def packed(self) -> bool:
        return self.get("cu_seqlens_q") is not None

    def with_options(self, **changes) -> dict[str, np.ndarray]:
        """The oracle's gradients of the same inputs under other options."""
        return reference_feature_vjp(
            self.q, self.k, self.v, self.grad_out, **{**self.options, **changes}
        )


def gradient_mistake(name: str, text: str, hint: str, shows: Callable):
    """Register the decorated variant (GradientCall -> {"q", "k", "v"[, "sinks"]}) as gradient
    mistake ``name``."""
    return mistake(Family.GRADIENT, name, text, hint, shows)


def recomputed_backward(
    call: GradientCall, hidden=None, sink_in_lse: bool = True, **changes
) -> dict[str, np.ndarray]:
    """A flash backward that recomputes P = exp(x' - lse) from the forward's log-sum-exp, x' the
    scores under the options ``changes`` alters (its own mask, its own modifiers) and -inf where
    ``hidden`` ((Tq, Tk) booleans) is True, a sink's share left in the lse as the forward had
    it (unless not ``sink_in_lse``), rowsum(dO * O) from the forward's output. Unpacked calls
    only."""
    options = {name: value for name, value in call.options.items() if name != "grad_lse"}
    sinks = options.pop("sinks", None)
    forward_lse = reference_log_sum_exp(call.q, call.k, **options)  # (B, H, Tq)
    if sinks is not None and sink_in_lse:  # the forward's denominator: the sink joined it
        forward_lse = np.logaddexp(forward_lse, np.asarray(sinks, np.float64)[:, None])
    changed = {**options, **changes}
    scores = reference_masked_scores(call.q, call.k, **changed)  # (B, H, Tq, Tk)
    if hidden is not None:
        scores = np.where(hidden, -np.inf, scores)
    seen = np.isfinite(forward_lse)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.where(seen, np.exp(scores - np.where(seen, forward_lse[..., None], 0.0)), 0.0)
    _, capped = backward_weights(call.q, call.k, **changed)
    with np.errstate(invalid="ignore"):  # the saved O; a row that sees no key saved 0
        out = np.where(seen, reference_attention(call.q, call.k, call.v, sinks=sinks, **options), 0)
    return backward_steps(
        weights, call.q, repeat_kv_heads(call.q, call.k), call.grad_out, k=call.k, v=call.v,
        scale=resolve_scale(call.get("scale"), call.q.shape[-1]), capped=capped,
        softcap=changed.get("softcap"), grad_lse=call.get("grad_lse"), sinks=sinks,
        key_lengths=changed.get("key_lengths"),
        row_dot=(call.grad_out * out).sum(axis=-1, keepdims=True),
    )  # fmt: skip


# --- score modifiers -----------------------------------------------------------------------------


def recomputed_with(name: str, text: str, hint: str, shows: Callable, changes):
    """Register mistake ``name``: the backward's P recomputed with the forward's options that
    ``changes(call)`` gives changed (:func:`recomputed_backward`)."""
    gradient_mistake(name, text, hint, shows)(
        lambda call: recomputed_backward(call, **changes(call))
    )


@gradient_mistake(
    "grad-softcap-no-dtanh",
    "the softcap's derivative dropped: dS taken as the capped scores' gradient, without "
    "dtanh = 1 - (x_cap / c)^2",
    "the backward written for plain scores and the softcap added to the forward only "
    "(FlashAttention #1065, PR #1033)",
    lambda call: call.get("softcap") is not None,
)
def _softcap_no_dtanh(call: GradientCall):
    weights, _ = backward_weights(call.q, call.k, **_without(call.options, "grad_lse"))
    return backward_steps(
        weights, call.q, repeat_kv_heads(call.q, call.k), call.grad_out, k=call.k, v=call.v,
        scale=resolve_scale(call.get("scale"), call.q.shape[-1]), capped=None, softcap=None,
        grad_lse=call.get("grad_lse"), sinks=call.get("sinks"),
        key_lengths=call.get("key_lengths"),
    )  # fmt: skip


recomputed_with(
    "grad-bias-left-out",
    "ALiBi's bias left out of the P the backward recomputes from the lse",
    "the bias added in the forward's score loop and not in the backward's (mlx PR #2909)",
    lambda call: call.get("alibi_slopes") is not None and not call.packed,
    lambda call: dict(alibi_slopes=None),
)


@gradient_mistake(
    "grad-sink-left-out",
    "the sink's share of the denominator left out of the backward: P renormalised over the keys "
    "alone and no gradient for the sink",
    "the backward's P recomputed from an lse without the sink (FlashAttention #1973, PR #2706)",
    lambda call: any(np.isfinite(s) for s in call.get("sinks") or ()) and not call.packed,
)
def _sink_left_out(call: GradientCall):
    grads = recomputed_backward(call, sink_in_lse=False)
    grads["sinks"] = np.zeros(len(call.get("sinks")))
    return grads


@gradient_mistake(
    "grad-sink-not-differentiated",
    "dq, dk and dv right and the sink's own gradient 0: the sink's logit taken as a constant",
    "a learnable sink's backward never written (FlashAttention #1973)",
    lambda call: any(np.isfinite(s) for s in call.get("sinks") or ()),
)
def _sink_not_differentiated(call: GradientCall):
    return {**call.truth, "sinks": np.zeros(len(call.get("sinks")))}


# --- masks ---------------------------------------------------------------------------------------


recomputed_with(
    "grad-window-one-wider",
    "the backward's window one key wider than the forward's: P recomputed over w + 1 keys back",
    "the window's bound written <= in one kernel and < in the other",
    lambda call: call.get("window") is not None and not call.packed,
    lambda call: dict(window=call.get("window") + 1),
)


@gradient_mistake(
    "grad-window-not-causal",
    "the backward not causal when a window is given: P recomputed over the window on both sides",
    "is_causal = causal and window is None (meta-pytorch/MSLK PR #263)",
    lambda call: call.get("window") is not None and call.get("causal", True) and not call.packed,
)
def _window_not_causal(call: GradientCall):
    tq, tk = call.q.shape[-2], call.k.shape[-2]
    positions = np.arange(tq)[:, None] + tk - tq  # (Tq, 1), bottom-right aligned
    ahead = np.arange(tk)[None, :] - positions > call.get("window")  # (Tq, Tk)
    return recomputed_backward(call, hidden=ahead, causal=False)


recomputed_with(
    "grad-custom-mask-ignored",
    "the backward's P recomputed without the attn_mask: keys the forward hid get gradients",
    "the mask passed to the forward kernel and not to the backward's (FlexAttention's block "
    "mask built for the forward alone)",
    lambda call: call.get("attn_mask") is not None and not call.packed,
    lambda call: dict(attn_mask=None),
)


@gradient_mistake(
    "grad-sparse-minus-1-as-last-key",
    "the backward reads an empty slot (-1) as the last key: P recomputed over it, so the last key "
    "gets dk and dv and the rows that list an empty slot a share of its gradient",
    "a -1 sentinel used as an index, which wraps to the last key (FlashAttention PR #2755)",
    lambda call: (
        call.get("kv_indices") is not None
        and bool((call.get("kv_indices") < 0).any())
        and not call.packed
    ),
)
def _sparse_minus_1_as_last_key(call: GradientCall):
    indices = call.get("kv_indices")
    wrapped = np.where(indices < 0, call.k.shape[-2] - 1, indices)
    return recomputed_backward(call, kv_indices=wrapped)


@gradient_mistake(
    "grad-sparse-assigned",
    "dk and dv of a key assigned by the last query row that reads it, not summed over every "
    "row and head that does",
    "a scatter that stores where it should add (cudnn-frontend #384: several queries selecting "
    "one key)",
    lambda call: (
        call.get("kv_indices") is not None
        and call.get("softcap") is None
        and call.get("grad_lse") is None
        and call.get("sinks") is None
        and not call.packed
    ),
)
def _sparse_assigned(call: GradientCall):
    options = _without(call.options, "grad_lse")
    weights, _ = backward_weights(call.q, call.k, **options)  # (B, H, Tq, Tk)
    values = repeat_kv_heads(call.q, call.v)
    row_dot = (call.grad_out * (weights @ values)).sum(-1, keepdims=True)  # rowsum(dO * O)
    grad_scores = weights * (call.grad_out @ values.swapaxes(-1, -2) - row_dot)
    scale = resolve_scale(call.get("scale"), call.q.shape[-1])
    read = weights > 0
    grads = dict(call.truth)
    grads["k"] = last_reader(scale * grad_scores[..., None] * call.q[..., :, None, :], read,
                             call.k.shape[1])  # fmt: skip
    grads["v"] = last_reader(weights[..., None] * call.grad_out[..., :, None, :], read,
                             call.k.shape[1])  # fmt: skip
    return grads


def last_reader(contributions: np.ndarray, read: np.ndarray, kv_heads: int) -> np.ndarray:
    """Each key's gradient as the last row reading it left it: ``contributions`` (B, H, Tq, Tk,
    D) of each query row to each key, ``read`` (B, H, Tq, Tk) where the row reads the key; rows
    in order of query head, then row, within each key/value head's group. (B, Hkv, Tk, D)."""
    batch, heads, tq, tk, dim = contributions.shape
    rows = contributions.reshape(batch, kv_heads, heads // kv_heads * tq, tk, dim)
    reads = np.broadcast_to(read, (batch, heads, tq, tk)).reshape(batch, kv_heads, -1, tk)
    last = reads.shape[2] - 1 - np.argmax(reads[:, :, ::-1], axis=2)  # (B, Hkv, Tk)
    grad = np.take_along_axis(rows, last[:, :, None, :, None], axis=2)[:, :, 0]  # (B, Hkv, Tk, D)
    return np.where(reads.any(axis=2)[..., None], grad, 0.0)


@gradient_mistake(
    "grad-nan-on-blind-rows",
    "NaN in the gradients of a row that sees no key, where exp(s - lse) meets lse = -inf, and in "
    "dk and dv of its head, which sum over that row",
    "the backward's exp(s - lse) unguarded where the forward guarded its -inf max "
    "(FlashAttention #443; pytorch #41508)",
    lambda call: bool(_blind_rows(call).any()),
)
def _nan_on_blind_rows(call: GradientCall):
    grads = {name: grad.copy() for name, grad in call.truth.items()}
    blind = _blind_rows(call)  # (B or 1, H or 1, Tq)
    blind_items = np.broadcast_to(blind.any(axis=(-2, -1)), (call.q.shape[0],))  # (B,)
    grads["q"][np.broadcast_to(blind, call.q.shape[:-1])] = np.nan
    for name in ("k", "v"):
        grads[name][blind_items] = np.nan
    if "sinks" in grads:
        grads["sinks"][:] = np.nan
    return grads


@gradient_mistake(
    "grad-group-from-one-head",
    "dk and dv of a key/value head taken from the first query head of its group, not summed over "
    "the group",
    "the group reduction of the backward left out, or split with the wrong count "
    "(cudnn-frontend #384)",
    lambda call: call.k.shape[-3] != call.q.shape[-3],
)
def _group_from_one_head(call: GradientCall):
    grads = dict(call.truth)
    per_head = reference_feature_vjp(
        call.q, repeat_kv_heads(call.q, call.k), repeat_kv_heads(call.q, call.v), call.grad_out,
        **call.options,
    )  # fmt: skip
    group = call.q.shape[-3] // call.k.shape[-3]
    for name in ("k", "v"):
        grads[name] = per_head[name][:, ::group]  # (B, Hkv, Tk, D): each group's first head
    return grads


@gradient_mistake(
    "grad-packed-sequences-cross",
    "the packed sequences' backward reading across their boundaries: the batch differentiated as "
    "one sequence",
    "varlen offsets taken from the wrong sequence in the backward (FlashAttention PRs #2337, "
    "#2333)",
    lambda call: call.packed and len(call.get("cu_seqlens_q")) > 2,
)
def _packed_sequences_cross(call: GradientCall):
    return call.with_options(cu_seqlens_q=None, cu_seqlens_k=None)


@gradient_mistake(
    "grad-last-tile-dropped",
    "no dk or dv for the keys of a last partial tile of 64 (Tk not a multiple of 64)",
    "the backward's key loop over whole tiles only (FlashAttention #334)",
    lambda call: not call.packed and call.k.shape[-2] % 64 != 0,
)
def _last_tile_dropped(call: GradientCall):
    grads = dict(call.truth)
    whole = call.k.shape[-2] // 64 * 64
    for name in ("k", "v"):
        grads[name] = grads[name].copy()
        grads[name][..., whole:, :] = 0.0
    return grads


@gradient_mistake(
    "grad-lse-gradient-dropped",
    "the lse's own gradient ignored: dS without grad_lse * exp(x - lse)",
    "a backward written for the output alone, its lse taken as a constant",
    lambda call: call.get("grad_lse") is not None,
)
def _lse_gradient_dropped(call: GradientCall):
    return call.with_options(grad_lse=None)


def _without(options: dict, *names: str) -> dict:
    return {name: value for name, value in options.items() if name not in names}


def _blind_rows(call: GradientCall) -> np.ndarray:
    """(B or 1, H or 1, Tq): the rows that see no key."""
    return keys_read_and_blind_rows(
        call.q.shape[-2], call.k.shape[-2], heads=call.q.shape[1],
        **_without(call.options, "scale", "grad_lse", "sinks"),
    )[1]  # fmt: skip
