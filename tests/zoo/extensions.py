"""Zoo members for the extensions (grouped-query heads, windows, padded batches, strided inputs,
repeats and batches): one realistic bug each, and unusual correct roads for every feature.

A member declares the extensions it implements by naming their keywords (``enable_gqa``,
``window``, ``key_lengths``), as any plain callable does; all of them follow
:func:`tests.zoo.formula.attend_extended` except in the one step their docstring names.
"""

from __future__ import annotations

import itertools

import numpy as np

from impls.contract import LAYOUTS, resolve_scale
from spec.formula import visible_keys
from tests.zoo import correct_variant, mutant
from tests.zoo.formula import attend_extended, scores_of, softmax
from tests.zoo.streaming import streaming_attention

# --- grouped heads ------------------------------------------------------------------------------


@mutant("grouped heads", "GQA-GROUPS", mistake="gqa-heads-modulo")
def gqa_heads_modulo(q, k, v, *, causal=True, scale=None, enable_gqa=False):
    """Query head h reads key/value head h % Hkv (np.tile where np.repeat belongs, or a kernel's
    head index taken modulo): the same as h // g only when Hkv = 1 or Hq = Hkv."""

    def modulo(heads, kv_heads):
        return np.arange(heads) % kv_heads

    return attend_extended(q, k, v, causal=causal, scale=scale, kv_head_of=modulo)


