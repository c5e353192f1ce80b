"""Zoo members for the score modifiers (softcap, ALiBi, sinks, chunks): the bugs reported in
kernels that ship them, and a correct road for each that is not the formula's own.

Every member follows :func:`attend_modified` except in the one step its docstring names; each
declares the modifier it implements by naming its keyword, as any plain callable does.
"""

from __future__ import annotations

import numpy as np

from spec.formula import query_positions, visible_keys
from tests.zoo import correct_variant, mutant
from tests.zoo.formula import scores_of


def attend_modified(
    q,
    k,
    v,
    *,
    causal: bool,
    scale,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    chunk=None,
    cap=None,
    bias=None,
    sink_logits=None,
    visible=None,
) -> np.ndarray:
    """The formula with the modifiers, in q's dtype, each step a switch: ``cap(scores, c)``
    caps the scaled scores (before the mask), ``bias(scores, slopes)`` adds ALiBi's,
    ``sink_logits(sinks, scale)`` gives the logits that join each denominator, and ``visible``
    ((B or 1, 1, Tq, Tk) booleans) the mask."""
    scores = scores_of(q, k, scale)  # (B, H, Tq, Tk), scaled
    if softcap is not None:
        scores = (cap or capped)(scores, softcap)
    if alibi_slopes is not None:
        scores = (bias or alibi_bias)(scores, alibi_slopes)
    if visible is None:
        visible = visible_keys(*scores.shape[-2:], causal=causal, chunk=chunk)
    scores = np.where(visible, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        logits = (sink_logits or unscaled)(sinks, scale).astype(q.dtype)[:, None, None]  # (H,1,1)
        top = np.maximum(top, logits)
    weights = np.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(logits - top)
    return ((weights / total) @ v).astype(q.dtype)


def capped(scores, softcap):
    cap = scores.dtype.type(softcap)
    return cap * np.tanh(scores / cap)


def alibi_bias(scores, slopes, positions=None):
    """The scores with -m_h * |p - j| added, p the query's position (bottom-right by default)."""
    tq, tk = scores.shape[-2:]
    positions = query_positions(tq, tk) if positions is None else positions  # (1, Tq, 1)
    distance = np.abs(positions - np.arange(tk)).astype(scores.dtype)  # (1, Tq, Tk)
    return scores - np.asarray(slopes, scores.dtype)[:, None, None] * distance


def unscaled(sinks, scale):
    return np.asarray(sinks, np.float64)


# --- softcap ------------------------------------------------------------------------------------


@mutant("score modifiers", "SOFTCAP", mistake="softcap-after-mask")
def softcap_after_the_mask(q, k, v, *, causal=True, scale=None, softcap=None):
    """Caps the scores after the causal mask has set the hidden ones to -inf: tanh(-inf) = -1,
    so every hidden key comes back with a score of -c and a weight of its own."""

    if softcap is None:
        return attend_modified(q, k, v, causal=causal, scale=scale)
    scores = scores_of(q, k, scale)
    visible = visible_keys(*scores.shape[-2:], causal=causal)
    scores = capped(np.where(visible, scores, -np.inf), softcap)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@mutant("score modifiers", "SOFTCAP", mistake="softcap-before-scale")
def softcap_before_the_scale(q, k, v, *, causal=True, scale=None, softcap=None):
    """Caps q k^T and scales afterwards, c * tanh(q k / c) * scale: the cap lands at c * scale,
    not at c (a kernel that folds the scale into the exponent after the cap)."""

    def before_scale(scores, cap):
        factor = scores.dtype.type(q.shape[-1] ** -0.5 if scale is None else scale)
        return capped(scores / factor, cap) * factor

    return attend_modified(q, k, v, causal=causal, scale=scale, softcap=softcap, cap=before_scale)


@correct_variant
def softcap_through_exp(q, k, v, *, causal=True, scale=None, softcap=None):
    """Caps with c * (1 - 2 / (exp(2x / c) + 1)), tanh written out, in float64: the same cap."""

    def through_exp(scores, cap):
        wide = scores.astype(np.float64)
        return (cap * (1.0 - 2.0 / (np.exp(2.0 * wide / cap) + 1.0))).astype(scores.dtype)

    return attend_modified(q, k, v, causal=causal, scale=scale, softcap=softcap, cap=through_exp)


# --- ALiBi --------------------------------------------------------------------------------------


@mutant("score modifiers", "ALIBI", mistake="alibi-wrong-sign")
def alibi_with_the_wrong_sign(q, k, v, *, causal=True, scale=None, alibi_slopes=None):
    """Adds +m_h * |p - j|: distant keys favoured instead of penalised (a slope table stored
    negative, then subtracted)."""

    def plus(scores, slopes):
        return alibi_bias(scores, -np.asarray(slopes))

    return attend_modified(
        q, k, v, causal=causal, scale=scale, alibi_slopes=alibi_slopes, bias=plus
    )


@mutant("score modifiers", "ALIBI", mistake="alibi-top-left")
def alibi_aligned_top_left(q, k, v, *, causal=True, scale=None, alibi_slopes=None):
    """Measures the distance from the row index i instead of the query's position
    i + Tk - Tq: right when Tq = Tk, wrong in decoding and chunked prefill."""

    def from_row(scores, slopes):
        return alibi_bias(scores, slopes, positions=np.arange(scores.shape[-2])[None, :, None])

    return attend_modified(
        q, k, v, causal=causal, scale=scale, alibi_slopes=alibi_slopes, bias=from_row
    )


@correct_variant
def alibi_as_key_position_bias(q, k, v, *, causal=True, scale=None, alibi_slopes=None):
    """Under a causal mask adds FlashInfer's +m_h * (j - p), signed rather than an absolute
    distance (j <= p wherever it counts); without the mask, the distance itself. (Adding
    +m_h * j alone, the row's constant -m_h * p left out as the softmax allows, is no correct
    float32 kernel: scores near m_h * Tk lose their last digits, 1.99 of the float32 budget.)"""

    def signed(scores, slopes):
        if not causal:
            return alibi_bias(scores, slopes)
        tq, tk = scores.shape[-2:]
        offset = (np.arange(tk) - query_positions(tq, tk)).astype(scores.dtype)  # (1, Tq, Tk)
        return scores + np.asarray(slopes, scores.dtype)[:, None, None] * offset

    return attend_modified(
        q, k, v, causal=causal, scale=scale, alibi_slopes=alibi_slopes, bias=signed
    )


# --- sinks --------------------------------------------------------------------------------------


@mutant("score modifiers", "SINK-LOGIT", mistake="sink-scaled")
def sink_scaled_like_a_score(q, k, v, *, causal=True, scale=None, sinks=None):
    """Multiplies the sink logit by the softmax scale, as if it were a q k^T product: right only
    for a sink of 0 (or -inf)."""

    def scaled(sinks, scale_):
        return np.asarray(sinks, np.float64) * (q.shape[-1] ** -0.5 if scale_ is None else scale_)

    return attend_modified(q, k, v, causal=causal, scale=scale, sinks=sinks, sink_logits=scaled)


@mutant("score modifiers", "SINK-LOGIT", mistake="sink-dropped")
def sink_dropped(q, k, v, *, causal=True, scale=None, sinks=None):
    """Accepts the sinks and ignores them: plain attention, each row's weights summing to 1 (a
    backend that does not forward the argument)."""
    return attend_modified(q, k, v, causal=causal, scale=scale)


@mutant("score modifiers", "SINK-LOGIT", mistake="sink-minus-inf-as-zero")
def sink_minus_inf_read_as_zero(q, k, v, *, causal=True, scale=None, sinks=None):
    """Sanitises its sinks with nan_to_num before use, so that a head without a sink (-inf) gets
    a sink of 0 instead, which takes its share of every row's weight; right for every finite
    sink (regime sinks.minus-inf)."""
    finite = None if sinks is None else np.nan_to_num(np.asarray(sinks, np.float64), neginf=0.0)
    return attend_modified(q, k, v, causal=causal, scale=scale, sinks=finite)


@correct_variant
def sink_as_an_extra_key(q, k, v, *, causal=True, scale=None, sinks=None):
    """Appends one key per head whose score is the sink logit and whose value is zero, always
    visible: it takes its share of each denominator and adds nothing to the output."""
    if sinks is None:
        return attend_modified(q, k, v, causal=causal, scale=scale)
    scores = scores_of(q, k, scale)  # (B, H, Tq, Tk)
    scores = np.where(visible_keys(*scores.shape[-2:], causal=causal), scores, -np.inf)
    sink = np.broadcast_to(
        np.asarray(sinks, scores.dtype)[None, :, None, None], (*scores.shape[:-1], 1)
    )
    scores = np.concatenate([scores, sink], axis=-1)  # (B, H, Tq, Tk + 1)
    zero = np.zeros((*v.shape[:-2], 1, v.shape[-1]), v.dtype)
    values = np.concatenate([v, zero], axis=-2)  # (B, H, Tk + 1, Dv)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ values).astype(q.dtype)


# --- chunks -------------------------------------------------------------------------------------


def chunk_visible(tq, tk, chunk, *, positions=None, reach=0):
    """(1, 1, Tq, Tk) causal and within the chunk of each row's position (bottom-right by
    default); ``reach`` lets a row see that many keys before its chunk."""
    positions = query_positions(tq, tk) if positions is None else positions  # (1, Tq, 1)
    keys = np.arange(tk)
    start = positions // chunk * chunk
    return ((keys <= positions) & (keys >= start - reach))[:, None]


@mutant("score modifiers", "CHUNKED-LOCAL", mistake="chunk-one-key-early")
def chunk_boundary_one_key_early(q, k, v, *, causal=True, scale=None, chunk=None):
    """Lets each row see the last key of the previous chunk too (a chunk start computed as
    p // C * C - 1, or a <= where < belongs)."""
    if chunk is None:
        return attend_modified(q, k, v, causal=causal, scale=scale)
    visible = chunk_visible(q.shape[-2], k.shape[-2], chunk, reach=1)
    return attend_modified(q, k, v, causal=causal, scale=scale, visible=visible)


@mutant("score modifiers", "CHUNKED-LOCAL", mistake="chunk-from-row-index")
def chunks_from_the_row_index(q, k, v, *, causal=True, scale=None, chunk=None):
    """Cuts chunks at the row index i instead of the query's position i + Tk - Tq: right in
    prefill, wrong in decoding and chunked prefill."""
    if chunk is None:
        return attend_modified(q, k, v, causal=causal, scale=scale)
    tq, tk = q.shape[-2], k.shape[-2]
    rows = np.arange(tq)[None, :, None]
    start = rows // chunk * chunk  # (1, Tq, 1), from the row index
    keys = np.arange(tk)
    visible = ((keys <= rows + tk - tq) & (keys >= start))[:, None]
    return attend_modified(q, k, v, causal=causal, scale=scale, visible=visible)


@correct_variant
def chunks_attended_one_by_one(q, k, v, *, causal=True, scale=None, chunk=None):
    """Attends each chunk's query rows to that chunk's keys alone, causally, and writes the rows
    back: chunked attention as separate short sequences."""
    if chunk is None:
        return attend_modified(q, k, v, causal=causal, scale=scale)
    tq, tk = q.shape[-2], k.shape[-2]
    out = np.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)  # (B, H, Tq, Dv)
    positions = np.arange(tq) + tk - tq
    for start in range(0, tk, chunk):
        rows = np.flatnonzero((positions >= start) & (positions < start + chunk))
        if rows.size == 0:
            continue
        stop = positions[rows[-1]] + 1  # keys of the chunk up to its last row's position
        part = attend_modified(
            q[..., rows, :], k[..., start:stop, :], v[..., start:stop, :], causal=True, scale=scale
        )
        out[..., rows, :] = part
    return out
