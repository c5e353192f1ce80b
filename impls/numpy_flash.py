"""``numpy_flash``: the tiling of ``cupy_flash``, step for step, in NumPy.

A GPU kernel cannot be validated on a machine without a GPU; its algorithm can. This module is
that algorithm with the kernel's own tile sizes (``cupy_flash`` compiles its CUDA source with
these constants), so every CPU run holds the tiling to the claims:

* queries in blocks of :data:`BLOCK_M` rows (one CUDA thread block each), keys streamed in tiles
  of :data:`BLOCK_N`, the last tile of each partial when T is not a multiple;
* tile skipping: a causal query block stops after the tile holding its last row's last visible
  key (bottom-right aligned: row i sees keys j <= i + Tk - Tq);
* the online softmax: a running row max m and sum l; each new tile rescales the accumulator and
  l by exp(m_old - m_new); a row that has seen only masked keys shifts by 0 instead of -inf;
* one division by l at the end, and optionally the log-sum-exp m + log(l) of each row;
* the extensions: query head h reads key/value head h // g; a left window w, or a chunk C, also
  skips the tiles before the block's first row's window or chunk and masks the keys outside
  each row's; with key lengths, item b's tiles end at its L_b keys and its rows sit at
  i + L_b - Tq; a packed sequence is an item of its own; a paged item's tiles are read through
  its block table, page by page, and no other page; a softcap and ALiBi's bias modify each
  tile's scores before the mask, and a sink joins the denominator after the last tile.

The arithmetic is in the input's dtype (float32 or float64), as the kernel's float32 path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from impls.block_scaled_calls import is_block_scaled_call
from impls.contract import (
    EVERY_EXTENSION,
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    NumpyArrays,
    resolve_scale,
    validate_inputs,
)
from impls.fp8_calls import is_fp8_call
from impls.numpy_block_scaled import block_scaled_attention
from impls.numpy_fp8 import FP8_QUERY_DTYPES, flash3_attention
from spec.formula import merge_states
from spec.fp8 import round_p
from spec.masks import (
    LISTED_KEYWORDS,
    Grid,
    cut_to_item,
    extent_of,
    mask_options,
    prepared,
    visible,
)

BLOCK_M = 64  # query rows per block: 4 warps x 16 rows in the tensor-core kernel
BLOCK_N = 64  # keys per tile streamed through shared memory


class MaskOfTiles:
    """Which keys each query row sees (spec.masks' kinds, declared once), asked tile by tile as
    a block-sparse kernel asks: the tiles a query block visits are those in which some row of it
    sees a key."""

    def __init__(self, tq: int, tk: int, *, causal: bool, heads: int, **options):
        self.options = prepared({"causal": causal, **mask_options(options)})
        self.tq, self.tk = tq, tk
        self.grid = Grid.over(*extent_of(self.options, heads=heads), tq, tk)
        self.offset = tk - tq
        # kinds whose inputs say which tiles hold a visible key: a tile none is in is skipped
        self.sparse = any(self.options.get(name) is not None for name in LISTED_KEYWORDS)
        # a listed mask's tiles, asked once to choose the tiles and again to mask them: kept
        # (as large as the mask the call was given; a plain causal call keeps none)
        self.asked: dict[tuple[int, int, int, int], np.ndarray] = {}

    def seen(self, block_start, block_stop, start, stop) -> np.ndarray:
        """(B or 1, H or 1, bm, bn): True where a row of the block sees a key of the tile."""
        key = (block_start, block_stop, start, stop)
        if key in self.asked:
            return self.asked[key]
        tile = self.grid.tile(slice(block_start, block_stop), slice(start, stop))
        seen = visible(tile, self.options)
        if self.sparse:
            self.asked[key] = seen
        return seen

    def tiles_seen(self, block_start: int, block_stop: int) -> list[tuple[int, int]]:
        """(start, stop) of each key tile the query block [block_start, block_stop) visits."""
        bounds = key_tiles(block_start, block_stop, self.tk, self.offset,
                           self.options["causal"], self.options.get("window"),
                           self.options.get("chunk"))  # fmt: skip
        if not self.sparse:
            return bounds
        return [(a, b) for a, b in bounds if self.seen(block_start, block_stop, a, b).any()]


def key_tiles(
    block_start: int,
    block_stop: int,
    tk: int,
    offset: int,
    causal: bool,
    window: int | None = None,
    chunk: int | None = None,
):
    """(start, stop) of each key tile a query block [block_start, block_stop) visits."""
    # The block's last row sits at absolute position block_stop - 1 + offset; no row sees past it.
    end = min(tk, block_stop + offset) if causal else tk
    # Its first row sees nothing before its position - w, nor before its chunk's first key; nor
    # does any later row.
    first_position = block_start + offset
    first = 0
    if window is not None:
        first = max(first_position - window, 0)
    if chunk is not None:
        first = max(first, first_position // chunk * chunk)
    first = first // BLOCK_N * BLOCK_N
    return [(start, min(start + BLOCK_N, tk)) for start in range(first, end, BLOCK_N)]


@dataclass(frozen=True)
class DenseKeys:
    """Keys and values as (B, H, Tk, D) and (B, H, Tk, Dv) arrays, each query head's key/value
    head already in its place: a tile is a slice."""

    k: np.ndarray
    v: np.ndarray

    @property
    def length(self) -> int:
        return self.k.shape[-2]

    @property
    def value_dim(self) -> int:
        return self.v.shape[-1]

    def tile(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        return self.k[..., start:stop, :], self.v[..., start:stop, :]  # (B, H, bn, D), (.., Dv)


@dataclass(frozen=True)
class PagedKeys:
    """One item's keys and values in page pools (pages, page_size, Hkv, D): key j lies in slot
    j % page_size of page pages[j // page_size]. A tile reads the pages its keys fall in and no
    other, as a paged kernel loads a tile through the block table."""

    k_pool: np.ndarray
    v_pool: np.ndarray
    pages: np.ndarray  # (max_pages,) the item's row of the block table
    kv_head: np.ndarray  # (H,) the key/value head each query head reads
    length: int  # L_b: the item's keys

    @property
    def value_dim(self) -> int:
        return self.v_pool.shape[-1]

    def tile(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        positions = np.arange(start, stop)  # (bn,)
        page_size = self.k_pool.shape[1]
        pages, slots = self.pages[positions // page_size], positions % page_size
        # pool[pages, slots]: (bn, Hkv, D) -> the query heads' (bn, H, D) -> (1, H, bn, D)
        k_tile, v_tile = (
            pool[pages, slots][:, self.kv_head].transpose(1, 0, 2)[None]
            for pool in (self.k_pool, self.v_pool)
        )
        return k_tile, v_tile


def tiled_attention(q, k, v, **options):
    """Attention of (B, H, Tq, D), (B, Hkv, Tk, D), (B, Hkv, Tk, Dv) arrays by the kernel's
    tiling; returns out (B, H, Tq, Dv), and lse (B, H, Tq) when ``with_lse``: the log-sum-exp of
    each row's scores, the sink's logit not included. ``options``: those of
    :func:`attention_over_tiles`."""
    kv_head = key_value_heads(q.shape[-3], k.shape[-3])
    keys = DenseKeys(k[:, kv_head], v[:, kv_head])  # (B, Hkv, T, D) -> (B, H, T, D)
    return attention_over_tiles(q, keys, **options)


def key_value_heads(heads: int, kv_heads: int) -> np.ndarray:
    """(H,) the key/value head each query head reads: h // (H / Hkv)."""
    return np.arange(heads) // (heads // kv_heads)


def attention_over_tiles(
    q,
    keys: DenseKeys | PagedKeys,
    *,
    causal: bool,
    scale: float,
    with_lse: bool = False,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    alibi_slopes=None,
    sinks=None,
    rounded_weights=None,
    **masks,
):
    """:func:`tiled_attention` over the keys of a :class:`DenseKeys` or :class:`PagedKeys`.
    ``scale`` may be an array that broadcasts against the scores, (B, H, 1, 1): an FP8 call's
    scales per head join it; ``rounded_weights``, where set, rounds each tile's weights before
    their product with V (an FP8 kernel's P), their sum taken before it."""
    dtype = q.dtype
    scale = np.asarray(scale, dtype)
    tq, tk = q.shape[-2], keys.length
    offset = tk - tq
    out = np.empty((*q.shape[:-1], keys.value_dim), dtype=dtype)  # (B, H, Tq, Dv)
    lse = np.empty(q.shape[:-1], dtype=dtype)  # (B, H, Tq)
    cap = None if softcap is None else dtype.type(softcap)
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype)[:, None, None]
    sink = None if sinks is None else np.asarray(sinks, dtype)[:, None]  # (H, 1)
    mask = MaskOfTiles(tq, tk, causal=causal, heads=q.shape[1], window=window, chunk=chunk,
                       **masks)  # fmt: skip
    for block_start in range(0, tq, BLOCK_M):
        block_stop = min(block_start + BLOCK_M, tq)
        rows = np.arange(block_start, block_stop)[:, None]  # (bm, 1)
        q_block = q[..., block_start:block_stop, :]  # (B, H, bm, D)
        running_max = np.full(q_block.shape[:-1], -np.inf, dtype=dtype)  # (B, H, bm)
        running_sum = np.zeros(q_block.shape[:-1], dtype=dtype)  # (B, H, bm)
        acc = np.zeros((*q_block.shape[:-1], keys.value_dim), dtype=dtype)  # (B, H, bm, Dv)
        tiles = mask.tiles_seen(block_start, block_stop)
        for start, stop in tiles:
            k_tile, v_tile = keys.tile(start, stop)  # (B, H, bn, D), (B, H, bn, Dv)
            scores = q_block @ k_tile.swapaxes(-1, -2)  # (B, H, bm, bn)
            scores *= scale
            columns = np.arange(start, stop)[None, :]  # (1, bn): the tile's key positions
            if cap is not None:
                scores = cap * np.tanh(scores / cap)
            if slopes is not None:
                scores -= slopes * np.abs(rows + offset - columns).astype(dtype)  # (H, bm, bn)
            # Overwritten, not added to: a NaN or inf hidden score must not survive.
            np.copyto(scores, -np.inf, where=~mask.seen(block_start, block_stop, start, stop))
            new_max = np.maximum(running_max, scores.max(axis=-1))  # (B, H, bm)
            shift = np.where(new_max == -np.inf, dtype.type(0), new_max)
            correction = np.exp(running_max - shift)  # (B, H, bm); exp(-inf) = 0 on first tile
            probs = np.exp(scores - shift[..., None])  # (B, H, bm, bn)
            running_sum = running_sum * correction + probs.sum(axis=-1)
            if rounded_weights is not None:
                probs = rounded_weights(probs)
            acc = acc * correction[..., None] + probs @ v_tile
            running_max = new_max
        lse[..., block_start:block_stop] = running_max + np.log(running_sum)
        if sink is not None:
            # The sink joins the denominator alone: one more term of the online softmax.
            new_max = np.maximum(running_max, sink)  # (B, H, bm)
            correction = np.exp(running_max - new_max)
            running_sum = running_sum * correction + np.exp(sink - new_max)
            acc = acc * correction[..., None]
        out[..., block_start:block_stop, :] = acc / running_sum[..., None]
    return (out, lse) if with_lse else out


def tiled_backward(q, k, v, grad_out, *, causal, scale, grad_lse=None, window=None, chunk=None,
                   softcap=None, alibi_slopes=None, sinks=None, **masks):  # fmt: skip
    """FlashAttention 2's backward in the forward's tiling: (dq, dk, dv, dsinks or None) of
    (B, H, Tq, D), (B, Hkv, Tk, D), (B, Hkv, Tk, Dv) arrays, dsinks (H,).

    The forward runs again for out and lse (a training kernel saved them). Then each key tile,
    in the outer loop, is visited by the query blocks whose forward read it (:func:`key_tiles`);
    each recomputes its weights from the lse, P = exp(x - lse), the sink's logit joined to the
    lse so that P is the forward's, and accumulates
      dV_tile += P^T dO;  dP = dO V_tile^T;  dS = P (dP - rowsum(dO * O)) (+ dLSE exp(x - lse));
      dS *= dtanh under a softcap;  dQ_block += scale dS K_tile;  dK_tile += scale dS^T Q_block.
    A row that saw no key has lse = -inf: its P is 0, not exp(-inf - (-inf)). The order of every
    sum is fixed: repeated calls are bit-identical."""
    dtype = q.dtype
    heads, kv_heads = q.shape[-3], k.shape[-3]
    kv_head = key_value_heads(heads, kv_heads)
    keys, values = k[:, kv_head], v[:, kv_head]  # (B, Hkv, T, D) -> (B, H, T, D)
    modifiers = dict(window=window, chunk=chunk, softcap=softcap, alibi_slopes=alibi_slopes,
                     **masks)  # fmt: skip
    out, lse = attention_over_tiles(q, DenseKeys(keys, values), causal=causal, scale=scale,
                                    with_lse=True, sinks=sinks, **modifiers)  # fmt: skip
    lse_with_sink = lse if sinks is None else np.logaddexp(lse, np.asarray(sinks, dtype)[:, None])
    seen = np.isfinite(lse_with_sink)  # (B, H, Tq)
    out = np.where(seen[..., None], out, 0)  # a row that sees no key: 0 / 0 left there
    shift = np.where(seen, lse_with_sink, dtype.type(0))[..., None]  # (B, H, Tq, 1)
    share = np.where(seen, lse - lse_with_sink, -np.inf)[..., None]  # log of 1 - p_sink
    row_dot = (grad_out * out).sum(axis=-1, keepdims=True)  # rowsum(dO * O), (B, H, Tq, 1)
    scale = dtype.type(scale)
    tq, tk = q.shape[-2], keys.shape[-2]
    offset = tk - tq
    blocks = [(start, min(start + BLOCK_M, tq)) for start in range(0, tq, BLOCK_M)]
    mask = MaskOfTiles(tq, tk, causal=causal, heads=heads, window=window, chunk=chunk, **masks)
    visits = {block: mask.tiles_seen(*block) for block in blocks}
    grad_q = np.zeros_like(q)
    grad_keys, grad_values = np.zeros_like(keys), np.zeros_like(values)
    for tile in sorted({tile for tiles in visits.values() for tile in tiles}):
        start, stop = tile
        k_tile, v_tile = keys[..., start:stop, :], values[..., start:stop, :]  # (B, H, bn, D)
        columns = np.arange(start, stop)[None, :]  # (1, bn)
        for block_start, block_stop in (block for block in blocks if tile in visits[block]):
            rows = slice(block_start, block_stop)
            q_block, dout = q[..., rows, :], grad_out[..., rows, :]  # (B, H, bm, D), (.., Dv)
            raw = q_block @ k_tile.swapaxes(-1, -2) * scale  # (B, H, bm, bn)
            scores = raw if softcap is None else dtype.type(softcap) * np.tanh(raw / softcap)
            scores = tile_masked(
                scores, np.arange(block_start, block_stop)[:, None] + offset, columns,
                mask.seen(block_start, block_stop, start, stop), alibi_slopes=alibi_slopes,
            )  # fmt: skip
            with np.errstate(invalid="ignore"):
                probs = np.where(seen[..., rows, None], np.exp(scores - shift[..., rows, :]), 0)
            grad_values[..., start:stop, :] += probs.swapaxes(-1, -2) @ dout
            grad_probs = dout @ v_tile.swapaxes(-1, -2)  # (B, H, bm, bn)
            grad_scores = probs * (grad_probs - row_dot[..., rows, :])
            if grad_lse is not None:  # exp(x - lse) = P / (1 - p_sink)
                own = probs * np.exp(-share[..., rows, :]) if sinks is not None else probs
                grad_scores += grad_lse[..., rows, None] * np.where(probs > 0, own, 0)
            if softcap is not None:
                grad_scores *= 1 - (scores_capped(raw, softcap) / dtype.type(softcap)) ** 2
            grad_q[..., rows, :] += scale * grad_scores @ k_tile
            grad_keys[..., start:stop, :] += scale * grad_scores.swapaxes(-1, -2) @ q_block
    group = heads // kv_heads
    # (B, H, Tk, D) -> (B, Hkv, g, Tk, D), summed over each group's g query heads
    grad_k, grad_v = (x.reshape(x.shape[0], kv_heads, group, *x.shape[2:]).sum(axis=2)
                      for x in (grad_keys, grad_values))  # fmt: skip
    grad_sinks = None
    if sinks is not None:  # d(sink_h) = -sum of p_sink rowsum(dO * O) over head h's rows
        sink_share = np.where(seen, np.exp(np.asarray(sinks, dtype)[:, None] - shift[..., 0]), 0)
        grad_sinks = -(sink_share * row_dot[..., 0]).sum(axis=(0, 2))
    return grad_q, grad_k, grad_v, grad_sinks


def scores_capped(raw, softcap):
    return softcap * np.tanh(raw / softcap)


def tile_masked(scores, positions, columns, seen, *, alibi_slopes):
    """A tile's (B, H, bm, bn) capped scores with ALiBi's bias added and -inf where the forward
    hid a key (``seen`` False): ``positions`` (bm, 1) the rows' absolute positions, ``columns``
    (1, bn) the keys'."""
    dtype = scores.dtype
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype)[:, None, None]  # (H, 1, 1)
        scores = scores - slopes * np.abs(positions - columns).astype(dtype)
    return np.where(seen, scores, -np.inf)


