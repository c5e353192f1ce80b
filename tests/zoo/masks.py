"""Zoo members for custom masks (attn_mask) and index-sparse attention (kv_indices): the bugs
reported in kernels that take them, and correct roads that are not the formula's own.

Each member declares what it takes by naming its keywords, as any plain callable does, and
follows :func:`tests.zoo.formula.attend_extended` with the spec's mask (spec.masks) except in the
one step its docstring names. Rows that see no key give zeros, as declared by default.
"""

from __future__ import annotations

import numpy as np

from spec.masks import as_four_dims, visible_keys
from tests.zoo import correct_variant, mutant
from tests.zoo.formula import attend_extended, scores_of, softmax


def attend_masked(q, k, v, *, causal, scale, attn_mask, **mask) -> np.ndarray:
    """The formula under ``attn_mask`` and the call's other mask keywords, blind rows zeros."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = visible_keys(tq, tk, causal=causal, attn_mask=attn_mask, **mask)
    with np.errstate(invalid="ignore"):
        out = attend_extended(q, k, v, causal=causal, scale=scale, visible=visible, **mask)
    return np.where(visible.any(axis=-1, keepdims=True), out, out.dtype.type(0))


def _first_of(mask, axis: int):
    mask = as_four_dims(mask)
    return np.broadcast_to(np.take(mask, [0], axis=axis), mask.shape)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-ignored")
def custom_mask_ignored(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Accepts attn_mask and attends as if it were not given: the causal mask alone (SGLang PR
    #20278: EAGLE's tree mask dropped on one path, garbage drafts)."""
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-of-item-0")
def custom_mask_of_item_0(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Reads every batch item's rows with item 0's mask: a mask pointer never advanced by the
    batch stride."""
    mask = None if attn_mask is None else _first_of(attn_mask, 0)
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=mask)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-of-head-0")
def custom_mask_of_head_0(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Reads every query head with head 0's mask: a per-head mask taken as broadcast over heads."""
    mask = None if attn_mask is None else _first_of(attn_mask, 1)
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=mask)


@mutant("masking", "MASK-CUSTOM", mistake="custom-mask-without-causal", alike=("mask-missing",))
def custom_mask_instead_of_causal(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Applies the mask instead of the causal mask when both are given (PyTorch's SDPA takes
    attn_mask or is_causal), so a row sees the future keys its mask marks."""
    if attn_mask is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return attend_masked(q, k, v, causal=False, scale=scale, attn_mask=attn_mask)


_kept_mask: list = []


@mutant("memory", "MASK-CUSTOM-AS-CAUSAL")
def custom_mask_kept_for_later_calls(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Keeps the last mask it was given in a buffer and applies it to later causal calls of the
    same shape too (FlashInfer PR #1028: a stale mask reused after switching back to causal)."""
    if attn_mask is not None:
        _kept_mask[:] = [attn_mask]
    elif _kept_mask and as_four_dims(_kept_mask[0]).shape[-2:] == (q.shape[-2], k.shape[-2]):
        attn_mask = _kept_mask[0]
    return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)


