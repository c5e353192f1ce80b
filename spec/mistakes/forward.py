"""The output's mistakes: each a variant of the formula (:mod:`spec.formula`) with one step
changed, in float64 unless the mistake is about precision (then in the arithmetic that makes it
show: the accumulation dtype where overflow or a finite fill decides). A variant takes the float64
q, k, v and the :class:`Call` and gives the output; :func:`output_of` applies it as the formula is
applied, to each padded item or packed sequence alone.

``shows(call)`` is False where the variant is the formula (a top-left mask is the right one when
Tq = Tk). A mistake with a ``precision`` is the formula itself computed in a coarser dtype: the
output matches it when it lies within that dtype's budget of the truth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from spec.dtypes import UNIT_ROUNDOFF, round_to
from spec.features import UNMODELLED_KEYWORDS
from spec.formula import (
    accumulation_dtype,
    attention_in_steps,
    each_item_or_sequence,
    grouped_heads,
    masked_softmax,
    modified_scores,
    resolve_scale,
    softmax,
)
from spec.masks import (
    ARRAY_KEYWORDS,
    MASK_CONVENTIONS,
    MASK_KEYWORDS,
    Grid,
    custom_mask_sees,
    extent_of,
    prepared,
    sparse_indices_sees,
    tree_mask_sees,
    visible,
    with_mask_fields,
)
from spec.mistakes.registry import Family, Mistake, of_family
from spec.mistakes.registry import mistake as register

TILE_SIZES = (32, 64, 128)  # the key tiles of the tiling mistakes: the widths kernels use


@dataclass(frozen=True)
@with_mask_fields
class Call:
    """What a mistake needs to know of one attention call: its shapes, dtype and options."""

    batch: int
    heads: int
    kv_heads: int
    tq: int
    tk: int
    head_dim: int
    value_dim: int
    dtype: str
    causal: bool = True
    scale: float | None = None
    window: int | None = None
    key_lengths: tuple[int, ...] | None = None
    query_lengths: tuple[int, ...] | None = None
    cu_seqlens_q: tuple[int, ...] | None = None
    cu_seqlens_k: tuple[int, ...] | None = None
    softcap: float | None = None
    alibi_slopes: tuple[float, ...] | None = None
    sinks: tuple[float, ...] | None = None
    chunk: int | None = None
    page_size: int | None = None  # k and v reached it as page pools (spec.formula.page_pool)
    # and a field per keyword of the other mask kinds (spec.masks, with_mask_fields): a listed
    # mask an array (spec.masks.ARRAY_KEYWORDS), its per-item numbers tuples; and the kinds'
    # conventions as declared (sparse_duplicates: "once" or None, or "count")

    @property
    def modified(self) -> bool:
        """Whether a feature the variants below do not model is on (spec.features): written for
        the plain scores and mask, none of them applies to such a call."""
        return any(getattr(self, keyword, None) is not None for keyword in UNMODELLED_KEYWORDS)

    @classmethod
    def of(cls, q, k, v, *, dtype: str, causal=True, scale=None, **variant) -> Call:
        (batch, heads, tq, head_dim), (_, kv_heads, tk, _) = q.shape, k.shape
        # per-item numbers as tuples; a mask (spec.masks) stays an array
        options = {name: tuple(value) if isinstance(value, list | tuple)
                   or (isinstance(value, np.ndarray) and value.ndim == 1
                       and name not in ARRAY_KEYWORDS) else value
                   for name, value in variant.items()}  # fmt: skip
        return cls(batch, heads, kv_heads, tq, tk, head_dim, v.shape[-1], dtype, causal, scale,
                   **options)  # fmt: skip

    @property
    def mask_options(self) -> dict:
        """The keywords that say which keys each query sees (spec.masks), ``causal`` with them."""
        return {name: getattr(self, name) for name in (*MASK_KEYWORDS, *MASK_CONVENTIONS)
                if getattr(self, name, None) is not None}  # fmt: skip

    @property
    def formula_options(self) -> dict:
        """The keywords the formula reads beside q, k, v and the scale: the mask's, ``causal``
        with them, and the score modifiers'."""
        modifiers = {name: getattr(self, name) for name in ("softcap", "alibi_slopes", "sinks")
                     if getattr(self, name) is not None}  # fmt: skip
        return {**self.mask_options, **modifiers}

    @property
    def resolved_scale(self) -> float:
        return resolve_scale(self.scale, self.head_dim)

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """(queries, keys) of each sequence the call attends separately: each packed sequence,
        each padded item, or the whole call."""
        if self.cu_seqlens_q is not None:
            return [
                (self.cu_seqlens_q[s + 1] - self.cu_seqlens_q[s],
                 self.cu_seqlens_k[s + 1] - self.cu_seqlens_k[s])
                for s in range(len(self.cu_seqlens_q) - 1)
            ]  # fmt: skip
        queries = self.query_lengths or (self.tq,) * self.batch
        return list(zip(queries, self.item_key_lengths, strict=True))

    @property
    def item_key_lengths(self) -> tuple[int, ...]:
        """Each batch item's keys: its key length, or all Tk without them."""
        return self.key_lengths or (self.tk,) * self.batch

    @property
    def has_padding(self) -> bool:
        return self.key_lengths is not None and min(self.key_lengths) < self.tk


def output_of(
    mistake: Mistake, q, k, v, *, dtype: str, causal=True, scale=None, in_dtype=False, **variant
) -> np.ndarray:
    """The output mistake's variant on float64 q, k, v: (B, H, Tq, Dv), as float64. ``in_dtype``:
    computed as a straightforward kernel in ``dtype`` would, in its accumulation dtype and rounded
    to it at the end (the variant's own naive baseline)."""
    if in_dtype:
        work = accumulation_dtype(dtype)
        q, k, v = (np.asarray(x, work) for x in (q, k, v))
        out = output_of(mistake, q, k, v, dtype=dtype, causal=causal, scale=scale, **variant)
        return round_to(out, dtype)

    def one(q, k, v, **options):
        return mistake.variant(q, k, v, Call.of(q, k, v, dtype=dtype, **options))

    with np.errstate(all="ignore"):
        if mistake.per_sequence:
            pieces = each_item_or_sequence(one, q, k, v, causal=causal, scale=scale, **variant)
            if pieces is not None:
                return np.asarray(pieces, np.float64)
        return np.asarray(one(q, k, v, causal=causal, scale=scale, **variant), np.float64)


# --- the formula in steps, each a switch for the mistakes below ----------------------------------


