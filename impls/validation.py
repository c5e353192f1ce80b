"""The inputs no attention implementation can give a meaningful answer for, refused in words.

Shared by the built-ins, so that every one of them rejects the same inputs with the same words:
an implementation that follows the contract's "raise" conventions (impls.capabilities.RAISES_ON_ALL)
calls :func:`validate_inputs` first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spec.masks import MASK_KEYWORDS, Dims, host_values
from spec.masks import problems as mask_problems


class AttentionInputError(ValueError):
    """Inputs that no attention implementation can give a meaningful answer for."""


def validate_inputs(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float | None,
    gqa: bool = False,
    window: int | None = None,
    key_lengths=None,
    query_lengths=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    chunk: int | None = None,
    softcap: float | None = None,
    alibi_slopes=None,
    sinks=None,
    block_table=None,
    page_size: int | None = None,
    **masks,
) -> None:
    """Raise :class:`AttentionInputError` naming the problem when (q, k, v, scale) are invalid.

    Works on any array with ``.ndim``, ``.shape`` and ``.dtype``; shared by the built-ins so every
    one of them rejects the same inputs with the same words. ``gqa`` accepts k and v with fewer
    heads than q (a divisor of q's); ``window``, ``key_lengths`` and the packed sequences'
    offsets are checked where given.
    """
    if block_table is not None or page_size is not None:
        k, v = validate_paged(q, k, v, block_table, page_size, key_lengths)
    for label, array in (("q", q), ("k", k), ("v", v)):
        if array.ndim != 4:
            raise AttentionInputError(
                f"{label}.ndim={array.ndim} (shape {tuple(array.shape)}), "
                "but should be 4: (B, H, T, D)"
            )
    (bq, hq, tq, dq), (bk, hk, tk, dk), (bv, hv, tv, _) = q.shape, k.shape, v.shape
    grouped = gqa and hk == hv and hk > 0 and hq % hk == 0
    if not (bq == bk == bv and (hq == hk == hv or grouped)):
        raise AttentionInputError(
            f"batch and head dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}; "
            + ("B must match, and k's and v's heads divide q's" if gqa else "B and H must match")
        )
    if dq != dk:
        raise AttentionInputError(f"q has D={dq} but k has D={dk}: query and key dims must match")
    if tk != tv:
        raise AttentionInputError(f"k has Tk={tk} but v has Tk={tv}: keys and values must pair up")
    if 0 in tuple(q.shape) + tuple(k.shape) + tuple(v.shape):
        raise AttentionInputError(
            f"empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)} or v {tuple(v.shape)}: "
            "every dim must be at least 1"
        )
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed:
        validate_packed(cu_seqlens_q, cu_seqlens_k, batch=bq, tq=tq, tk=tk, causal=causal)
        if key_lengths is not None or query_lengths is not None:
            raise AttentionInputError(
                "key_lengths or query_lengths with packed sequences: give one form or the other"
            )
    if causal and tq > tk and not packed:
        raise AttentionInputError(
            f"causal attention with Tq={tq} > Tk={tk}: bottom-right alignment leaves the first "
            f"{tq - tk} query rows with no key to attend to"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionInputError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
            raise AttentionInputError(f"scale={scale!r}, but should be a real number or None")
        if not math.isfinite(float(scale)):
            raise AttentionInputError(f"scale={scale!r}, but should be finite")
    if key_lengths is not None or query_lengths is not None:
        validate_lengths(key_lengths, query_lengths, batch=bq, tq=tq, tk=tk, causal=causal)
    unknown = sorted(set(masks) - set(MASK_KEYWORDS))
    if unknown:
        raise TypeError(f"validate_inputs() got unexpected keyword(s) {', '.join(unknown)}")
    mask = dict(causal=causal, window=window, chunk=chunk, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k, query_lengths=query_lengths, block_table=block_table,
                **masks)  # fmt: skip
    for problem in mask_problems(mask, Dims(bq, hq, hk, tq, tk)):
        raise AttentionInputError(problem)
    if softcap is not None:
        validate_softcap(softcap)
    for label, per_head, allowed in (
        ("alibi_slopes", alibi_slopes, "finite"),
        ("sinks", sinks, "finite or -inf"),
    ):
        if per_head is not None:
            validate_per_head(label, per_head, heads=hq, allowed=allowed)


def validate_packed(cu_seqlens_q, cu_seqlens_k, *, batch: int, tq: int, tk: int, causal: bool):
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise AttentionInputError(
            "packed sequences need both cu_seqlens_q and cu_seqlens_k, "
            f"not cu_seqlens_q={cu_seqlens_q!r} and cu_seqlens_k={cu_seqlens_k!r}"
        )
    if batch != 1:
        raise AttentionInputError(f"packed sequences with B={batch}, but should be a batch of one")
    offsets = {}
    for label, cu, total in (
        ("cu_seqlens_q", cu_seqlens_q, tq),
        ("cu_seqlens_k", cu_seqlens_k, tk),
    ):
        cu = host_values(cu)
        if cu.ndim != 1 or len(cu) < 2 or not np.issubdtype(cu.dtype, np.integer):
            raise AttentionInputError(f"{label}={cu.tolist()!r}, but should be at least 2 integers")
        least = 0 if label == "cu_seqlens_k" else 1  # a sequence may have no key (EMPTY-KV)
        if cu[0] != 0 or cu[-1] != total or np.any(np.diff(cu) < least):
            raise AttentionInputError(
                f"{label}={cu.tolist()}, but should rise from 0 to {total}, "
                f"by at least {least} per sequence"
            )
        offsets[label] = cu
    lengths_q, lengths_k = (np.diff(offsets[label]) for label in ("cu_seqlens_q", "cu_seqlens_k"))
    if len(lengths_q) != len(lengths_k):
        raise AttentionInputError(
            f"cu_seqlens_q has {len(lengths_q)} sequences but cu_seqlens_k {len(lengths_k)}"
        )
    short = (lengths_q > lengths_k) & (lengths_k > 0)  # no key at all is an empty sequence
    if causal and np.any(short):
        s = int(np.argmax(short))
        raise AttentionInputError(
            f"packed sequence {s} has {lengths_q[s]} queries but {lengths_k[s]} keys: causal "
            "bottom-right alignment leaves its first queries with no key"
        )


def validate_lengths(key_lengths, query_lengths, *, batch: int, tq: int, tk: int, causal: bool):
    """Per-item key and query lengths: one integer per batch item, 1 <= Lq_b <= Tq, 1 <= L_b <= Tk,
    and causal rows that all see a key (L_b >= Lq_b, Lq_b = Tq without query lengths)."""
    given = {}
    for label, lengths, total in (
        ("key_lengths", key_lengths, tk),
        ("query_lengths", query_lengths, tq),
    ):
        if lengths is None:
            given[label] = np.full(batch, total)
            continue
        array = host_values(lengths)
        if array.shape != (batch,) or not np.issubdtype(array.dtype, np.integer):
            raise AttentionInputError(
                f"{label}={lengths!r}, but should be {batch} integers, one per batch item"
            )
        least = 0 if label == "key_lengths" else 1  # an item may have no key (EMPTY-KV)
        if array.min() < least or array.max() > total:
            raise AttentionInputError(
                f"{label}={array.tolist()}, but each should be between {least} and {total}"
            )
        given[label] = array
    keys, queries = given["key_lengths"], given["query_lengths"]
    short = (keys < queries) & (keys > 0)  # no key at all is an empty item
    if causal and np.any(short):
        b = int(np.argmax(short))
        raise AttentionInputError(
            f"batch item {b} has {queries[b]} queries but {keys[b]} keys: causal bottom-right "
            "alignment leaves its first queries with no key"
        )


def validate_softcap(softcap) -> None:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.floating, np.integer)):
        raise AttentionInputError(f"softcap={softcap!r}, but should be a positive number or None")
    if not (math.isfinite(float(softcap)) and softcap > 0):
        raise AttentionInputError(f"softcap={softcap!r}, but should be finite and > 0")


def validate_per_head(label: str, values, *, heads: int, allowed: str) -> None:
    """One real number per query head: finite, or for sinks also -inf (no sink)."""
    try:
        array = host_values(values).astype(np.float64)
    except (TypeError, ValueError):
        raise AttentionInputError(f"{label}={values!r}, but should be {heads} numbers") from None
    if array.shape != (heads,):
        raise AttentionInputError(
            f"{label} has shape {array.shape}, but should be ({heads},): one per query head"
        )
    bad = np.isnan(array) | (array == np.inf)
    if allowed == "finite":
        bad |= np.isinf(array)
    if bad.any():
        raise AttentionInputError(f"{label}={array.tolist()}, but each should be {allowed}")


@dataclass(frozen=True)
class DenseShape:
    """The dense (B, Hkv, T, D) shape a page pool stands for, for the checks that follow."""

    shape: tuple[int, ...]
    dtype: object

    @property
    def ndim(self) -> int:
        return len(self.shape)


def validate_paged(q, k, v, block_table, page_size, key_lengths) -> tuple[DenseShape, DenseShape]:
    """Page pools k and v of (pages, page_size, Hkv, D), a block table of page indices per item
    and its key lengths; returns the dense shapes they stand for."""
    if block_table is None or key_lengths is None:
        raise AttentionInputError(
            "a paged cache needs block_table and key_lengths, "
            f"not block_table={'given' if block_table is not None else None} and "
            f"key_lengths={key_lengths!r}"
        )
    for label, pool in (("k", k), ("v", v)):
        if pool.ndim != 4:
            raise AttentionInputError(
                f"{label}.ndim={pool.ndim} (shape {tuple(pool.shape)}), but a page pool should "
                "be 4: (pages, page_size, Hkv, D)"
            )
    if tuple(k.shape[:3]) != tuple(v.shape[:3]):
        raise AttentionInputError(
            f"k's pool {tuple(k.shape)} and v's {tuple(v.shape)} differ in pages, page size or "
            "heads"
        )
    pages, size = k.shape[:2]
    if page_size is not None and size != page_size:
        raise AttentionInputError(f"page_size={page_size}, but the pools' pages hold {size} keys")
    table = host_values(block_table)
    if (
        table.ndim != 2
        or table.shape[0] != q.shape[0]
        or not np.issubdtype(table.dtype, np.integer)
    ):
        raise AttentionInputError(
            f"block_table of shape {table.shape} and dtype {table.dtype}, but should be integers "
            f"of shape ({q.shape[0]}, max_pages): a row of page indices per batch item"
        )
    if table.size and (table.min() < 0 or table.max() >= pages):
        raise AttentionInputError(
            f"block_table holds pages {table.min()}..{table.max()}, but the pool has {pages}"
        )
    lengths = host_values(key_lengths)
    capacity = table.shape[1] * size
    if lengths.size and lengths.max() > capacity:
        raise AttentionInputError(
            f"key_lengths={lengths.tolist()} goes past the block table's capacity of "
            f"{capacity} keys ({table.shape[1]} pages of {size})"
        )
    tk = max(int(lengths.max()) if lengths.size else 0, 1)
    return (
        DenseShape((q.shape[0], k.shape[2], tk, k.shape[3]), k.dtype),
        DenseShape((q.shape[0], v.shape[2], tk, v.shape[3]), v.dtype),
    )