@mutant("grouped heads", "GQA-GROUPS", mistake="gqa-groups-for-group-size")
def gqa_groups_counted_as_group_size(q, k, v, *, causal=True, scale=None, enable_gqa=False):
    """Query head h reads key/value head h // Hkv, the number of groups taken for the group size
    g = Hq / Hkv (clamped to the last head, as a kernel reading past it would not be): right
    only when g = Hkv."""

    def swapped(heads, kv_heads):
        if heads == kv_heads:  # the plain multi-head path is right
            return np.arange(heads)
        return np.minimum(np.arange(heads) // kv_heads, kv_heads - 1)

    return attend_extended(q, k, v, causal=causal, scale=scale, kv_head_of=swapped)


@mutant("grouped heads", "GQA-MQA", mistake="output-of-query-head-0")
def mqa_computes_one_query_head(q, k, v, *, causal=True, scale=None, enable_gqa=False):
    """With a single key/value head, computes query head 0 only and gives its output to every
    head: a multi-query 'fast path' that forgot the query heads differ."""
    if k.shape[1] != 1:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    first = attend_extended(q[:, :1], k, v, causal=causal, scale=scale)
    return np.repeat(first, q.shape[1], axis=1)


@mutant("grouped heads", "GQA-MQA", mistake="keys-of-item-0")
def mqa_keys_of_another_item(q, k, v, *, causal=True, scale=None, enable_gqa=False):
    """With a single key/value head, every batch item reads item 0's keys and values: the head
    axis of size 1 broadcast, and the batch axis with it. Right when B = 1."""
    if k.shape[1] != 1:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    first = np.broadcast_to(k[:1], k.shape), np.broadcast_to(v[:1], v.shape)
    return attend_extended(q, *first, causal=causal, scale=scale)


@correct_variant
def gqa_group_rows_stacked(q, k, v, *, causal=True, scale=None, enable_gqa=False):
    """Stacks each group's g query heads along the rows, (B, Hkv, g * Tq, D), and attends them
    to their one key/value head in a single product, as GQA kernels do to reuse K and V; the
    causal mask follows each stacked row's own position."""
    (batch, heads, tq, d), kv_heads = q.shape, k.shape[1]
    group = heads // kv_heads
    stacked = q.reshape(batch, kv_heads, group * tq, d)  # (B, Hkv, g*Tq, D)
    rows = np.arange(group * tq) % tq  # each stacked row's index within its own head
    visible = np.ones((group * tq, k.shape[-2]), dtype=bool)
    if causal:
        visible = np.arange(k.shape[-2])[None, :] <= rows[:, None] + k.shape[-2] - tq
    weights = softmax(np.where(visible, scores_of(stacked, k, scale), -np.inf))
    out = weights @ v  # (B, Hkv, g*Tq, Dv)
    return out.reshape(batch, heads, tq, v.shape[-1]).astype(q.dtype)


# --- window -------------------------------------------------------------------------------------


@mutant("window", "WINDOW-BOUNDS", mistake="window-one-key-too-wide")
def window_one_key_too_wide(q, k, v, *, causal=True, scale=None, window=None):
    """Keeps keys p - w - 1 <= j <= p: a `<=` where a `<` belongs at the window's lower edge."""
    wider = None if window is None else window + 1
    return attend_extended(q, k, v, causal=causal, scale=scale, window=wider)


@mutant("window", "WINDOW-BOUNDS")
def window_zero_read_as_no_window(q, k, v, *, causal=True, scale=None, window=None):
    """Tests its window for truth (``if window:``), so that a window of 0, each query seeing its
    own key alone, is no window at all: plain causal attention there, right at every other w
    (regime window.zero)."""
    return attend_extended(q, k, v, causal=causal, scale=scale, window=window or None)


@mutant("window", "WINDOW-BOUNDS", mistake="window-of-w-keys")
def window_of_w_keys(q, k, v, *, causal=True, scale=None, window=None):
    """Keeps w keys including the query's own (p - w < j <= p): FlashAttention's w read as
    Mistral's sliding_window W, one key too few."""
    visible = None
    if window is not None:
        tq, tk = q.shape[-2], k.shape[-2]
        positions = np.arange(tq)[:, None] + tk - tq
        keys = np.arange(tk)[None, :]
        visible = (keys <= positions) & (keys > positions - window)
    return attend_extended(q, k, v, causal=causal, scale=scale, visible=visible)


@mutant("window", "WINDOW-BOUNDS", mistake="window-from-row-index")
def window_from_row_index(q, k, v, *, causal=True, scale=None, window=None):
    """Measures the window back from the query's row index i instead of its absolute position
    i + Tk - Tq: right in prefill, too wide when decoding against a cache."""
    visible = None
    if window is not None:
        tq, tk = q.shape[-2], k.shape[-2]
        rows, keys = np.arange(tq)[:, None], np.arange(tk)[None, :]
        visible = (keys <= rows + tk - tq) & (keys >= rows - window)
    return attend_extended(q, k, v, causal=causal, scale=scale, visible=visible)


@mutant("window", "WINDOW-INVARIANT")
def window_max_over_causal_keys(q, k, v, *, causal=True, scale=None, window=None):
    """Shifts a row's exponentials by the largest of all its causal scores, those behind the
    window included, and then masks the window: the same weights up to rounding, but a key the
    row cannot see moves its bits."""
    scores = scores_of(q, k, scale)
    tq, tk = scores.shape[-2:]
    causal_only = visible_keys(tq, tk, causal=causal)
    seen = visible_keys(tq, tk, causal=causal, window=window)
    shift = np.where(causal_only, scores, -np.inf).max(axis=-1, keepdims=True)
    weights = np.where(seen, np.exp(scores - shift), 0)
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@mutant("window", "WINDOW-INVARIANT")
def window_soft_lower_edge(q, k, v, *, causal=True, scale=None, window=None):
    """Adds a score bias of -30 to the keys behind the window instead of masking them: a 'large
    enough' negative, but exp(-30) is about 1e-13, not 0, so those keys still count."""
    scores = scores_of(q, k, scale)
    tq, tk = scores.shape[-2:]
    causal_only = visible_keys(tq, tk, causal=causal)
    behind = causal_only & ~visible_keys(tq, tk, causal=causal, window=window)
    scores = np.where(causal_only, scores - scores.dtype.type(30) * behind, -np.inf)
    return (softmax(scores) @ v).astype(q.dtype)


@correct_variant
def window_keys_sliced_per_row(q, k, v, *, causal=True, scale=None, window=None):
    """Attends each query row to the slice of keys p - w .. p alone, a row at a time: no mask at
    all, the window as an index range."""
    tq, tk = q.shape[-2], k.shape[-2]
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    for row in range(tq):
        position = row + tk - tq
        first = 0 if window is None else max(position - window, 0)
        last = position + 1 if causal else tk
        scores = scores_of(q[..., row : row + 1, :], k[..., first:last, :], scale)
        out[..., row : row + 1, :] = softmax(scores) @ v[..., first:last, :]
    return out


# --- padding ------------------------------------------------------------------------------------


@mutant("padding", "PAD-KEYS", mistake="max-before-masking")
def padding_in_row_max(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Takes each row's maximum over every key, the padding's included, before masking: finite
    padding only changes rounding, but an inf or NaN key there poisons the item's rows."""
    scores = scores_of(q, k, scale)
    seen = visible_keys(*scores.shape[-2:], causal=causal, key_lengths=key_lengths)
    with np.errstate(invalid="ignore"):
        weights = np.where(seen, np.exp(scores - scores.max(axis=-1, keepdims=True)), 0)
    lengths = k.shape[-2] if key_lengths is None else np.asarray(key_lengths)
    padding = np.arange(v.shape[-2])[None, :] >= np.reshape(lengths, (-1, 1))
    v = np.where(padding[:, None, :, None], 0, v)
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@mutant("padding", "PAD-KEYS", mistake="padding-values-weighted-zero", alike=("padding-unmasked",))
def padding_values_weighted_zero(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Gives the padding a weight of 0 but multiplies the whole of V: 0 x NaN is NaN, so a NaN
    value in the padding reaches every row of its item."""
    return attend_extended(
        q, k, v, causal=causal, scale=scale, key_lengths=key_lengths, zero_padded_values=False
    )


@mutant("padding", "PAD-KEYS", mistake="key-lengths-ignored-in-offset")
def key_lengths_top_left(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Cuts each item's keys at its length but places query row i at position i + Tk - Tq, the
    padded length's offset, instead of i + L_b - Tq: right for the items that fill the batch."""
    visible = None
    if key_lengths is not None:
        tq, tk = q.shape[-2], k.shape[-2]
        lengths = np.asarray(key_lengths)[:, None, None]  # (B, 1, 1)
        keys, rows = np.arange(tk)[None, None, :], np.arange(tq)[None, :, None]
        seen = keys < lengths
        if causal:
            seen = seen & (keys <= rows + tk - tq)
        visible = seen[:, None]  # (B, 1, Tq, Tk)
    return attend_extended(
        q, k, v, causal=causal, scale=scale, key_lengths=key_lengths, visible=visible
    )


@mutant("padding", "PAD-KEYS", reads_fresh_memory=True)
def padded_query_rows_left_unwritten(
    q, k, v, *, causal=True, scale=None, key_lengths=None, query_lengths=None
):
    """Declares zero padded query rows but writes only each item's valid rows into a fresh
    output: the padding keeps what the allocation held (the previous call's rows, or zeros by
    luck)."""
    if query_lengths is None:
        return attend_extended(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    keys = key_lengths or [k.shape[-2]] * q.shape[0]
    for b, (n, m) in enumerate(zip(query_lengths, keys, strict=True)):
        out[b : b + 1, :, :n] = attend_extended(
            q[b : b + 1, :, :n],
            k[b : b + 1, :, :m],
            v[b : b + 1, :, :m],
            causal=causal,
            scale=scale,
        )
    return out


padded_query_rows_left_unwritten.padded_query_rows = "zeros"


@mutant("padding", "PAD-KEYS")
def query_rows_at_padded_offset(
    q, k, v, *, causal=True, scale=None, key_lengths=None, query_lengths=None
):
    """Places item b's query row i at position i + L_b - Tq, the padded query length's offset,
    instead of i + L_b - Lq_b (a row the wrong offset leaves keyless keeps key 0): its valid rows
    see too few keys."""
    keys = key_lengths or [k.shape[-2]] * q.shape[0]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    rows = np.arange(q.shape[-2])[:, None]
    for b, m in enumerate(keys):
        visible = None
        if causal:
            visible = np.arange(m)[None, :] <= rows + m - q.shape[-2]  # (Tq, L_b)
            visible[:, 0] = True
        item = slice(b, b + 1)
        out[item] = attend_extended(
            q[item], k[item, :, :m], v[item, :, :m], causal=causal, scale=scale, visible=visible
        )
    return out


query_rows_at_padded_offset.padded_query_rows = "unspecified"


@correct_variant
def padded_batch_as_packed(
    q, k, v, *, causal=True, scale=None, key_lengths=None, query_lengths=None
):
    """Lays each item's valid queries and keys end to end, attends them as packed sequences under
    one block-diagonal mask, and scatters the rows back; padded query rows are zeros."""
    queries = query_lengths or [q.shape[-2]] * q.shape[0]
    keys = key_lengths or [k.shape[-2]] * q.shape[0]

    def pack(x, lengths):  # (B, H, T, D) -> (1, H, sum of lengths, D)
        return np.concatenate([x[b : b + 1, :, :n] for b, n in enumerate(lengths)], axis=-2)

    cu_q, cu_k = np.cumsum([0, *queries]), np.cumsum([0, *keys])
    visible = packed_mask(int(cu_q[-1]), int(cu_k[-1]), cu_q, cu_k, causal=causal)
    rows = attend_extended(
        pack(q, queries), pack(k, keys), pack(v, keys), causal=causal, scale=scale, visible=visible
    )
    out = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    for b, n in enumerate(queries):
        if keys[b]:  # an item with no key keeps its zero rows (EMPTY-KV)
            out[b, :, :n] = rows[0, :, cu_q[b] : cu_q[b] + n]
    return out


padded_batch_as_packed.padded_query_rows = "zeros"


@correct_variant
def padding_items_sliced(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Computes each batch item on its first L_b keys alone: the padding is never even read."""
    lengths = [k.shape[-2]] * q.shape[0] if key_lengths is None else key_lengths
    return np.concatenate(
        [
            attend_extended(
                q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=causal, scale=scale
            )
            if n
            else np.zeros((1, *q.shape[1:-1], v.shape[-1]), q.dtype)  # no key: zero rows
            for b, n in enumerate(lengths)
        ]
    )


@mutant("padding", "EMPTY-KV")
def empty_item_rows_nan_declared_zeros(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Computes an item with no key like any other: its rows are the softmax's 0 / 0, NaN,
    while it declares (by default) that such rows are zeros."""
    with np.errstate(invalid="ignore"):
        return attend_extended(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)


@mutant("padding", "EMPTY-KV", reads_fresh_memory=True)
def empty_item_rows_left_unwritten(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Skips an item with no key, as a grid with no key tile to visit does, and leaves its rows
    as they were allocated."""
    lengths = [k.shape[-2]] * q.shape[0] if key_lengths is None else key_lengths
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    for b, n in enumerate(lengths):
        if n:
            out[b : b + 1] = attend_extended(
                q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=causal, scale=scale
            )
    return out


@correct_variant
def empty_items_declared_nan(q, k, v, *, causal=True, scale=None, key_lengths=None):
    """Declares empty_rows='nan' and computes an item with no key as the formula does: 0 / 0 in
    every one of its rows."""
    with np.errstate(invalid="ignore"):
        return attend_extended(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)


empty_items_declared_nan.empty_rows = "nan"


def packed_mask(tq: int, tk: int, cu_q, cu_k, *, causal: bool, align_to_keys: bool = True):
    """(Tq, Tk) True where packed query row i sees key j: same sequence, and bottom-right aligned
    within it (top-left where ``align_to_keys`` is off)."""
    visible = np.zeros((tq, tk), dtype=bool)
    for (qa, qb), (ka, kb) in zip(itertools.pairwise(cu_q), itertools.pairwise(cu_k), strict=True):
        rows, keys = np.arange(qb - qa)[:, None], np.arange(kb - ka)[None, :]
        offset = (kb - ka) - (qb - qa) if align_to_keys else 0
        visible[qa:qb, ka:kb] = keys <= rows + offset if causal else True
    return visible


@mutant("padding", "PAD-PACKED", mistake="packed-boundaries-ignored")
def packed_boundaries_ignored(
    q, k, v, *, causal=True, scale=None, cu_seqlens_q=None, cu_seqlens_k=None
):
    """Accepts cu_seqlens and masks the packed tokens as one long causal sequence: every token
    also attends to the sequences packed before it."""
    return attend_extended(q, k, v, causal=causal, scale=scale)


@mutant("padding", "PAD-PACKED", mistake="packed-keys-at-query-offsets")
def packed_keys_at_query_offsets(
    q, k, v, *, causal=True, scale=None, cu_seqlens_q=None, cu_seqlens_k=None
):
    """Cuts the keys at cu_seqlens_q as well as the queries: right when every sequence has as many
    queries as keys (prefill), wrong when decoding or prefilling against a cache."""
    if cu_seqlens_q is None:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    shifted = (*cu_seqlens_q[:-1], k.shape[-2])  # cu_seqlens_q's cuts, ending at Tk
    visible = packed_mask(q.shape[-2], k.shape[-2], cu_seqlens_q, shifted, causal=causal)
    return attend_extended(q, k, v, causal=causal, scale=scale, visible=visible)


@mutant("padding", "PAD-PACKED", mistake="mask-top-left")
def packed_sequences_top_left(
    q, k, v, *, causal=True, scale=None, cu_seqlens_q=None, cu_seqlens_k=None
):
    """Aligns each packed sequence's queries with its first keys (row i sees keys up to i), the
    usual triangular mask per block: right in prefill, blind to a sequence's cached keys."""
    if cu_seqlens_q is None:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    visible = packed_mask(
        q.shape[-2], k.shape[-2], cu_seqlens_q, cu_seqlens_k, causal=causal, align_to_keys=False
    )
    return attend_extended(q, k, v, causal=causal, scale=scale, visible=visible)


@correct_variant
def packed_block_diagonal_mask(
    q, k, v, *, causal=True, scale=None, cu_seqlens_q=None, cu_seqlens_k=None
):
    """Attends all packed tokens in one product under a block-diagonal mask, each block
    bottom-right aligned (xformers' BlockDiagonalCausalFromBottomRightMask), instead of a call
    per sequence."""
    if cu_seqlens_q is None:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    visible = packed_mask(q.shape[-2], k.shape[-2], cu_seqlens_q, cu_seqlens_k, causal=causal)
    with np.errstate(invalid="ignore"):  # rows of a sequence with no key: 0 / 0, zeroed below
        out = attend_extended(q, k, v, causal=causal, scale=scale, visible=visible)
    return np.where(visible.any(axis=-1)[:, None], out, out.dtype.type(0))  # (Tq, 1) rows


# --- strides ------------------------------------------------------------------------------------


def dense_view(x: np.ndarray, batch_stride: int) -> np.ndarray:
    """``x``'s memory read with its own strides for every axis but the batch's, which is taken as
    ``batch_stride`` elements. Broadcast inputs (a stride of 0) are copied first, as the member's
    wrapper does."""
    if 0 in x.strides:
        return np.ascontiguousarray(x)
    strides = (batch_stride * x.itemsize, *x.strides[1:])
    return np.lib.stride_tricks.as_strided(x, shape=x.shape, strides=strides, writeable=False)


@mutant("strides", "LAYOUT-STRIDES")
def batch_stride_from_shape(q, k, v, *, causal=True, scale=None):
    """Reads each input's strides for heads, rows and columns, but computes the batch stride
    from the shape (H * T * D), as a kernel taking three strides does: right for dense arrays
    and transposed ones, wrong for slices of a packed projection or rows with gaps."""
    q, k, v = (dense_view(x, int(np.prod(x.shape[1:]))) for x in (q, k, v))
    return attend_extended(q, k, v, causal=causal, scale=scale)


@mutant("strides", "LAYOUT-STRIDES")
def row_pitch_from_head_dim(q, k, v, *, causal=True, scale=None):
    """Takes the distance between rows to be D elements whatever the row stride says, the
    pitch of a dense array: right until the rows have gaps or interleave with other arrays."""

    def pitched(x):
        if 0 in x.strides:
            return np.ascontiguousarray(x)
        strides = (*x.strides[:2], x.itemsize * x.shape[-1], x.strides[-1])  # the bug: 3rd
        return np.lib.stride_tricks.as_strided(x, shape=x.shape, strides=strides, writeable=False)

    q, k, v = (pitched(x) for x in (q, k, v))
    return attend_extended(q, k, v, causal=causal, scale=scale)


@correct_variant
def einsum_on_views(q, k, v, *, causal=True, scale=None):
    """Computes scores and output with np.einsum straight on the views it is given, transposed,
    sliced, gapped or broadcast, never copying them to dense arrays; declares every layout."""
    d = q.shape[-1]
    scores = np.einsum("bhid,bhjd->bhij", q, k) * q.dtype.type(resolve_scale(scale, d))
    visible = visible_keys(q.shape[-2], k.shape[-2], causal=causal)
    weights = softmax(np.where(visible, scores, -np.inf))
    return np.einsum("bhij,bhjd->bhid", weights, v).astype(q.dtype)


einsum_on_views.layouts = tuple(LAYOUTS)


# --- memory that was never written -------------------------------------------------------------


def rows_into(out: np.ndarray, q, k, v, rows: range, *, causal, scale) -> np.ndarray:
    """Writes attention rows ``rows`` of (q, k, v) into ``out`` and returns it."""
    full = attend_extended(q, k, v, causal=causal, scale=scale)
    out[..., rows, :] = full[..., rows, :]
    return out


@mutant("memory", "OUT-WRITTEN", reads_fresh_memory=True)
def last_partial_tile_unwritten(q, k, v, *, causal=True, scale=None):
    """Launches Tq // 64 row tiles (floor where ceil belongs): the rows of a last, partial tile
    keep whatever the freshly allocated output held, often the previous call's right answer."""
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    tiles = max(q.shape[-2] // 64, 1)
    return rows_into(out, q, k, v, range(min(64 * tiles, q.shape[-2])), causal=causal, scale=scale)


@mutant("memory", "OUT-WRITTEN", reads_fresh_memory=True)
def last_head_unwritten(q, k, v, *, causal=True, scale=None):
    """Launches B * H - 1 (batch, head) programs, an off-by-one in the grid: the last head of the
    last item keeps what its freshly allocated memory held."""
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    full = attend_extended(q, k, v, causal=causal, scale=scale)
    pairs = out.reshape(-1, *out.shape[-2:])  # (B*H, Tq, Dv), a view
    pairs[: len(pairs) - 1] = full.reshape(-1, *full.shape[-2:])[: len(pairs) - 1]
    return out


@correct_variant
def output_written_tile_by_tile(q, k, v, *, causal=True, scale=None):
    """Allocates its output uninitialised and writes it in tiles of 64 query rows, the partial
    last tile included (ceil, not floor): every element written."""
    out = np.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
    full = attend_extended(q, k, v, causal=causal, scale=scale)
    for start in range(0, q.shape[-2], 64):
        out[..., start : start + 64, :] = full[..., start : start + 64, :]
    return out


# --- stress -------------------------------------------------------------------------------------


LARGE_CALL_PAIRS = 32  # (batch, head) pairs from which the racy members take their racy path


@mutant("stress", "STRESS-REPEAT")
def split_keys_summed_as_they_finish(q, k, v, *, causal=True, scale=None):
    """Splits large calls' keys in four chunks whose partial sums are added in the order their
    threads finish (a fresh order each call, as atomicAdd gives): the same values up to rounding,
    other bits from call to call. Small calls take the sequential path."""
    if q.shape[0] * q.shape[1] < LARGE_CALL_PAIRS:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    scores = np.where(
        visible_keys(q.shape[-2], k.shape[-2], causal=causal), scores_of(q, k, scale), -np.inf
    )
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    chunks = np.array_split(np.arange(k.shape[-2]), 4)
    numerator = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    denominator = np.zeros((*q.shape[:-1], 1), dtype=q.dtype)
    for chunk in np.random.default_rng().permutation(len(chunks)):
        keys = chunks[chunk]
        numerator += weights[..., keys] @ v[..., keys, :]
        denominator += weights[..., keys].sum(axis=-1, keepdims=True)
    return (numerator / denominator).astype(q.dtype)


@mutant("stress", "STRESS-REPEAT")
def keys_summed_in_any_order(q, k, v, *, causal=True, scale=None):
    """Sums large calls' keys in the order idle threads steal them (a fresh order each call):
    every order gives the attention, each with its own bits."""
    if q.shape[0] * q.shape[1] < LARGE_CALL_PAIRS:
        return attend_extended(q, k, v, causal=causal, scale=scale)
    order = np.random.default_rng().permutation(k.shape[-2])
    visible = visible_keys(q.shape[-2], k.shape[-2], causal=causal)[..., order]
    scores = np.where(visible, scores_of(q, k[..., order, :], scale), -np.inf)
    return (softmax(scores) @ v[..., order, :]).astype(q.dtype)


@mutant("stress", "BATCH-INVARIANT")
def tile_width_from_batch_size(q, k, v, *, causal=True, scale=None):
    """Picks the key tile width from the batch size (32 keys for small batches, 64 from four
    items on, a tuning table): every call right, but a sequence's bits depend on its company."""
    block_k = 32 if q.shape[0] < 4 else 64
    return streaming_attention(q, k, v, causal=causal, scale=scale, block_k=block_k)


@mutant("stress", "BATCH-INVARIANT")
def exponentials_shifted_by_batch_max(q, k, v, *, causal=True, scale=None):
    """Shifts every exponential by the largest score in the whole call rather than its row's
    (one reduction instead of B * H * Tq): right up to rounding, but each row's bits depend on
    the other sequences."""
    scores = np.where(
        visible_keys(q.shape[-2], k.shape[-2], causal=causal), scores_of(q, k, scale), -np.inf
    )
    weights = np.exp(scores - scores.max())
    return ((weights / weights.sum(axis=-1, keepdims=True)) @ v).astype(q.dtype)


@correct_variant
def split_keys_in_fixed_order(q, k, v, *, causal=True, scale=None):
    """Splits the keys in four chunks and adds their partial sums in a fixed order, large call
    or small: a split whose bits never change."""
    scores = np.where(
        visible_keys(q.shape[-2], k.shape[-2], causal=causal), scores_of(q, k, scale), -np.inf
    )
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    numerator = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    denominator = np.zeros((*q.shape[:-1], 1), dtype=q.dtype)
    for keys in np.array_split(np.arange(k.shape[-2]), 4):
        numerator += weights[..., keys] @ v[..., keys, :]
        denominator += weights[..., keys].sum(axis=-1, keepdims=True)
    return (numerator / denominator).astype(q.dtype)