def visible_keys_of(
    call: Call,
    *,
    aligned: str = "bottom-right",
    reach: int = 0,
    window: int | None = None,
    window_from_row: bool = False,
    lengths_seen: bool = True,
    chunk_reach: int = 0,
    chunk_from_row: bool = False,
    instead: dict | None = None,
) -> np.ndarray:
    """(B or 1, H or 1, Tq, Tk) True where query row i sees key j: the formula's mask
    (spec.masks) with one switch changed. ``aligned`` places row i at i + L_b - Tq
    ("bottom-right"), at i ("top-left") or at i + Tk - Tq ("padded": the key lengths ignored);
    ``reach`` lets it see that many keys further (-1: not itself); ``window_from_row`` measures
    the window from i instead of the position; ``lengths_seen=False`` reads the padding; a chunk
    starts ``chunk_reach`` keys early, or is cut at the row index (``chunk_from_row``);
    ``instead`` swaps any kind's predicate by name (spec.masks.visible)."""
    options = call.mask_options
    if window is not None:
        options["window"] = window
    batch, heads = extent_of(options, heads=call.heads)
    grid = Grid.over(batch, heads, call.tq, call.tk, key_lengths=call.key_lengths)
    offset = {"bottom-right": grid.length - call.tq, "top-left": 0, "padded": call.tk - call.tq}
    grid = replace(grid, position=grid.row + offset[aligned])
    instead = dict(instead or {})
    if reach and call.causal:
        instead["causal"] = lambda g, o: g.key <= g.position + reach
    if window_from_row and "window" in options:
        instead["window"] = lambda g, o: g.key >= g.row - o["window"]
    if not lengths_seen:
        instead["key_lengths"] = None
    if (chunk_reach or chunk_from_row) and "chunk" in options:
        # under the causal mask a chunk is the keys from its start on
        instead["chunk"] = lambda g, o: (
            g.key
            >= ((g.row if chunk_from_row else g.position) // o["chunk"] * o["chunk"] - chunk_reach)
        )
    return visible(grid, options, instead=instead)


def attend_with(
    q, k, v, call: Call, *, scale: float | None = None, weights_of=None, **steps
) -> np.ndarray:
    """The formula (spec.formula.attention_in_steps) on ``call``'s options, in q's dtype, with
    the steps given replaced: the ``scale`` (None: the call's); ``weights_of(scores, visible)``,
    the weights of the scores over the visible keys; and attention_in_steps' own ``visible``,
    ``key_heads``, ``value_heads``, ``modify``, ``weights`` and ``zero_padding``."""
    if weights_of is not None:  # a general mistake's: never on a call with sinks (modified)
        steps["weights"] = lambda scores, visible, sinks: weights_of(scores, visible)
    scale = call.scale if scale is None else scale
    return attention_in_steps(q, k, v, scale=scale, **call.formula_options, **steps)


def _in_accumulation(call: Call, scores: np.ndarray) -> np.ndarray:
    """Scores held where a kernel in the call's dtype computes its exponentials."""
    return scores.astype(accumulation_dtype(call.dtype))


def _normalised(weights: np.ndarray, axis: int = -1, epsilon: float = 0.0) -> np.ndarray:
    return weights / (weights.sum(axis=axis, keepdims=True) + epsilon)


# --- the mistakes ---------------------------------------------------------------------------------


def mistake(name: str, text: str, hint: str, shows: Callable[[Call], bool], **options):
    """Register the decorated variant (q, k, v, Call) -> output as output mistake ``name``."""
    return register(Family.OUTPUT, name, text, hint, shows, **options)


def formula_with(name: str, text: str, hint: str, shows: Callable[[Call], bool], *,
                 changes=None, steps=None, **options) -> None:  # fmt: skip
    """Register output mistake ``name``: the formula on the call with the fields ``changes(call)``
    gives changed, and the steps ``steps(call)`` gives replaced (:func:`attend_with`)."""

    def variant(q, k, v, call):
        changed = call if changes is None else replace(call, **changes(call))
        return attend_with(q, k, v, changed, **({} if steps is None else steps(call)))

    mistake(name, text, hint, shows, **options)(variant)


def _decodes_or_prefills_unequal(call: Call) -> bool:
    return call.causal and any(queries != keys for queries, keys in call.lengths)


def _has_future(call: Call) -> bool:
    return call.causal and call.tq > 1


# Masking


formula_with(
    "mask-top-left",
    "causal mask aligned top-left: query row i sees keys 0..i whatever Tk",
    "tril(ones(Tq, Tk)) instead of aligning to the last key (as PyTorch's is_causal)",
    _decodes_or_prefills_unequal,
    steps=lambda call: dict(visible=visible_keys_of(call, aligned="top-left")),
)


formula_with(
    "mask-missing",
    "no causal mask: every query row sees every key, the future included",
    "the causal flag accepted but never passed down to the kernel",
    _has_future,
    steps=lambda call: dict(visible=visible_keys_of(replace(call, causal=False))),
)


formula_with(
    "mask-on-non-causal-call",
    "the causal mask applied to a call with causal=False",
    "a decoder-only kernel exposed under a general signature",
    lambda call: not call.causal and call.tq > 1,
    steps=lambda call: dict(visible=visible_keys_of(replace(call, causal=True))),
)


formula_with(
    "mask-excludes-diagonal",
    "the mask hides the query's own key too: j < i where j <= i belongs",
    "reading 'must not see the future' as 'must not see itself'",
    lambda call: call.causal,
    steps=lambda call: dict(visible=visible_keys_of(call, reach=-1)),
)


formula_with(
    "mask-one-ahead",
    "the mask lets query i see key i + 1: j <= i + 1 where j <= i belongs",
    "an off-by-one in the diagonal offset of tril or of a tile's mask",
    _has_future,
    steps=lambda call: dict(visible=visible_keys_of(call, reach=1)),
)


@mistake(
    "mask-fill-minus-1e4",
    "the mask adds -1e4 to hidden scores instead of setting them to -inf",
    "the float16-era additive mask: hidden keys whose scores exceed the visible ones by ~1e4 "
    "take the weight",
    lambda call: call.causal,
)
def _fill_minus_1e4(q, k, v, call):
    def weights(scores, visible):
        scores = _in_accumulation(call, scores)
        return softmax(scores + np.where(visible, 0, -1e4).astype(scores.dtype))

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "mask-fill-minus-1e9",
    "hidden scores set to -1e9 instead of -inf",
    "masked_fill(mask, -1e9): a row that sees no key gets the mean of every value, not NaN",
    lambda call: call.causal,
)
def _fill_minus_1e9(q, k, v, call):
    def weights(scores, visible):
        scores = _in_accumulation(call, scores)
        return softmax(np.where(visible, scores, scores.dtype.type(-1e9)))

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "mask-fill-zero",
    "hidden scores set to 0 instead of -inf: the 0/1 mask multiplied into the scores",
    "scores * mask where masked_fill(~mask, -inf) belongs: exp(0 - max) still weighs the future",
    lambda call: call.causal,
)
def _fill_zero(q, k, v, call):
    def weights(scores, visible):
        return softmax(np.where(visible, scores, 0.0))

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "max-before-masking",
    "the row maximum taken over every key, hidden ones (future, padding) included, before masking",
    "the stabilising max computed on the raw scores: one large hidden score makes every visible "
    "weight underflow, an inf or NaN one poisons the row",
    lambda call: call.causal or call.window is not None or call.has_padding,
)
def _max_before_masking(q, k, v, call):
    def weights(scores, visible):
        scores = _in_accumulation(call, scores)
        return _normalised(np.where(visible, np.exp(scores - scores.max(-1, keepdims=True)), 0))

    return attend_with(q, k, v, call, weights_of=weights)