class NumpyFlash(NumpyArrays, Implementation):
    name = "numpy_flash"
    capabilities = Capabilities(
        dtypes=("float64", "float32"),
        autograd=True,  # FlashAttention 2's backward, in the same tiling (tiled_backward)
        conventions=RAISES_ON_ALL,
        **EVERY_EXTENSION,
        # FP8 as FlashAttention 3 computes it (impls.numpy_fp8.flash3_attention)
        fp8=True,
        fp8_formats=("float8_e4m3fn", "float8_e5m2"),
        fp8_p="e4m3_offset8",
        fp8_output="bfloat16",
        fp8_query_dtypes=FP8_QUERY_DTYPES,
        # block-scaled as MXFP8 kernels compute it: P * 2^8 in e4m3 (impls.numpy_block_scaled)
        block_scaled=True,
        block_p="e4m3_offset8",
        block_output="bfloat16",
    )

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, **variant):
        """:func:`tiled_backward` on each item (its keys cut at its length) or packed sequence,
        as the forward's grid runs them; an item or sequence with no key gets gradient 0."""
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant)
        self.check_float_dtype(q)
        scale = resolve_scale(scale, q.shape[-1])
        key_lengths = variant.pop("key_lengths", None)
        bounds_q = variant.pop("cu_seqlens_q", None)
        bounds_k = variant.pop("cu_seqlens_k", None)
        grad_q, grad_k, grad_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        grad_sinks = None if variant.get("sinks") is None else np.zeros(q.shape[-3], q.dtype)
        if bounds_q is not None:  # (item, query rows, keys) of each sequence of a batch of one
            pieces = [(0, slice(q0, q1), slice(k0, k1)) for (q0, q1), (k0, k1)
                      in zip(itertools.pairwise(bounds_q), itertools.pairwise(bounds_k),
                             strict=True)]  # fmt: skip
        else:
            lengths = key_lengths or (k.shape[-2],) * q.shape[0]
            pieces = [(b, slice(None), slice(0, int(n))) for b, n in enumerate(lengths)]
        for b, rows, keys in pieces:
            item = slice(b, b + 1)
            if keys.stop == keys.start:  # no key: no gradient
                continue
            grads = tiled_backward(
                q[item, :, rows], k[item, :, keys], v[item, :, keys],
                grad_out[item, :, rows], causal=causal, scale=scale,
                grad_lse=None if grad_lse is None else grad_lse[item, :, rows],
                **cut_to_item(variant, b, rows, keys),
            )  # fmt: skip
            grad_q[item, :, rows] = grads[0]
            grad_k[item, :, keys] = grads[1]
            grad_v[item, :, keys] = grads[2]
            if grad_sinks is not None:
                grad_sinks += grads[3]
        return (grad_q, grad_k, grad_v) + (() if grad_sinks is None else (grad_sinks,))

    def p_rounded_tiles(self, q, k, v, *, causal, scale, return_lse=False, block_table=None,
                        key_lengths=None, page_size=None):  # fmt: skip
        """The tiles with each tile's P rounded as block_p declares, before its product with V;
        k and v page pools where a block table is given."""
        rounded = {"rounded_weights": lambda weights: round_p(weights, self.capabilities.block_p)}
        if block_table is not None:
            return self.paged_attention(q, k, v, block_table, causal=causal, scale=scale,
                                        window=None, return_lse=return_lse,
                                        key_lengths=key_lengths, **rounded)  # fmt: skip
        return tiled_attention(q, k, v, causal=causal, scale=resolve_scale(scale, q.shape[-1]),
                               with_lse=return_lse, **rounded)  # fmt: skip

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, return_lse=False, **variant
    ):
        extras = {"window": window, "return_lse": return_lse or None}
        extras = {name: value for name, value in extras.items() if value is not None}
        if is_block_scaled_call(variant):
            return block_scaled_attention(
                self.p_rounded_tiles,
                self.capabilities,
                q,
                k,
                v,
                causal=causal,
                scale=scale,
                **extras,
                **variant,
            )
        if is_fp8_call(q, k, v, variant):
            return flash3_attention(
                q, k, v, capabilities=self.capabilities, causal=causal, scale=scale,
                tiled_attention=tiled_attention, paged_attention=self.paged_attention,
                **extras, **variant,
            )  # fmt: skip
        block_table = variant.pop("block_table", None)
        page_size = variant.pop("page_size", None)
        validate_inputs(
            q,
            k,
            v,
            causal=causal,
            scale=scale,
            gqa=True,
            window=window,
            block_table=block_table,
            page_size=page_size,
            **variant,
        )
        if block_table is not None:
            return self.paged_attention(
                q, k, v, block_table, causal=causal, scale=scale, window=window,
                return_lse=return_lse, **variant,
            )  # fmt: skip
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, window=window, return_lse=return_lse, **variant
        )
        if split is not None:
            return split
        out, lse = self.attention_and_lse(
            q, k, v, causal=causal, scale=scale, window=window, **variant
        )
        return (out, lse) if return_lse else out

    def paged_attention(
        self, q, k_pool, v_pool, block_table, *, causal, scale, window, return_lse,
        key_lengths, query_lengths=None, **modifiers,
    ):  # fmt: skip
        """Each item over its pages, tile by tile (:class:`PagedKeys`), as a paged kernel's grid
        runs: item b's L_b keys, its first Lq_b query rows (the rest zeros), an item with no key
        left as ``capabilities.empty_rows`` declares."""
        self.check_float_dtype(q)
        batch, heads, tq, _ = q.shape
        kv_head = key_value_heads(heads, k_pool.shape[-2])
        out = np.zeros((batch, heads, tq, v_pool.shape[-1]), dtype=q.dtype)  # (B, H, Tq, Dv)
        lse = np.full((batch, heads, tq), -np.inf, dtype=q.dtype)  # (B, H, Tq)
        table = np.asarray(block_table)
        # a float, or an FP8 call's (B, H, 1, 1) scales per head, which each item takes its row of
        scale = resolve_scale(scale, q.shape[-1]) if np.ndim(scale) == 0 else scale
        for b, length in enumerate(int(n) for n in key_lengths):
            rows = tq if query_lengths is None else int(query_lengths[b])
            if length == 0:
                continue
            keys = PagedKeys(k_pool, v_pool, table[b], kv_head, length)
            out[b : b + 1, :, :rows], lse[b : b + 1, :, :rows] = attention_over_tiles(
                q[b : b + 1, :, :rows],
                keys,
                causal=causal,
                scale=scale if np.ndim(scale) == 0 else scale[b : b + 1],
                with_lse=True,
                window=window,
                **modifiers,
            )
        # the items with no key (a mask is refused with pages: impls.validation)
        tk = table.shape[1] * k_pool.shape[1]
        out, lse = self.with_blind_rows(out, lse, causal=False, tk=tk, key_lengths=key_lengths)
        return (out, lse) if return_lse else out

    def merge_states(self, outputs, lses):
        """The merge a split-KV kernel runs after its parts (FlashAttention's combine), in the
        states' dtype: the largest lse subtracted first, parts that saw no key (-inf) skipped."""
        dtype = outputs.dtype
        with np.errstate(divide="ignore"):
            out, lse = merge_states(outputs, lses, work_dtype=dtype.name)
        return out.astype(dtype), lse.astype(dtype)

    def attention_and_lse(
        self, q, k, v, *, causal=True, scale=None, window=None, key_lengths=None, **modifiers
    ):
        """(out, lse): the output and each row's log-sum-exp of its scaled, masked scores."""
        validate_inputs(
            q,
            k,
            v,
            causal=causal,
            scale=scale,
            gqa=True,
            window=window,
            key_lengths=key_lengths,
            **modifiers,
        )
        self.check_float_dtype(q)
        scale = resolve_scale(scale, q.shape[-1])
        if key_lengths is None:
            with np.errstate(invalid="ignore", divide="ignore"):  # a row that sees no key: 0 / 0
                out, lse = tiled_attention(
                    q, k, v, causal=causal, scale=scale, with_lse=True, window=window, **modifiers
                )
            return self.with_blind_rows(out, lse, causal=causal, tk=k.shape[-2], window=window,
                                        **modifiers)  # fmt: skip
        # One item at a time, as the kernel's grid does: item b's keys end at its length.
        with np.errstate(invalid="ignore", divide="ignore"):  # an item with no key: 0 / 0
            items = [
                tiled_attention(
                    q[b : b + 1],
                    k[b : b + 1, :, :length],
                    v[b : b + 1, :, :length],
                    causal=causal,
                    scale=scale,
                    with_lse=True,
                    window=window,
                    **cut_to_item(modifiers, b, slice(None), slice(0, length)),
                )
                for b, length in enumerate(key_lengths)
            ]
        out, lse = (np.concatenate(parts) for parts in zip(*items, strict=True))
        return self.with_blind_rows(out, lse, causal=causal, tk=k.shape[-2], window=window,
                                    key_lengths=key_lengths, **modifiers)  # fmt: skip
