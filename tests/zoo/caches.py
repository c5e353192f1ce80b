"""Zoo members for paged key/value caches: the bugs reported in paged kernels (a page table read
one entry late, a last page read past its item's length, pages no item owns read) and two correct
roads, gathering the pages first and streaming them page by page.

Each member takes ``block_table``, ``key_lengths`` and ``page_size``, as a plain callable declaring
the paged feature does; without a block table it is the formula with key lengths.
"""

from __future__ import annotations

import numpy as np

from spec.formula import gathered_pages
from tests.zoo import correct_variant, mutant
from tests.zoo.formula import attend_extended, scores_of
from tests.zoo.streaming import streaming_attention


def attend_pages(q, k, v, *, causal, scale, block_table, key_lengths, gather=gathered_pages):
    """The formula on the keys ``gather(pool, table, lengths)`` makes of the pools (the
    spec's gathering by default): the dense (B, Hkv, T, D) keys and values, masked by the
    lengths."""
    if block_table is None:
        with np.errstate(invalid="ignore"):  # an item with no key: 0 / 0
            return attend_extended(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)
    dense_k, dense_v = (gather(x, block_table, key_lengths) for x in (k, v))
    return attend_extended(q, dense_k, dense_v, causal=causal, scale=scale, key_lengths=key_lengths)


@mutant("paged caches", "PAGED-KV", mistake="page-table-one-page-late")
def page_table_read_one_page_late(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None
):
    """Reads page p of an item from its table's entry p + 1 (an index that skips the first
    entry, or a table whose first column was taken for a length): every item's keys shifted by
    a page, its last page whatever the spare entry points at."""

    def late(pool, table, lengths):
        table = np.asarray(table)
        shifted = np.concatenate([table[:, 1:], table[:, -1:]], axis=1)
        return gathered_pages(pool, shifted, lengths)

    return attend_pages(
        q, k, v, causal=causal, scale=scale, block_table=block_table, key_lengths=key_lengths,
        gather=late,
    )  # fmt: skip


@mutant("paged caches", "PAGED-UNREAD", mistake="last-page-read-past-length")
def last_page_read_past_length(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None
):
    """Attends every slot of an item's last page, as if its length were a whole number of pages
    (kv_last_page_len ignored): the tail's stale keys join the row, +inf ones as NaN."""
    if block_table is None:
        return attend_extended(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)
    size = k.shape[1]
    whole = [-(-int(n) // size) * size for n in key_lengths]  # rounded up to whole pages
    return attend_pages(
        q, k, v, causal=causal, scale=scale, block_table=block_table, key_lengths=whole
    )


@mutant("paged caches", "PAGED-UNREAD", mistake="pool-in-row-max")
def pool_in_row_max(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None
):
    """Takes each row's softmax maximum over every key of the pool, pages no item owns included
    (a kernel that reduces over the pool it was handed): a NaN page makes the row NaN."""
    if block_table is None:
        return attend_extended(q, k, v, causal=causal, scale=scale, key_lengths=key_lengths)
    out = attend_pages(
        q, k, v, causal=causal, scale=scale, block_table=block_table, key_lengths=key_lengths
    )
    pool = k.reshape(1, -1, *k.shape[2:]).transpose(0, 2, 1, 3)  # (1, Hkv, pages * size, D)
    heads = q.shape[1] // pool.shape[1]
    pool_max = scores_of(q, np.repeat(pool, heads, axis=1), scale).max(axis=-1, keepdims=True)
    return (out + 0 * pool_max).astype(q.dtype)  # the maximum's NaN reaches the row


@mutant("paged caches", "PAGED-KV", mistake="last-page-dropped-on-boundary")
def last_page_dropped_on_a_page_boundary(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None
):
    """Counts an item's keys as its pages before the last, full, plus L % page_size in the last
    (kv_last_page_len taken modulo the page size): an item whose length ends on a page boundary
    loses its whole last page, right at every other length (regime keys.page)."""
    if block_table is None:
        return attend_pages(
            q, k, v, causal=causal, scale=scale, block_table=None, key_lengths=key_lengths
        )
    size = k.shape[1]
    counted = [int(n) - size if n and n % size == 0 else int(n) for n in key_lengths]
    with np.errstate(invalid="ignore"):  # an item of one page counted as none: 0 / 0
        return attend_pages(
            q, k, v, causal=causal, scale=scale, block_table=block_table, key_lengths=counted
        )


@mutant("paged caches", "PAGED-KV", mistake="paged-group-rounded-down")
def paged_groups_rounded_to_a_power_of_two(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None,
    enable_gqa=False,
):  # fmt: skip
    """Right on its dense path; on its paged path, maps query head h to key/value head h // g'
    with g' the group size rounded down to a power of two, as a tensor-core decode kernel whose
    head packing assumes one (FlashInfer #2896, 28 query heads over 4): right for groups of 1, 2,
    4 and 8, so that a paged test with such groups alone passes it."""
    if block_table is None:
        return attend_pages(
            q, k, v, causal=causal, scale=scale, block_table=None, key_lengths=key_lengths
        )
    dense_k, dense_v = (gathered_pages(x, block_table, key_lengths) for x in (k, v))
    return attend_extended(
        q, dense_k, dense_v, causal=causal, scale=scale, key_lengths=key_lengths,
        kv_head_of=group_rounded_down,
    )  # fmt: skip


def group_rounded_down(heads: int, kv_heads: int) -> np.ndarray:
    """h // g' with g' the group size rounded down to a power of two, within the heads."""
    group = heads // kv_heads
    rounded = 1 << (group.bit_length() - 1)
    return np.minimum(np.arange(heads) // rounded, kv_heads - 1)


@correct_variant
def pages_gathered_first(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None,
    enable_gqa=False,
):  # fmt: skip
    """Gathers each item's pages into a dense cache cut at its length, then attends: what a
    serving engine does before calling a dense kernel. Any group of query heads over a key/value
    head, 3 and 7 among them."""
    return attend_pages(
        q, k, v, causal=causal, scale=scale, block_table=block_table, key_lengths=key_lengths
    )


@correct_variant
def pages_streamed_one_by_one(
    q, k, v, *, causal=True, scale=None, block_table=None, key_lengths=None, page_size=None
):
    """Streams each item's keys through an online softmax in tiles of one page, reading only the
    slots the item owns, as paged kernels do; float64 accumulators."""
    if block_table is None:
        return attend_pages(
            q, k, v, causal=causal, scale=scale, block_table=None, key_lengths=key_lengths
        )
    dense_k, dense_v = (gathered_pages(x, block_table, key_lengths) for x in (k, v))
    items = [
        streaming_attention(
            q[b : b + 1],
            dense_k[b : b + 1, :, :n],
            dense_v[b : b + 1, :, :n],
            causal=causal,
            scale=scale,
            block_k=k.shape[1],
            accumulate_in=np.float64,
        )
        for b, n in enumerate(key_lengths)
    ]
    return np.concatenate(items).astype(q.dtype)


# An item with no key: these compute it as the formula does, 0 / 0 (EMPTY-KV), and say so.
pages_gathered_first.empty_rows = "nan"
pages_streamed_one_by_one.empty_rows = "nan"
paged_groups_rounded_to_a_power_of_two.empty_rows = "nan"