# Scaling


def _default_scale(call: Call) -> bool:
    return call.scale is None


formula_with(
    "scale-value-dim",
    "scores scaled by 1/sqrt(Dv), v's head dim, instead of 1/sqrt(D)",
    "d_k read off the value tensor: right while Dv = D",
    lambda call: _default_scale(call) and call.value_dim != call.head_dim,
    steps=lambda call: dict(scale=call.value_dim**-0.5),
)


formula_with(
    "scale-model-width",
    "scores scaled by 1/sqrt(H * D), the model width, instead of the head's 1/sqrt(D)",
    "code written for one head and split into heads without revisiting the scale",
    lambda call: _default_scale(call) and call.heads > 1,
    steps=lambda call: dict(scale=(call.heads * call.head_dim) ** -0.5),
)


formula_with(
    "scale-one-over-d",
    "scores scaled by 1/D instead of 1/sqrt(D)",
    "'divide by the dimension' read in prose (at the default scale, the same as scaling twice)",
    lambda call: _default_scale(call) and call.head_dim != 1,
    steps=lambda call: dict(scale=1 / call.head_dim),
)


formula_with(
    "scale-constant",
    "the scale hard-coded to 0.125 = 1/sqrt(64)",
    "a kernel written for d_k = 64 reused for another head size",
    lambda call: _default_scale(call) and call.head_dim != 64,
    steps=lambda call: dict(scale=0.125),
)


def _padded_width(head_dim: int) -> int:
    return max(16, 1 << (head_dim - 1).bit_length())


formula_with(
    "scale-padded-head-dim",
    "the scale taken from the head dim padded to a power of two (at least 16)",
    "the head dim padded for tensor cores before the scale was computed from it",
    lambda call: _default_scale(call) and _padded_width(call.head_dim) != call.head_dim,
    steps=lambda call: dict(scale=_padded_width(call.head_dim) ** -0.5),
)


formula_with(
    "scale-missing",
    "scores not scaled at all",
    "a code path (often the one for a single query row) that skips the multiply",
    lambda call: call.resolved_scale != 1,
    steps=lambda call: dict(scale=1.0),
)


formula_with(
    "scale-missing-at-decode",
    "scores not scaled when the call has a single query row (a decoding step)",
    "a separate fast path for Tq = 1 that skips the multiply the main path does",
    lambda call: call.tq == 1 and call.resolved_scale != 1,
    steps=lambda call: dict(scale=1.0 if call.tq == 1 else None),
)


formula_with(
    "scale-twice",
    "the scale applied twice: to q up front and to the scores again",
    "a refactor that moved the scale without removing the old multiply",
    lambda call: call.resolved_scale != 1,
    steps=lambda call: dict(scale=call.resolved_scale**2),
)


formula_with(
    "scale-explicit-ignored",
    "an explicit scale ignored: 1/sqrt(D) used whatever the caller passed",
    "a wrapper that accepts scale and forgets to pass it down",
    lambda call: call.scale is not None and call.scale != call.head_dim**-0.5,
    steps=lambda call: dict(scale=call.head_dim**-0.5),
)


# Softmax


@mistake(
    "softmax-over-queries",
    "the softmax normalised over the query axis instead of the key axis",
    "axis=-2 where axis=-1 belongs: a transposed-layout habit",
    lambda call: call.tq > 1 or call.tk > 1,
)
def _over_queries(q, k, v, call):
    def weights(scores, visible):
        scores = np.where(visible, scores, -np.inf)
        return _normalised(np.exp(scores - scores.max(-1, keepdims=True)), axis=-2)

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "softmax-no-max-subtraction",
    "exp() of the raw scores, without subtracting the row maximum",
    "the textbook softmax: overflows to inf and then NaN once scores pass ~88 in float32",
    lambda call: True,
)
def _no_max_subtraction(q, k, v, call):
    def weights(scores, visible):
        return _normalised(np.exp(np.where(visible, _in_accumulation(call, scores), -np.inf)))

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "softmax-clamped-scores",
    "scores clipped to [-80, 80] before exp() instead of subtracting the row maximum",
    "a guard against overflow that flattens large scores and their differences",
    lambda call: True,
)
def _clamped(q, k, v, call):
    def weights(scores, visible):
        return _normalised(np.exp(np.clip(np.where(visible, scores, -np.inf), -80, 80)))

    return attend_with(q, k, v, call, weights_of=weights)


# FlashInfer's initial running maximum, where its paged decode kernel once started instead of -inf
SENTINEL_MAX = -5e4


@mistake(
    "row-max-from-a-sentinel",
    f"the row maximum taken as at least {SENTINEL_MAX:g}, where a running maximum started: a row "
    "whose every score lies far below it underflows to 0",
    "a running maximum initialised to a finite sentinel instead of -inf (FlashInfer #4450)",
    lambda call: True,
)
def _sentinel_max(q, k, v, call):
    def weights(scores, visible):
        scores = _in_accumulation(call, np.where(visible, scores, -np.inf))
        top = np.maximum(scores.max(-1, keepdims=True), scores.dtype.type(SENTINEL_MAX))
        exps = np.exp(scores - top)
        total = exps.sum(-1, keepdims=True)
        return np.where(total > 0, exps / np.where(total > 0, total, 1), 0)

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "softmax-over-squeezed-axes",
    "the scores squeezed before the softmax: with one key, it runs over queries or heads",
    "code written for 2-D matrices: np.squeeze drops the key axis when Tk = 1",
    lambda call: call.tk == 1 and call.batch * call.heads * call.tq > 1,
)
def _squeezed(q, k, v, call):
    def weights(scores, visible):
        scores = np.where(visible, scores, -np.inf)
        return softmax(np.squeeze(scores)).reshape(scores.shape)

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "softmax-epsilon-in-denominator",
    "the softmax divided by (sum + 1e-10)",
    "a guard against division by zero, which cannot happen once the maximum is subtracted",
    lambda call: call.dtype == "float64",
)
def _epsilon(q, k, v, call):
    def weights(scores, visible):
        scores = np.where(visible, scores, -np.inf)
        return _normalised(np.exp(scores - scores.max(-1, keepdims=True)), epsilon=1e-10)

    return attend_with(q, k, v, call, weights_of=weights)