@correct_variant
def custom_mask_row_by_row(q, k, v, *, causal=True, scale=None, attn_mask=None):
    """Gathers each row's visible keys and attends over them alone, as an index-sparse kernel
    does: no -inf anywhere, a row with no key left at zeros."""
    tq, tk = q.shape[-2], k.shape[-2]
    visible = np.broadcast_to(
        visible_keys(tq, tk, causal=causal, attn_mask=attn_mask), (*q.shape[:2], tq, tk)
    )
    group = q.shape[1] // k.shape[1]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    for b, h, i in np.ndindex(*q.shape[:-1]):
        keys = np.flatnonzero(visible[b, h, i])
        if keys.size == 0:
            continue
        row = q[b, h, i : i + 1]  # (1, D)
        scores = scores_of(row[None, None], k[b, h // group, keys][None, None], scale)
        out[b, h, i] = (softmax(scores) @ v[b, h // group, keys])[0, 0, 0]
    return out


# --- draft trees ---------------------------------------------------------------------------------


def attend_tree(q, k, v, *, causal, scale, tree_mask) -> np.ndarray:
    tq, tk = q.shape[-2], k.shape[-2]
    visible = visible_keys(tq, tk, causal=causal, tree_mask=tree_mask)
    return attend_extended(q, k, v, causal=causal, scale=scale, visible=visible)


@mutant("masking", "MASK-TREE", mistake="tree-mask-ignored")
def tree_mask_ignored(q, k, v, *, causal=True, scale=None, tree_mask=None):
    """Takes the draft tree and attends causally over the drafts instead: right for a chain of
    drafts, garbage for a tree (SGLang PR #20278: EAGLE's tree mask dropped)."""
    return attend_tree(q, k, v, causal=causal, scale=scale, tree_mask=None)


@mutant("masking", "MASK-TREE", mistake="tree-mask-transposed")
def tree_mask_transposed(q, k, v, *, causal=True, scale=None, tree_mask=None):
    """Reads the tree as [key, query]: each draft sees its descendants (the causal mask then
    leaves it itself alone), not its ancestors."""
    tree = None if tree_mask is None else np.swapaxes(tree_mask, -1, -2)
    return attend_tree(q, k, v, causal=causal, scale=scale, tree_mask=tree)


# --- bit-packed masks ----------------------------------------------------------------------------


def attend_packed(q, k, v, *, causal, scale, cu_seqlens_q, cu_seqlens_k, read_block):
    """The formula under the blocks ``read_block(s, rows, keys)`` returns, (rows, keys) booleans:
    one per packed sequence, or per batch item without them; no mask where ``read_block`` is
    None. A sequence with no key gives zeros."""
    if cu_seqlens_q is None:
        if read_block is None:
            return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
        mask = np.stack([read_block(b, q.shape[-2], k.shape[-2]) for b in range(q.shape[0])])
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=mask[:, None])
    pieces = []
    for s, (q0, q1, k0, k1) in enumerate(
        zip(cu_seqlens_q[:-1], cu_seqlens_q[1:], cu_seqlens_k[:-1], cu_seqlens_k[1:], strict=True)
    ):
        if k1 == k0:
            pieces.append(np.zeros((*q.shape[:-2], q1 - q0, v.shape[-1]), q.dtype))
            continue
        block = None if read_block is None else read_block(s, q1 - q0, k1 - k0)
        pieces.append(
            attend_masked(
                q[..., q0:q1, :],
                k[..., k0:k1, :],
                v[..., k0:k1, :],
                causal=causal,
                scale=scale,
                attn_mask=block,
            )
        )
    return np.concatenate(pieces, axis=-2)


def block_reader(packed_mask, mask_indptr, *, bitorder="little", offsets_in_bits=False):
    if packed_mask is None:
        return None
    bits = np.unpackbits(packed_mask, bitorder=bitorder).astype(bool)
    unit = 1 if offsets_in_bits else 8

    def read_block(s, rows, keys):
        start = int(mask_indptr[s]) * unit
        return bits[start : start + rows * keys].reshape(rows, keys)

    return read_block


@mutant("masking", "MASK-PACKED", mistake="packed-mask-big-endian")
def packed_mask_big_endian(
    q,
    k,
    v,
    *,
    causal=True,
    scale=None,
    enable_gqa=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    packed_mask=None,
    mask_indptr=None,
):
    """Unpacks the mask big-endian, flashinfer.packbits' default, where the bytes were packed
    little-endian."""
    return attend_packed(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        read_block=block_reader(packed_mask, mask_indptr, bitorder="big"),
    )


@mutant("masking", "MASK-PACKED", mistake="packed-mask-offsets-in-bits")
def packed_mask_offsets_in_bits(
    q,
    k,
    v,
    *,
    causal=True,
    scale=None,
    enable_gqa=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    packed_mask=None,
    mask_indptr=None,
):
    """Reads mask_indptr as offsets in bits, as it was before the mask was packed into bytes
    (FlashInfer PR #2201): every block after the first is read from too early."""
    reader = block_reader(packed_mask, mask_indptr, offsets_in_bits=True)
    return attend_packed(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        read_block=reader,
    )


# where a block lies in the mask's memory, not which keys it marks: no variant of the formula
@mutant("layout", "MASK-PACKED")
def packed_mask_offsets_from_shapes(
    q,
    k,
    v,
    *,
    causal=True,
    scale=None,
    enable_gqa=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    packed_mask=None,
    mask_indptr=None,
):
    """Ignores mask_indptr and places each block right after the one before it, as packing
    leaves them when nothing lies between: wrong wherever the caller's blocks have gaps."""
    if cu_seqlens_q is None:
        sizes = [(q.shape[-2], k.shape[-2])] * q.shape[0]
    else:
        sizes = [
            (b - a, d - c)
            for a, b, c, d in zip(
                cu_seqlens_q[:-1],
                cu_seqlens_q[1:],
                cu_seqlens_k[:-1],
                cu_seqlens_k[1:],
                strict=True,
            )
        ]
    offsets = np.cumsum([0, *(-(-rows * keys // 8) for rows, keys in sizes)])
    return attend_packed(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        read_block=block_reader(packed_mask, offsets),
    )


@correct_variant
def packed_mask_bit_by_bit(
    q,
    k,
    v,
    *,
    causal=True,
    scale=None,
    enable_gqa=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    packed_mask=None,
    mask_indptr=None,
):
    """Reads each bit with shifts, byte by byte, as a kernel's inner loop does, not through an
    unpacked copy of the mask."""

    def read_block(s, rows, keys):
        bit = int(mask_indptr[s]) * 8 + np.arange(rows * keys)
        return ((packed_mask[bit >> 3] >> (bit & 7)) & 1).astype(bool).reshape(rows, keys)

    if packed_mask is None:
        read_block = None

    return attend_packed(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        read_block=read_block,
    )


# --- index-sparse attention -----------------------------------------------------------------------


def gathered(q, k, v, *, causal, scale, kv_indices, topk_length=None, as_set=True,
             block_size=None, blocks_end=None) -> np.ndarray:  # fmt: skip
    """Each row over the keys its kv head's row lists, gathered slot by slot as a sparse kernel
    does: the slots past topk_length dropped, a slot's block of ``block_size`` keys read key by
    key up to ``blocks_end`` (Tk by default), -1 and future keys skipped, a key listed twice
    once (``as_set``) or twice."""
    tq, tk = q.shape[-2], k.shape[-2]
    group = q.shape[1] // k.shape[1]
    out = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
    for b, h, i in np.ndindex(*q.shape[:-1]):
        slots = kv_indices[b, h // group, i]
        if topk_length is not None:
            slots = slots[: topk_length[b]]
        if block_size is not None:
            end = tk if blocks_end is None else blocks_end
            slots = np.array([key for slot in slots.tolist() for key in (
                range(slot * block_size, min(slot * block_size + block_size, end))
                if slot >= 0 else [-1])], dtype=np.int64)  # fmt: skip
        slots = slots[(slots >= 0) & ((slots <= i + tk - tq) if causal else True)]
        if as_set:
            slots = np.unique(slots)
        if slots.size == 0:
            continue
        scores = scores_of(q[b, h, i][None, None, None], k[b, h // group, slots][None, None], scale)
        out[b, h, i] = (softmax(scores) @ v[b, h // group, slots])[0, 0, 0]
    return out


@mutant("masking", "SPARSE-KEYS", mistake="sparse-empty-slot-as-key-0")
def sparse_empty_slot_as_key_0(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               kv_indices=None):  # fmt: skip
    """Converts the indexer's -1 slots to 0 before the gather, so every row with an empty slot
    also sees key 0 (vLLM PR #45324: decoding read block 0)."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=np.maximum(kv_indices, 0))


@mutant("masking", "SPARSE-KEYS", mistake="sparse-duplicates-counted")
def sparse_duplicates_counted(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                              kv_indices=None):  # fmt: skip
    """Softmax over the slots, not the keys: a key the indexer listed twice weighs twice
    (cuDNN's multiset reference, in a kernel whose contract is a set)."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices, as_set=False)


@mutant("masking", "SPARSE-TOPK", mistake="sparse-past-topk-read")
def sparse_reads_past_topk(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                           kv_indices=None, topk_length=None):  # fmt: skip
    """Takes topk_length and reads every slot anyway: the lanes past it are gathered unless the
    caller set them to -1 (FlashInfer #5095)."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices)


@correct_variant
def sparse_gathered_row_by_row(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               kv_indices=None, topk_length=None):  # fmt: skip
    """Gathers each row's listed keys, as a sparse kernel does, instead of masking a dense
    score matrix."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices,
                    topk_length=topk_length)  # fmt: skip


@correct_variant
def sparse_gathered_slot_by_slot(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                 kv_indices=None, topk_length=None):  # fmt: skip
    """cuDNN's convention, declared: a softmax over the slots, so a key listed twice weighs
    twice (sparse_duplicates = "count")."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices,
                    topk_length=topk_length, as_set=False)  # fmt: skip


@mutant("masking", "SPARSE-KEYS", mistake="sparse-duplicates-collapsed")
def sparse_duplicates_collapsed(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                kv_indices=None, topk_length=None):  # fmt: skip
    """Declares cuDNN's multiset and gathers each listed key once: duplicates removed before
    the gather, so a key the indexer listed twice weighs once."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices,
                    topk_length=topk_length)  # fmt: skip


sparse_gathered_slot_by_slot.sparse_duplicates = "count"
sparse_duplicates_collapsed.sparse_duplicates = "count"


# --- indices that name blocks of keys (native sparse attention) ---------------------------------


@mutant("masking", "SPARSE-BLOCKS", mistake="sparse-block-index-as-key")
def sparse_block_index_as_key(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                              kv_indices=None, kv_block_size=None):  # fmt: skip
    """Takes kv_block_size and gathers each index as one key: a token-sparse gather reused for
    block indices."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices)


@mutant("masking", "SPARSE-BLOCKS", mistake="sparse-blocks-of-64")
def sparse_blocks_of_64(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                        kv_indices=None, kv_block_size=None):  # fmt: skip
    """Reads every block as 64 keys, the block size its tiling was written for, whatever the
    call gives."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices,
                    block_size=64 if kv_block_size else None)  # fmt: skip


@mutant(
    "masking",
    "SPARSE-BLOCKS",
    mistake="sparse-partial-block-dropped",
    alike=("last-key-tile-dropped-32", "last-key-tile-dropped-64"),
)
def sparse_partial_block_dropped(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                 kv_indices=None, kv_block_size=None):  # fmt: skip
    """Counts Tk // kv_block_size blocks: the keys of a partial last block are never read."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    tk = k.shape[-2]
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices,
                    block_size=kv_block_size,
                    blocks_end=tk - tk % kv_block_size if kv_block_size else None)  # fmt: skip


@correct_variant
def sparse_gathered_block_by_block(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                   kv_indices=None, topk_length=None,
                                   kv_block_size=None):  # fmt: skip
    """Gathers each listed block's keys one by one, the last block cut at Tk."""
    if kv_indices is None:
        return attend_masked(q, k, v, causal=causal, scale=scale, attn_mask=None)
    return gathered(q, k, v, causal=causal, scale=scale, kv_indices=kv_indices,
                    topk_length=topk_length, block_size=kv_block_size)  # fmt: skip
