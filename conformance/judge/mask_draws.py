"""How a test's custom mask or key indices are drawn: a recipe a case holds, drawn for its shape.

A case is frozen and hashable and is fitted to what a kernel declares (its lengths may change),
so it holds the recipe, not the array; :meth:`MaskDraw.array` draws the same mask for the same
recipe and shape every time. Reports name the recipe ("attn_mask=<30% per item, seed 1>").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from spec.masks import packed_bits, visible_keys

PATTERNS = ("random", "causal", "all")


@dataclass(frozen=True)
class MaskDraw:
    density: float = 0.5  # the chance that a query sees a key, drawn key by key ("random")
    per_item: bool = True  # a mask per batch item, else one shared (broadcast over B)
    per_head: bool = False  # a mask per query head, else one shared (broadcast over H)
    blind_rows: int = 0  # rows that see no key at all, spread over the rows
    hidden_keys: int = 0  # keys no row sees, spread over the keys
    # every row sees the key at its own position (or the last): no row is left without a key
    own_key: bool = False
    pattern: str = "random"  # "causal": the causal mask itself; "all": every key
    seed: int = 0

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern={self.pattern!r}, but should be one of {PATTERNS}")
        if not 0.0 <= self.density <= 1.0:
            raise ValueError(f"density={self.density}, but should lie in [0, 1]")

    def for_case(self, case) -> np.ndarray:
        return self.array(case.batch, case.heads, case.tq, case.tk)

    def array(self, batch: int, heads: int, tq: int, tk: int) -> np.ndarray:
        """The boolean mask, (B or 1, H or 1, Tq, Tk), True where the query may see the key."""
        shape = (batch if self.per_item else 1, heads if self.per_head else 1, tq, tk)
        if self.pattern == "causal":
            mask = np.broadcast_to(visible_keys(tq, tk, causal=True), shape).copy()
        elif self.pattern == "all":
            mask = np.ones(shape, bool)
        else:
            rng = np.random.default_rng([self.seed, *shape])
            mask = rng.random(shape) < self.density
        if self.own_key:
            rows = np.arange(tq)
            mask[..., rows, np.minimum(rows + tk - tq, tk - 1)] = True
        if self.blind_rows:
            mask[..., spread(tq, self.blind_rows), :] = False
        if self.hidden_keys:
            mask[..., spread(tk, self.hidden_keys)] = False
        return mask

    def __str__(self) -> str:
        what = {"causal": "the causal mask", "all": "every key"}.get(
            self.pattern, f"{self.density:.0%}"
        )
        spans = [w for w, on in (("per item", self.per_item), ("per head", self.per_head)) if on]
        extras = [f"{n} {w}" for n, w in ((self.blind_rows, "blind rows"),
                                         (self.hidden_keys, "hidden keys")) if n]  # fmt: skip
        extras += ["each row's own key"] if self.own_key else []
        seed = [f"seed {self.seed}"] if self.pattern == "random" else []
        return f"<{', '.join([what, *spans, *extras, *seed])}>"


@dataclass(frozen=True)
class PackedMaskDraw:
    """FlashInfer's bit-packed mask (spec.masks.packed_bits) over a case's packed sequences, or
    its batch items: each block drawn by ``mask`` as for one item and head, seeded by its
    place; ``spare`` bytes of ones after each block, which no bit of it is in, so a kernel
    that computes the offsets from the shapes rather than reading mask_indptr reads them."""

    mask: MaskDraw = MaskDraw()
    spare: int = 0

    def blocks(self, case) -> list[np.ndarray]:
        if case.cu_seqlens_q is None:
            sizes = [(case.tq, case.tk)] * case.batch
        else:
            sizes = [(q1 - q0, k1 - k0) for q0, q1, k0, k1 in zip(
                case.cu_seqlens_q[:-1], case.cu_seqlens_q[1:], case.cu_seqlens_k[:-1],
                case.cu_seqlens_k[1:], strict=True)]  # fmt: skip
        return [
            replace(self.mask, seed=self.mask.seed * 1000 + s).array(1, 1, rows, keys)[0, 0]
            for s, (rows, keys) in enumerate(sizes)
        ]

    def for_case(self, case) -> dict:
        """{"packed_mask": uint8 bytes, "mask_indptr": int32 byte offsets, one per block and
        the end}."""
        pieces = [
            np.concatenate([packed_bits(block), np.full(self.spare, 0xFF, np.uint8)])
            for block in self.blocks(case)
        ]
        offsets = np.cumsum([0, *(len(piece) for piece in pieces)]).astype(np.int32)
        return {"packed_mask": np.concatenate(pieces), "mask_indptr": offsets}

    def __str__(self) -> str:
        spare = f", {self.spare} spare bytes a block" if self.spare else ""
        return f"<bit-packed {str(self.mask)[1:-1]}{spare}>"


def spread(count: int, chosen: int) -> np.ndarray:
    """``chosen`` of ``count`` indices, evenly spread and the last one included."""
    return np.unique(np.linspace(count - 1, 0, min(chosen, count)).round().astype(int))


@dataclass(frozen=True)
class IndexDraw:
    """kv_indices (B, Hkv, Tq, K) as index-sparse kernels get them from their indexer: K keys per
    row of each key/value head, drawn without replacement from all Tk (future ones too, which
    the causal mask hides), some slots empty (-1), some repeating an earlier slot of the row."""

    keys: int = 16  # K, the slots per row (at most Tk, or its blocks, are distinct)
    empty: float = 0.0  # the share of slots left empty (-1)
    duplicates: int = 0  # slots per row that repeat an earlier slot's key
    blind_rows: int = 0  # rows whose every slot is empty, spread over the rows
    unlisted_keys: int = 0  # keys no row lists, spread over the keys
    dtype: str = "int32"
    seed: int = 0
    # the slots past the case's topk_length rewritten to other keys (what is there must not count)
    rewritten_past_topk: bool = False

    def for_case(self, case) -> np.ndarray:
        # what an index names: a key, or a block of kv_block_size keys (the last one partial)
        named = -(-case.tk // (case.kv_block_size or 1))
        indices = self.array(case.batch, case.key_value_heads, case.tq, named)
        if self.rewritten_past_topk and case.topk_length is not None:
            past = np.arange(self.keys) >= np.asarray(case.topk_length)[:, None, None, None]
            other = (indices.astype(np.int64) + 1 + self.keys) % named
            indices = np.where(past, other, indices).astype(self.dtype)
        return indices

    def array(self, batch: int, kv_heads: int, tq: int, tk: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, batch, kv_heads, tq, tk])
        shape = (batch, kv_heads, tq)
        pool = np.setdiff1d(np.arange(tk), spread(tk, self.unlisted_keys) if self.unlisted_keys
                            else [])  # fmt: skip
        distinct = min(self.keys, len(pool))
        # each row's first `distinct` keys: a random permutation's head, row by row
        chosen = pool[np.argsort(rng.random((*shape, len(pool))), axis=-1)[..., :distinct]]
        indices = np.full((*shape, self.keys), -1, np.int64)
        indices[..., :distinct] = chosen
        if self.duplicates:
            slots = spread(self.keys, self.duplicates)
            slots = slots[slots > 0]
            indices[..., slots] = indices[..., slots - 1]  # the slot before it, listed again
        indices = np.where(rng.random(indices.shape) < self.empty, -1, indices)
        if self.blind_rows:
            indices[:, :, spread(tq, self.blind_rows)] = -1
        return indices.astype(self.dtype)

    def __str__(self) -> str:
        parts = [f"{self.keys} keys per row"]
        parts += [f"{self.empty:.0%} empty"] if self.empty else []
        parts += [f"{self.duplicates} repeated"] if self.duplicates else []
        parts += [f"{self.blind_rows} rows listing none"] if self.blind_rows else []
        parts += [f"{self.unlisted_keys} keys listed by none"] if self.unlisted_keys else []
        parts += ["past topk_length rewritten"] if self.rewritten_past_topk else []
        return f"<{', '.join([*parts, self.dtype, f'seed {self.seed}'])}>"


TREES = ("chain", "star", "binary")


@dataclass(frozen=True)
class TreeDraw:
    """A draft tree of Tq tokens, as speculative decoding verifies one: draft i sees its
    ancestors and itself. A chain is plain causal attention over the drafts, a star a root with
    Tq - 1 children, a binary tree each draft i > 0 the child of (i - 1) // 2."""

    shape: str = "binary"

    def __post_init__(self) -> None:
        if self.shape not in TREES:
            raise ValueError(f"shape={self.shape!r}, but should be one of {TREES}")

    def for_case(self, case) -> np.ndarray:
        return self.array(case.tq)

    def array(self, drafts: int) -> np.ndarray:
        """(1, Tq, Tq): True where draft i sees draft j."""
        parent = {
            "chain": lambda i: i - 1,
            "star": lambda i: 0,
            "binary": lambda i: (i - 1) // 2,
        }[self.shape]
        tree = np.eye(drafts, dtype=bool)
        for i in range(1, drafts):
            tree[i] |= tree[parent(i)]  # a parent comes before its children
        return tree[None]

    def __str__(self) -> str:
        return f"<a {self.shape} of drafts>"