def _finer_than_float16(call: Call) -> bool:
    return UNIT_ROUNDOFF[call.dtype] < UNIT_ROUNDOFF["float16"]


@mistake(
    "probabilities-in-float16",
    "the probabilities rounded to float16 before the product with V",
    "P fed to a half-precision matmul even for float32 or float64 inputs",
    _finer_than_float16,
)
def _probabilities_in_float16(q, k, v, call):
    def weights(scores, visible):
        return round_to(masked_softmax(scores, visible), "float16").astype(scores.dtype)

    return attend_with(q, k, v, call, weights_of=weights)


@mistake(
    "row-sum-in-float16",
    "the softmax's row sum accumulated in float16",
    "a half-precision accumulator for the denominator: off by up to ~1e-3 relative, more on "
    "long rows",
    _finer_than_float16,
)
def _row_sum_in_float16(q, k, v, call):
    def weights(scores, visible):
        scores = np.where(visible, scores, -np.inf)
        exps = np.exp(scores - scores.max(-1, keepdims=True))
        total = exps.astype(np.float16).sum(axis=-1, keepdims=True, dtype=np.float16)
        return exps / total.astype(scores.dtype)

    return attend_with(q, k, v, call, weights_of=weights)


formula_with(
    "float16-inside",
    "probabilities or the row sum held in float16: the output only as good as float16 arithmetic",
    "P fed to a half-precision matmul, or a float16 accumulator, in a float32 or float64 kernel",
    _finer_than_float16,
    precision="float16",
)


formula_with(
    "float32-inside",
    "float64 in and out, float32 arithmetic inside",
    "a float32 kernel behind a float64 signature, or a float32 accumulator",
    lambda call: call.dtype == "float64",
    precision="float32",
)


# Heads and batch items


def _grouped_heads(call: Call) -> bool:
    return 1 < call.kv_heads < call.heads


formula_with(
    "gqa-heads-modulo",
    "query head h reads key/value head h % Hkv instead of h // g",
    "np.tile where np.repeat belongs, or a head index taken modulo",
    _grouped_heads,
    steps=lambda call: dict(key_heads=lambda heads, kv: np.arange(heads) % kv),
)


@mistake(
    "gqa-groups-for-group-size",
    "query head h reads key/value head h // Hkv: the number of groups taken for their size",
    "g = Hq / Hkv and Hkv swapped in the head index (right only when g = Hkv)",
    lambda call: _grouped_heads(call) and call.heads // call.kv_heads != call.kv_heads,
)
def _gqa_swapped(q, k, v, call):
    def swapped(heads, kv):
        return np.minimum(np.arange(heads) // kv, kv - 1)

    return attend_with(q, k, v, call, key_heads=swapped)


formula_with(
    "values-of-head-0",
    "every query head reads head 0's values",
    "the value pointer not advanced by the head index",
    lambda call: call.kv_heads > 1,
    steps=lambda call: dict(value_heads=lambda heads, kv: np.zeros(heads, int)),
)


@mistake(
    "output-of-query-head-0",
    "with one key/value head, query head 0's output given to every head",
    "a multi-query fast path that forgot the query heads differ",
    lambda call: call.heads > 1 and call.kv_heads == 1,
)
def _query_head_0(q, k, v, call):
    first = attend_with(q[:, :1], k[:, :1], v[:, :1], replace(call, heads=1, kv_heads=1))
    return np.repeat(first, call.heads, axis=1)


@mistake(
    "keys-of-item-0",
    "every batch item reads item 0's keys and values",
    "a broadcast axis of size 1 taking the batch axis with it, or a batch stride of 0",
    lambda call: call.batch > 1,
)
def _keys_item_0(q, k, v, call):
    k, v = (np.broadcast_to(x[:1], x.shape) for x in (k, v))
    return attend_with(q, k, v, call)


@mistake(
    "heads-reversed",
    "the heads written in reverse order",
    "a head index counted from the wrong end of the grid",
    lambda call: call.heads > 1,
)
def _heads_reversed(q, k, v, call):
    return attend_with(q, k, v, call)[:, ::-1]


@mistake(
    "batch-items-rotated",
    "batch item b's output written to slot b + 1",
    "an output pointer offset computed from the wrong stride",
    lambda call: call.batch > 1,
)
def _batch_rotated(q, k, v, call):
    return np.roll(attend_with(q, k, v, call), 1, axis=0)


@mistake(
    "heads-mixed-by-reshape",
    "(B, H, T, D) viewed as (B, T, H, D) by a reshape where a transpose belongs",
    "splitting heads with view() instead of transpose(): heads and positions are mixed",
    lambda call: call.heads > 1 and call.kv_heads == call.heads,
)
def _reshape_for_transpose(q, k, v, call):
    batch, heads = call.batch, call.heads
    q2, k2, v2 = (
        x.reshape(batch, x.shape[-2], heads, -1).transpose(0, 2, 1, 3)  # (B, H, T, D), mixed
        for x in (q, k, v)
    )
    out = attend_with(q2, k2, v2, call)  # (B, H, Tq, Dv)
    return out.transpose(0, 2, 1, 3).reshape(out.shape)  # (B, Tq, H, Dv) read as (B, H, Tq, Dv)


# Windows


formula_with(
    "window-one-key-too-wide",
    "the window keeps keys p - w - 1 .. p: one key too many",
    "a <= where a < belongs at the window's lower edge",
    lambda call: call.window is not None,
    steps=lambda call: dict(visible=visible_keys_of(call, window=call.window + 1)),
)


formula_with(
    "window-of-w-keys",
    "the window keeps w keys, the query's own included, instead of w + 1",
    "FlashAttention's window_size w read as Mistral's sliding_window W",
    lambda call: call.window is not None,
    steps=lambda call: dict(visible=visible_keys_of(call, window=call.window - 1)),
)


formula_with(
    "window-from-row-index",
    "the window measured back from the row index i instead of the position i + Tk - Tq",
    "the prefill formula reused for decoding against a cache",
    lambda call: call.window is not None and _decodes_or_prefills_unequal(call),
    steps=lambda call: dict(visible=visible_keys_of(call, window_from_row=True)),
)


# Custom masks


def _custom_mask_spans(call: Call, axis: int) -> bool:
    """Whether the call's mask differs along items (axis 0) or heads (axis 1)."""
    if call.attn_mask is None or call.attn_mask.ndim < 4 or call.attn_mask.shape[axis] < 2:
        return False
    first = np.take(call.attn_mask, [0], axis=axis)
    return not np.array_equal(np.broadcast_to(first, call.attn_mask.shape), call.attn_mask)


def _custom_mask_of_first(axis: str):
    """The custom mask's predicate asked at item 0 (or head 0) whatever the grid's."""
    return lambda g, o: custom_mask_sees(replace(g, **{axis: g.batch * 0 if axis == "batch"
                                                       else g.head * 0}), o)  # fmt: skip


formula_with(
    "custom-mask-ignored",
    "the attn_mask accepted but never applied: each row sees every key the causal mask leaves",
    "a mask argument dropped on one path of the kernel (SGLang PR #20278: EAGLE's tree mask)",
    lambda call: call.attn_mask is not None and not call.attn_mask.all(),
    steps=lambda call: dict(visible=visible_keys_of(call, instead={"attn_mask": None})),
)


def _custom_mask_of_first_mistake(axis: str, index: int, text: str, hint: str) -> None:
    """Register the mistake of reading every item's (or head's) rows with the first one's mask."""

    def attend(q, k, v, call):
        twin = _custom_mask_of_first(axis)
        visible = visible_keys_of(call, instead={"attn_mask": twin})
        return attend_with(q, k, v, call, visible=visible)

    mistake(f"custom-mask-of-{axis.replace('batch', 'item')}-0", text, hint,
            lambda call: _custom_mask_spans(call, index))(attend)  # fmt: skip


_custom_mask_of_first_mistake(
    "batch", 0, "every batch item read with item 0's mask",
    "a mask pointer not advanced by the batch stride, or a mask buffer kept from the first item",
)  # fmt: skip
_custom_mask_of_first_mistake(
    "head", 1, "every query head read with head 0's mask",
    "a per-head mask broadcast from its first head, or indexed by the key/value head",
)  # fmt: skip


formula_with(
    "custom-mask-without-causal",
    "the attn_mask applied instead of the causal mask, not with it: masked rows see the future",
    "PyTorch's SDPA takes attn_mask or is_causal, not both; a kernel passing the mask alone",
    lambda call: call.causal and call.attn_mask is not None and call.tq > 1,
    steps=lambda call: dict(visible=visible_keys_of(call, instead={"causal": None})),
)


formula_with(
    "tree-mask-ignored",
    "the draft tree ignored: each draft sees every earlier draft, as in plain causal attention",
    "the tree mask dropped on one path, so speculative decoding verifies garbage (SGLang PR "
    "#20278: EAGLE)",
    lambda call: call.tree_mask is not None and call.tq > 1,
    steps=lambda call: dict(visible=visible_keys_of(call, instead={"tree_mask": None})),
)


@mistake(
    "tree-mask-transposed",
    "the draft tree read transposed: each draft sees its descendants, not its ancestors",
    "a (Tq, Tq) mask indexed [key, query] where [query, key] belongs",
    lambda call: call.tree_mask is not None and call.tq > 1,
)
def _tree_mask_transposed(q, k, v, call):
    def transposed(g, o):
        return tree_mask_sees(g, {**o, "tree_mask": np.swapaxes(o["tree_mask"], -1, -2)})

    visible = visible_keys_of(call, instead={"tree_mask": transposed})
    return attend_with(q, k, v, call, visible=visible)


def _packed_bit_read(bit_in_byte, offset_in_bits: bool = False):
    """The packed mask's predicate reading bit ``bit_in_byte(b)`` of a byte for the block's bit
    b, its offsets in bits where ``offset_in_bits``."""

    def sees(g, o):
        offsets = np.asarray(o["mask_indptr"])
        start = offsets[g.batch] * (1 if offset_in_bits else 8)
        bit = start + g.row * g.length + g.key
        return (o["packed_mask"][bit >> 3] >> bit_in_byte(bit & 7)) & 1 == 1

    return sees


@mistake(
    "packed-mask-big-endian",
    "the packed mask's bits read big-endian: bit b of a block taken from bit 7 - b % 8 of its byte",
    "flashinfer.packbits defaults to bitorder='big', the wrappers pack little-endian",
    lambda call: call.packed_mask is not None,
)
def _packed_mask_big_endian(q, k, v, call):
    reversed_bits = _packed_bit_read(lambda b: 7 - b)
    return attend_with(q, k, v, call, visible=visible_keys_of(call,
                       instead={"packed_mask": reversed_bits}))  # fmt: skip


@mistake(
    "packed-mask-offsets-in-bits",
    "mask_indptr read as bit offsets: every block but the first read from the wrong place",
    "an offset array left in elements after the mask was packed into bytes (FlashInfer PR #2201)",
    lambda call: call.mask_indptr is not None and any(call.mask_indptr[:-1]),
)
def _packed_mask_offsets_in_bits(q, k, v, call):
    in_bits = _packed_bit_read(lambda b: b, offset_in_bits=True)
    return attend_with(q, k, v, call, visible=visible_keys_of(call,
                       instead={"packed_mask": in_bits}))  # fmt: skip


# Index-sparse attention


def listed_counts(call: Call) -> np.ndarray:
    """(B, H, Tq, Tk): how often each row of each query head lists each key (its key/value
    head's row), the slots past topk_length left out."""
    indices = prepared({"kv_indices": call.kv_indices, "topk_length": call.topk_length,
                        "kv_block_size": call.kv_block_size})  # fmt: skip
    rows = np.repeat(indices["kv_indices"], call.heads // call.kv_heads, axis=1)  # (B, H, Tq, K)
    return (rows[..., None, :] == np.arange(call.tk)[:, None]).sum(axis=-1)


@mistake(
    "sparse-empty-slot-as-key-0",
    "an empty slot (-1) read as key 0: every row that has one also sees the first key",
    "-1 sentinels converted to 0 before the gather (vLLM PR #45324)",
    lambda call: call.kv_indices is not None and bool((call.kv_indices < 0).any()),
)
def _empty_slot_as_key_0(q, k, v, call):
    def sees(g, o):  # the rows' lists read anew, not the prepared ones (kv_members)
        indices = np.where(o["kv_indices"] < 0, 0, o["kv_indices"])
        return sparse_indices_sees(g, {**o, "kv_indices": indices, "kv_members": None})

    return attend_with(q, k, v, call, visible=visible_keys_of(call, instead={"kv_indices": sees}))


formula_with(
    "sparse-past-topk-read",
    "the slots past topk_length read as if they counted",
    "the lanes beyond topk_length not set to -1 before the gather (FlashInfer #5095)",
    lambda call: (
        call.kv_indices is not None
        and call.topk_length is not None
        and min(call.topk_length) < call.kv_indices.shape[-1]
    ),
    steps=lambda call: dict(visible=visible_keys_of(replace(call, topk_length=None))),
)


@mistake(
    "sparse-duplicates-counted",
    "a key listed twice in a row weighs twice: the slots' scores summed, not the set's",
    "cuDNN's reference semantics (a multiset) in a kernel whose contract is a set",
    lambda call: (
        call.kv_indices is not None
        and call.sparse_duplicates in (None, "once")
        and bool((listed_counts(call) > 1).any())
    ),
)
def _duplicates_counted(q, k, v, call):
    counts = listed_counts(call)

    def weights(scores, visible):
        with np.errstate(divide="ignore"):
            return softmax(np.where(visible, scores + np.log(counts), -np.inf))

    return attend_with(q, k, v, call, weights_of=weights)


formula_with(
    "sparse-duplicates-collapsed",
    "a key listed twice in a row weighs once, where the declared convention counts each slot",
    "duplicates removed before the gather (a set, FlashAttention 4's reference) in a kernel that "
    "declares cuDNN's multiset",
    lambda call: (
        call.kv_indices is not None
        and call.sparse_duplicates == "count"
        and bool((listed_counts(call) > 1).any())
    ),
    changes=lambda call: dict(sparse_duplicates=None),
)


def _lists_blocks(call: Call) -> bool:
    return call.kv_indices is not None and (call.kv_block_size or 1) > 1


formula_with(
    "sparse-block-index-as-key",
    "each index of kv_indices read as one key, not as the block of kv_block_size keys it names",
    "a token-sparse gather reused for block indices, the block size taken but never applied",
    _lists_blocks,
    steps=lambda call: dict(visible=visible_keys_of(replace(call, kv_block_size=None))),
)


formula_with(
    "sparse-blocks-of-64",
    "blocks read as 64 keys each, whatever kv_block_size the call gives",
    "a block size fixed at native sparse attention's default (64) in the kernel's tiling",
    lambda call: _lists_blocks(call) and call.kv_block_size != 64,
    steps=lambda call: dict(visible=visible_keys_of(replace(call, kv_block_size=64))),
)


def _whole_blocks_end(call: Call) -> int:
    """Where the keys of the whole blocks end: a partial last block starts there."""
    return call.tk - call.tk % call.kv_block_size


@mistake(
    "sparse-partial-block-dropped",
    "the last block's keys never read where kv_block_size does not divide Tk",
    "the blocks counted as Tk // kv_block_size, so the partial one is skipped",
    lambda call: (
        _lists_blocks(call)
        and call.tk % call.kv_block_size != 0
        and bool((call.kv_indices == call.tk // call.kv_block_size).any())
    ),
)
def _partial_block_dropped(q, k, v, call):
    def sees(g, o):
        return sparse_indices_sees(g, o) & (g.key < _whole_blocks_end(call))

    return attend_with(q, k, v, call, visible=visible_keys_of(call, instead={"kv_indices": sees}))


# Padding and packing


@mistake(
    "padding-unmasked",
    "keys past an item's length not masked: the padding is attended",
    "key_lengths accepted but only used to size the output",
    lambda call: call.has_padding,
    per_sequence=False,
)
def _padding_unmasked(q, k, v, call):
    return attend_with(
        q, k, v, call, visible=visible_keys_of(call, lengths_seen=False), zero_padding=False
    )


formula_with(
    "padding-values-weighted-zero",
    "the padding given weight 0 but its values multiplied anyway: 0 x NaN is NaN",
    "P @ V over the whole padded V instead of the item's first L_b rows",
    lambda call: call.has_padding,
    per_sequence=False,
    steps=lambda call: dict(zero_padding=False),
)


formula_with(
    "key-lengths-ignored-in-offset",
    "query row i placed at i + Tk - Tq, the padded length's offset, instead of i + L_b - Tq",
    "the causal offset computed from the padded shape, not the item's own length",
    lambda call: call.has_padding and call.causal,
    per_sequence=False,
    steps=lambda call: dict(visible=visible_keys_of(call, aligned="padded")),
)


formula_with(
    "packed-boundaries-ignored",
    "packed sequences attended as one long causal sequence",
    "cu_seqlens accepted, but the mask built for the packed tokens as a whole",
    lambda call: call.cu_seqlens_q is not None and len(call.cu_seqlens_q) > 2,
    per_sequence=False,
)


@mistake(
    "packed-keys-at-query-offsets",
    "each packed sequence's keys cut at cu_seqlens_q instead of cu_seqlens_k",
    "one offset array used for queries and keys alike",
    lambda call: call.cu_seqlens_q is not None and call.cu_seqlens_q != call.cu_seqlens_k,
    per_sequence=False,
)
def _packed_query_offsets(q, k, v, call):
    key_cuts = (*call.cu_seqlens_q[:-1], call.tk)  # cu_seqlens_q's cuts, the last at Tk
    pieces = []
    for s in range(len(key_cuts) - 1):
        rows = slice(call.cu_seqlens_q[s], call.cu_seqlens_q[s + 1])
        keys = slice(key_cuts[s], key_cuts[s + 1])
        parts = q[..., rows, :], k[..., keys, :], v[..., keys, :]
        one = Call.of(*parts, dtype=call.dtype, causal=call.causal, scale=call.scale)
        pieces.append(attend_with(*parts, one))
    return np.concatenate(pieces, axis=-2)


# Paged caches: the keys a kernel reads through its block table with one step wrong, from the pool
# spec.formula.page_pool lays out (what the worker hands over): pages no table points to hold
# NaN, the slots of an item's last page past its length +inf, and a table's entries past an
# item's pages point at a NaN page.


def _paged(call: Call) -> bool:
    return call.page_size is not None and not call.modified


def _pages_as_read(x: np.ndarray, call: Call, *, late: bool = False) -> np.ndarray:
    """(B, Hkv, W * page_size, D): each item's W table entries' pages as a kernel reads them
    from the pool, its keys (or values) then +inf to the end of its last page, then NaN pages;
    with ``late``, page p read from entry p + 1 (past the table's end, its last entry again)."""
    size = call.page_size
    lengths = call.item_key_lengths
    width = max(max(-(-n // size) for n in lengths), 1)  # the table's entries per item
    pages = np.full((*x.shape[:2], width * size, x.shape[-1]), np.nan)
    for b, length in enumerate(lengths):
        pages[b, :, :length] = x[b, :, :length]
        pages[b, :, length : -(-length // size) * size] = np.inf
    if late:  # entries 1 .. W - 1, then W - 1 again
        pages = np.concatenate([pages[..., size:, :], pages[..., -size:, :]], axis=-2)
    return pages


def _attend_pages(
    q, k, v, call: Call, *, late: bool = False, whole_pages: bool = False,
    boundary_page_dropped: bool = False, key_heads=grouped_heads,
):  # fmt: skip
    """The formula over the keys read through the pages, each item cut at its length (rounded up
    to whole pages with ``whole_pages``, a page short where it ends on a page's boundary with
    ``boundary_page_dropped``; its rows aligned to that length), query head h reading key/value
    head ``key_heads(heads, kv_heads)[h]`` (h // g by default)."""
    size = call.page_size
    lengths = call.item_key_lengths
    if whole_pages:
        lengths = tuple(-(-n // size) * size for n in lengths)
    if boundary_page_dropped:
        lengths = tuple(n - size if n and n % size == 0 else n for n in lengths)
    read_k, read_v = (_pages_as_read(x, call, late=late) for x in (k, v))
    read = replace(call, tk=read_k.shape[-2], key_lengths=tuple(lengths))
    return attend_with(q, read_k, read_v, read, key_heads=key_heads)


@mistake(
    "page-table-one-page-late",
    "page p of an item read from its table's entry p + 1: its keys shifted by a page, its last "
    "page whatever the next entry points at",
    "an index that skips the table's first entry, or a first column taken for a length",
    _paged,
    per_sequence=False,
)
def _page_late(q, k, v, call):
    return _attend_pages(q, k, v, call, late=True)


@mistake(
    "last-page-read-past-length",
    "every slot of an item's last page attended, as if its length were a whole number of pages",
    "the last page's length (FlashInfer's kv_last_page_len) ignored",
    lambda call: _paged(call) and any(n % call.page_size for n in call.item_key_lengths),
    per_sequence=False,
)
def _last_page_whole(q, k, v, call):
    return _attend_pages(q, k, v, call, whole_pages=True)


@mistake(
    "last-page-dropped-on-boundary",
    "an item whose length ends on a page boundary attended without its last page: its length "
    "counted as its full pages before the last plus L % page_size",
    "the last page's length (FlashInfer's kv_last_page_len) taken as L % page_size: 0 on a "
    "boundary",
    lambda call: _paged(call) and any(n and n % call.page_size == 0 for n in call.item_key_lengths),
    per_sequence=False,
)
def _boundary_page_dropped(q, k, v, call):
    return _attend_pages(q, k, v, call, boundary_page_dropped=True)


def _group_rounded_down(heads: int, kv_heads: int) -> np.ndarray:
    """h // g' with g' the group size rounded down to a power of two, within the heads."""
    group = heads // kv_heads
    rounded = 1 << (group.bit_length() - 1)
    return np.minimum(np.arange(heads) // rounded, kv_heads - 1)


@mistake(
    "paged-group-rounded-down",
    "on the paged path, query head h read key/value head h // g' with g' the group size rounded "
    "down to a power of two: right for groups of 1, 2, 4 and 8, wrong for 3 or 7",
    "a paged (tensor-core) decode kernel whose head packing assumes a power-of-two group "
    "(FlashInfer #2896: 28 query heads over 4)",
    lambda call: _paged(call) and (call.heads // call.kv_heads) & (call.heads // call.kv_heads - 1),
    per_sequence=False,
)
def _paged_group_rounded(q, k, v, call):
    return _attend_pages(q, k, v, call, key_heads=_group_rounded_down)


@mistake(
    "pool-in-row-max",
    "each row's softmax maximum taken over the whole pool, pages no item owns included: their "
    "NaN makes every row NaN",
    "a reduction over the pool the kernel was handed instead of the item's pages",
    _paged,
    per_sequence=False,
)
def _pool_max(q, k, v, call):
    return np.full((call.batch, call.heads, call.tq, call.value_dim), np.nan)


# Tiling: an online softmax over key tiles, with one step wrong


def online_softmax(q, k, v, call: Call, *, tile: int, rescale_accumulator: bool = True):
    """The formula as a flash kernel computes it: key tiles of ``tile``, a running maximum m, sum
    l and accumulator acc per row, both rescaled by exp(m_old - m_new) when m grows."""
    k, v = (
        k[:, grouped_heads(call.heads, call.kv_heads)],
        v[:, grouped_heads(call.heads, call.kv_heads)],
    )
    visible = visible_keys_of(call)
    rows = (*q.shape[:-1], 1)  # (B, H, Tq, 1)
    running_max, running_sum = np.full(rows, -np.inf, q.dtype), np.zeros(rows, q.dtype)
    acc = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)  # (B, H, Tq, Dv)
    for start in range(0, call.tk, tile):
        keys = slice(start, start + tile)
        scores = q @ k[..., keys, :].swapaxes(-1, -2) * call.resolved_scale  # (B, H, Tq, tile)
        scores = np.where(visible[..., keys], scores, -np.inf)
        new_max = np.maximum(running_max, scores.max(-1, keepdims=True))
        shift = np.where(np.isfinite(new_max), new_max, 0)  # a row with no key yet: exp -> 0
        probs = np.exp(scores - shift)
        correction = np.exp(np.where(np.isfinite(running_max), running_max - shift, -np.inf))
        running_sum = running_sum * correction + probs.sum(-1, keepdims=True)
        acc = (acc * correction if rescale_accumulator else acc) + probs @ v[..., keys, :]
        running_max = new_max
    return acc / running_sum


def _tiling_mistakes(tile: int) -> None:
    @mistake(
        f"online-softmax-stale-accumulator-{tile}",
        f"an online softmax over key tiles of {tile} that rescales its running sum but not its "
        "output accumulator when the running maximum grows",
        "acc *= exp(m_old - m_new) forgotten: right while Tk fits one tile",
        lambda call: call.tk > tile,
    )
    def _stale(q, k, v, call):
        return online_softmax(q, k, v, call, tile=tile, rescale_accumulator=False)

    @mistake(
        f"last-key-tile-dropped-{tile}",
        f"the last, partial key tile of {tile} never read: keys past the last multiple of {tile} "
        "are not seen",
        "Tk // tile tiles launched where ceil(Tk / tile) belongs",
        lambda call: call.tk > tile and call.tk % tile != 0,
    )
    def _dropped(q, k, v, call):
        kept = tile * (call.tk // tile)
        visible = visible_keys_of(call) & (np.arange(call.tk) < kept)
        return attend_with(q, k, v, call, visible=visible)

    @mistake(
        f"tile-skip-by-row-index-{tile}",
        f"key tiles of {tile} skipped as 'in the future' by the query block's last row index, "
        "not its position i + Tk - Tq",
        "the causal early exit written for Tq = Tk: with a cache, visible tiles are never loaded",
        lambda call: call.causal and call.tq < call.tk,
    )
    def _skipped(q, k, v, call):
        rows, keys = np.arange(call.tq)[:, None], np.arange(call.tk)[None, :]
        last_row_of_block = np.minimum((rows // tile + 1) * tile, call.tq) - 1  # (Tq, 1)
        loaded = (keys // tile) * tile <= last_row_of_block  # (Tq, Tk)
        return attend_with(q, k, v, call, visible=visible_keys_of(call) & loaded)


for _tile in TILE_SIZES:
    _tiling_mistakes(_tile)


# --- the score modifiers (spec.features: softcap, alibi, sinks, chunked) -------------------------
# Each the formula with every modifier of the call and one of them wrong: most are the formula
# itself with another value of the modifier's keyword, the rest replace one of its steps.


def _without_softcap(scores, softcap, **modifiers):
    return modified_scores(scores, **modifiers)


def _has(keyword: str) -> Callable[[Call], bool]:
    return lambda call: getattr(call, keyword) is not None


def _unequal_lengths(call: Call) -> bool:
    return any(queries != keys for queries, keys in call.lengths)


@mistake(
    "softcap-after-mask",
    "the softcap applied after the mask: tanh(-inf) = -1 gives every hidden key a score of -c",
    "the cap put last (a score_mod after the mask's -inf), where it belongs before it",
    lambda call: call.softcap is not None and call.causal,
    modifier="softcap",
)
def _softcap_after_mask(q, k, v, call):
    cap = call.softcap

    def capped_after_the_mask(scores, visible, sinks):
        np.copyto(scores, -np.inf, where=~visible)
        return softmax(cap * np.tanh(scores / cap), sinks)

    return attend_with(q, k, v, call, modify=_without_softcap, weights=capped_after_the_mask)


@mistake(
    "softcap-before-scale",
    "the softcap applied to q k^T before the softmax scale: the cap lands at c * scale",
    "the scale folded into the exponent after a cap written for the raw products",
    _has("softcap"),
    modifier="softcap",
)
def _softcap_before_scale(q, k, v, call):
    # c tanh(x / c) s = (c s) tanh(x s / (c s)): a cap of c s on the scaled scores
    return attend_with(q, k, v, replace(call, softcap=call.softcap * call.resolved_scale))


formula_with(
    "alibi-wrong-sign",
    "ALiBi's bias added with the wrong sign: +m_h * |p - j| favours distant keys",
    "a slope table stored negative and then subtracted",
    _has("alibi_slopes"),
    modifier="alibi",
    changes=lambda call: dict(alibi_slopes=tuple(-m for m in call.alibi_slopes)),
)


@mistake(
    "alibi-top-left",
    "ALiBi's distance measured from the row index i, not the query's position i + Tk - Tq",
    "the bias written for prefill (Tq = Tk): in decoding every distance is off by Tk - Tq",
    lambda call: call.alibi_slopes is not None and _unequal_lengths(call),
    modifier="alibi",
)
def _alibi_top_left(q, k, v, call):
    def from_the_row(scores, key_lengths, **modifiers):
        return modified_scores(scores, key_lengths=(call.tq,), **modifiers)  # position i

    return attend_with(q, k, v, call, modify=from_the_row)


@mistake(
    "sink-scaled",
    "the sink logit multiplied by the softmax scale, as if it were a q k^T product",
    "the sink joined to the scores before the scale is applied to them",
    lambda call: call.sinks is not None and any(np.isfinite(s) and s != 0 for s in call.sinks),
    modifier="sinks",
)
def _sink_scaled(q, k, v, call):
    return attend_with(
        q, k, v, replace(call, sinks=tuple(s * call.resolved_scale for s in call.sinks))
    )


formula_with(
    "sink-dropped",
    "the sink logits accepted and ignored: plain attention, every row's weights summing to 1",
    "a backend or wrapper that does not forward the argument",
    lambda call: call.sinks is not None and any(np.isfinite(s) for s in call.sinks),
    modifier="sinks",
    changes=lambda call: dict(sinks=None),
)


@mistake(
    "sink-minus-inf-as-zero",
    "a sink of -inf (a head without one) read as 0: exp(0) joins each of that head's denominators",
    "the sinks sanitised with nan_to_num(..., neginf=0), or a zero-filled sink for heads "
    "without one",
    lambda call: call.sinks is not None and any(np.isneginf(s) for s in call.sinks),
    modifier="sinks",
)
def _sink_minus_inf_as_zero(q, k, v, call):
    sinks = tuple(0.0 if np.isneginf(s) else s for s in call.sinks)
    return attend_with(q, k, v, replace(call, sinks=sinks))


formula_with(
    "chunk-one-key-early",
    "each chunk also sees the last key of the chunk before it",
    "a chunk start of p // C * C - 1, or a <= where < belongs",
    lambda call: call.chunk is not None and call.tk > call.chunk,
    modifier="chunked",
    steps=lambda call: dict(visible=visible_keys_of(call, chunk_reach=1)),
)


formula_with(
    "chunk-from-row-index",
    "chunks cut at the row index i, not at the query's position i + Tk - Tq",
    "the chunk mask written for prefill: in decoding the query's chunk is the first one",
    lambda call: call.chunk is not None and _unequal_lengths(call),
    modifier="chunked",
    steps=lambda call: dict(visible=visible_keys_of(call, chunk_from_row=True)),
)


def mistakes_showing_in(call: Call) -> list[Mistake]:
    """The mistakes whose variant can differ from the formula on ``call``: those of a score
    modifier where it is on, the others only where no feature the catalogue does not model is."""
    # A packed mask of packed sequences holds a block per sequence, read only sequence by
    # sequence: a variant of the whole call (boundaries ignored) has no mask to read.
    whole = not (call.packed_mask is not None and call.cu_seqlens_q is not None)
    return [
        m
        for m in of_family(Family.OUTPUT)
        if (m.modifier is not None or not call.modified)
        and (m.per_sequence or whole)
        and m.shows(call)
    ]
