"""Which keys a query sees: each kind of mask declared once, as a predicate.

A kind is the keywords of a call that turn it on, and one vectorised predicate over a
:class:`Grid` of (batch item, query head, query row, key) indices, True where the query may see
the key, as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``. The kinds a call turns on are
composed by intersection. Everything that asks which keys a row sees - the float64 truth and its
backward's zeros, the log-sum-exp, the mistakes' variants (which swap one predicate for its
wrong twin), the tiles a flash kernel skips - asks :func:`visible`: a new kind is its entry in
:data:`MASK_KINDS`, its check of the call's inputs, and its feature (spec.features).

The predicates use nothing but comparisons, ``&``, ``//`` and indexing, so they run on NumPy
arrays and on any array library's tensors alike (impls.torch_arrays builds its masks from them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Grid:
    """The indices a predicate is asked at, each broadcastable against the others to
    (B, H, Tq, Tk): ``batch`` (B, 1, 1, 1), ``head`` (1, H, 1, 1), ``row`` (1, 1, Tq, 1),
    ``key`` (1, 1, 1, Tk); ``position`` (B or 1, 1, Tq, 1) is the absolute position of each
    query row, row + L_b - Tq (bottom-right aligned, L_b = Tk without key lengths), and
    ``length`` (B or 1, 1, 1, 1) each item's keys, L_b."""

    batch: Any
    head: Any
    row: Any
    key: Any
    position: Any
    length: Any

    @classmethod
    def over(cls, batch: int, heads: int, tq: int, tk: int, *, key_lengths=None,
             arange=np.arange, asarray=np.asarray) -> Grid:  # fmt: skip
        """The grid of a call: ``arange`` and ``asarray`` are its array library's (a torch
        call's on its device)."""
        lengths = asarray([tk] if key_lengths is None else [int(n) for n in key_lengths])
        length = lengths.reshape(-1, 1, 1, 1)
        row = arange(tq).reshape(1, 1, -1, 1)
        return cls(
            batch=arange(batch).reshape(-1, 1, 1, 1),
            head=arange(heads).reshape(1, -1, 1, 1),
            row=row,
            key=arange(tk).reshape(1, 1, 1, -1),
            position=row + (length - tq),
            length=length,
        )

    def tile(self, rows, keys) -> Grid:
        """The same grid cut to a tile of query rows and keys (slices), for a kernel that asks
        block by block."""
        return replace(self, row=self.row[:, :, rows], key=self.key[..., keys],
                       position=self.position[:, :, rows])  # fmt: skip


Predicate = Callable[[Grid, dict], Any]


@dataclass(frozen=True)
class Dims:
    """A call's sizes, as a kind's input check reads them."""

    batch: int
    heads: int
    kv_heads: int
    tq: int
    tk: int

    @property
    def scores(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.tq, self.tk)


@dataclass(frozen=True)
class MaskKind:
    name: str
    # the call's keywords the kind reads; it is on where one of them is given (not None)
    keywords: tuple[str, ...]
    sees: Predicate  # True where the query may see the key
    # the (batch items, heads) the kind's inputs hold, where they hold more than one (a mask
    # per item or per head): the grid it is asked on spans them
    extent: Callable[[dict], tuple[int, int]] = lambda options: (1, 1)
    on: Callable[[dict], bool] | None = None  # when "a keyword is given" is not the rule
    # what is wrong with the call's inputs for the kind, in words, or None: given the options
    # and the call's sizes; impls.validation raises it
    problem: Callable[[dict, Dims], str | None] = lambda options, dims: None
    # the options as the predicate reads them, made once on the host from the call's own (NumPy
    # arrays by the contract): what the kind's keywords say, in one form
    prepared: Callable[[dict], dict] | None = None
    # the options for one batch item's rows and keys alone (a call of its own)
    cut: Callable[[dict, int, slice, slice], dict] | None = None
    # whether the call lists which keys each row sees in an array (a mask, indices): a kernel
    # gets it as a NumPy array, and a tiled one may skip the tiles it lists nothing in
    listed: bool = False
    # the conventions an implementation declares for the kind (Capabilities fields of these
    # names), each with its values, the default first; the truth reads the declared one as an
    # option of this name, which the kernel is not given
    conventions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # how many times a query counts each key it sees, where a convention counts some more than
    # once (the truth adds log(count) to its score); None: once each
    counts: Callable[[Grid, dict], Any] | None = None
    # the keywords whose value is an array of any dims (a mask, its bytes, indices), not numbers
    # per batch item or sequence
    arrays: tuple[str, ...] = ()
    # the keywords that come with another's value and are not set apart (a packed mask's
    # offsets): a test's case draws them with it
    companions: tuple[str, ...] = ()

    def applies(self, options: dict) -> bool:
        if self.on is not None:
            return self.on(options)
        return any(options.get(keyword) is not None for keyword in self.keywords)


def as_four_dims(mask):
    """A mask broadcastable to (B, H, Tq, Tk) given with fewer dims, as (1, .., Tq, Tk)."""
    return mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape)) if mask.ndim < 4 else mask


def host_values(values) -> np.ndarray:
    """A small array of values a check must read (per-head numbers, lengths, offsets, a block
    table, scales) as a NumPy array, whatever array it came as: a torch tensor that requires grad
    or lives on a GPU, a CuPy or JAX array, a view. ``np.asarray`` refuses the first two, so such
    arrays are read through ``tolist()``, which every array library has and which copies only
    these few values; the dtype's kind (integer, floating) is kept, which the checks read."""
    if isinstance(values, (np.ndarray, np.generic)) or not (
        hasattr(values, "tolist") and hasattr(values, "shape") and hasattr(values, "dtype")
    ):
        return np.asarray(values)
    listed = np.asarray(values.tolist())
    name = str(values.dtype).removeprefix("torch.")
    try:
        dtype = np.dtype(name)
    except TypeError:  # bfloat16, the FP8 formats: floats NumPy does not name
        dtype = np.dtype(np.float64) if "float" in name else listed.dtype
    return listed.astype(dtype, copy=False)


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | np.integer)


def _causal_bound(name: str, least: int, what: str):
    def problem(options, dims):
        value = options[name]
        if not _is_integer(value) or value < least:
            return f"{name}={value!r}, but should be an integer >= {least} or None"
        if not options.get("causal"):
            return f"{name}={value} with causal=False: {what}"
        return None

    return problem


def _custom_mask_problem(options, dims: Dims) -> str | None:
    shape = dims.scores
    mask = options["attn_mask"]
    if not (hasattr(mask, "shape") and hasattr(mask, "dtype")):
        return f"attn_mask is a {type(mask).__name__}, but should be a boolean array"
    if "bool" not in str(mask.dtype):
        return (
            f"attn_mask has dtype {mask.dtype}, but should be boolean: True where a query may see "
            "a key (an additive float mask is not this keyword)"
        )
    given = tuple(mask.shape)
    if not 2 <= len(given) <= 4 or any(
        n not in (1, full) for n, full in zip(given[::-1], shape[::-1], strict=False)
    ):
        return (
            f"attn_mask has shape {given}, but should broadcast to (B, H, Tq, Tk) = {shape}: "
            "(Tq, Tk), (B or 1, Tq, Tk) or (B or 1, H or 1, Tq, Tk)"
        )
    return _dense_only("attn_mask", options)


# What a listed mask is not defined with: the contract defines each over a dense call.
NOT_DENSE = {"cu_seqlens_q": "packed sequences", "query_lengths": "padded query rows",
             "block_table": "a paged cache"}  # fmt: skip


def _dense_only(name: str, options: dict, *others: str) -> str | None:
    """Why ``name`` cannot be given with what the call also gives, or None: not with packed
    sequences, padded query rows or pages, nor with the listed kinds ``others``."""
    for keyword, what in (*NOT_DENSE.items(), *((other, "") for other in others)):
        if options.get(keyword) is not None:
            given = f"{what} ({keyword})" if what else keyword
            return (
                f"{name} with {given}: the contract defines it over a dense call's "
                "(B, H, Tq, Tk), with key lengths or without"
            )
    return None


def custom_mask_sees(grid: Grid, options: dict):
    mask = as_four_dims(options["attn_mask"])
    # A dim of 1 broadcasts: index 0 there, whatever the grid's index.
    return mask[
        grid.batch * (mask.shape[0] != 1),
        grid.head * (mask.shape[1] != 1),
        grid.row * (mask.shape[2] != 1),
        grid.key * (mask.shape[3] != 1),
    ]


def _tree_mask_problem(options, dims: Dims) -> str | None:
    tree = options["tree_mask"]
    if not (hasattr(tree, "shape") and hasattr(tree, "dtype")) or "bool" not in str(tree.dtype):
        return (
            f"tree_mask is {type(tree).__name__} {getattr(tree, 'dtype', '')}, but should be a "
            "boolean array"
        )
    if tree.ndim != 3 or tree.shape[0] not in (1, dims.batch) or tree.shape[1:] != (dims.tq,) * 2:
        return (
            f"tree_mask has shape {tuple(tree.shape)}, but should be (B or 1, Tq, Tq) = "
            f"({dims.batch}, {dims.tq}, {dims.tq}): which of the Tq drafts each draft sees"
        )
    return _dense_only("tree_mask", options, "attn_mask", "kv_indices")


def tree_mask_sees(grid: Grid, options: dict):
    """Draft row i sees every key before the Tq drafts (the newest of its item's keys) and the
    drafts its row of the tree marks."""
    tree = options["tree_mask"]  # (B or 1, Tq, Tq)
    tq = tree.shape[-1]
    draft = grid.key - (grid.length - tq)  # which draft a key is; < 0: the prefix
    in_drafts = draft >= 0
    item = grid.batch * (tree.shape[0] != 1)
    return ~in_drafts | tree[item, grid.row, draft * in_drafts]


def _tree_mask_cut(options: dict, item: int, rows: slice, keys: slice) -> dict:
    tree = options["tree_mask"]
    return {**options, "tree_mask": tree[item : item + 1] if tree.shape[0] != 1 else tree}


# How a key listed twice in a row counts: once (a set: FlashAttention 4's reference), or twice
# (a softmax over the slots: cuDNN's reference).
SPARSE_DUPLICATES = ("once", "count")


def _sparse_problem(options, dims: Dims) -> str | None:
    indices = options.get("kv_indices")
    if indices is None:
        lone = "topk_length" if options.get("topk_length") is not None else "kv_block_size"
        what = {"topk_length": "it counts the first entries of their rows",
                "kv_block_size": "it sizes the blocks they name"}[lone]  # fmt: skip
        return f"{lone} without kv_indices: {what}"
    if not (hasattr(indices, "shape") and hasattr(indices, "dtype")):
        return f"kv_indices is a {type(indices).__name__}, but should be an integer array"
    expected = f"(B, Hkv, Tq, K) = ({dims.batch}, {dims.kv_heads}, {dims.tq}, K)"
    if "int" not in str(indices.dtype) or "uint" in str(indices.dtype):
        return f"kv_indices has dtype {indices.dtype}, but should be int32 or int64"
    if indices.ndim != 4 or tuple(indices.shape[:3]) != (dims.batch, dims.kv_heads, dims.tq):
        return f"kv_indices has shape {tuple(indices.shape)}, but should be {expected}"
    block = options.get("kv_block_size")
    if block is not None and (not _is_integer(block) or block < 1):
        return f"kv_block_size={block!r}, but should be a positive integer (keys a block) or None"
    block = block or 1
    values = host_values(indices)
    named = -(-dims.tk // block)  # the blocks the keys make, the last one partial or not
    wrong = (values < -1) | (values >= named)
    if wrong.any():
        at = tuple(int(i) for i in np.argwhere(wrong)[0])
        what = (f"a key 0..{dims.tk - 1}" if block == 1 else
                f"a block of {block} keys 0..{named - 1} (Tk = {dims.tk})")  # fmt: skip
        return (
            f"kv_indices{list(at)} = {int(values[at])}, but an index names {what}, "
            "or is -1 for an empty slot"
        )
    lengths = options.get("topk_length")
    if lengths is not None:
        lengths = host_values(lengths)
        if lengths.shape != (dims.batch,) or not np.issubdtype(lengths.dtype, np.integer):
            return f"topk_length={lengths.tolist()!r}, but should be {dims.batch} integers"
        if lengths.min() < 0 or lengths.max() > indices.shape[-1]:
            return (
                f"topk_length={lengths.tolist()}, but each should be between 0 and "
                f"K = {indices.shape[-1]}"
            )
    return _dense_only("kv_indices", options, "attn_mask", "tree_mask")


def _sparse_prepared(options: dict) -> dict:
    """kv_indices with the slots past each item's topk_length emptied (-1): they do not count,
    whatever they hold; blocks (kv_block_size) listed as their keys; and, for NumPy indices,
    ``kv_members``: the rows' lists as a boolean (B, Hkv, Tq, largest index + 1), which the
    predicate reads (one scatter, not a comparison of every slot with every key)."""
    lengths = options.get("topk_length")
    if lengths is not None:
        indices = np.asarray(options["kv_indices"])
        past = np.arange(indices.shape[-1]) >= np.asarray(lengths)[:, None, None, None]
        options = {**options, "kv_indices": np.where(past, -1, indices), "topk_length": None}
    if options.get("kv_block_size") is not None:
        keys = keys_of_blocks(np.asarray(options["kv_indices"]), options["kv_block_size"])
        options = {**options, "kv_indices": keys, "kv_block_size": None}
    indices = options["kv_indices"]
    if options.get("kv_members") is None and isinstance(indices, np.ndarray):
        options = {**options, "kv_members": listed_members(indices)}
    return options


def keys_of_blocks(indices: np.ndarray, block: int) -> np.ndarray:
    """(B, Hkv, Tq, K * block): each slot's block j as the keys j * block .. j * block + block - 1
    (those past Tk name no key, and no row sees them), an empty slot as ``block`` empty slots."""
    keys = indices[..., None] * block + np.arange(block)
    return np.where(indices[..., None] < 0, -1, keys).reshape(*indices.shape[:-1], -1)


def listed_members(indices: np.ndarray) -> np.ndarray:
    """(B, Hkv, Tq, largest index + 1): True where the row lists the key, once or more."""
    size = int(indices.max(initial=-1)) + 1
    members = np.zeros((*indices.shape[:-1], size + 1), bool)  # the last column: empty slots
    np.put_along_axis(members, np.where(indices < 0, size, indices), True, axis=-1)
    return members[..., :size]


def _sparse_cut(options: dict, item: int, rows: slice, keys: slice) -> dict:
    indices = _sparse_prepared(options)["kv_indices"][item : item + 1, :, rows]
    # an index past the item's keys names its padding, which no row sees: an empty slot there
    indices = np.where(indices >= (keys.stop if keys.stop is not None else np.inf), -1, indices)
    kept = {name: value for name, value in options.items() if name != "kv_members"}
    return {**kept, "kv_indices": indices, "topk_length": None, "kv_block_size": None}


def sparse_indices_counts(grid: Grid, options: dict):
    """Under ``sparse_duplicates="count"``, how often row i of h's key/value head lists key j
    (cuDNN's reference: a softmax over the slots); None under "once" (a set)."""
    if options.get("sparse_duplicates", "once") == "once":
        return None
    indices = options["kv_indices"]
    heads, kv_heads = grid.head.shape[1], indices.shape[1]
    kv_head = grid.head // (heads // kv_heads) if kv_heads > 1 else grid.head * 0
    listed = indices[grid.batch, kv_head, grid.row][..., 0, :]  # (B, H, Tq, K)
    return (listed[..., None, :] == grid.key[..., None]).sum(-1)


def sparse_indices_sees(grid: Grid, options: dict):
    """Key j is seen by query row i of head h where row i of h's key/value head lists it."""
    indices = options["kv_indices"]  # (B, Hkv, Tq, K), -1 an empty slot; prepared: no topk_length
    heads, kv_heads = grid.head.shape[1], indices.shape[1]
    kv_head = grid.head // (heads // kv_heads) if kv_heads > 1 else grid.head * 0
    members = options.get("kv_members")  # (B, Hkv, Tq, size), where the caller made it
    if members is not None:
        inside = grid.key < members.shape[-1]  # a key past every index is listed by no row
        return members[grid.batch, kv_head, grid.row, grid.key * inside] & inside
    listed = indices[grid.batch, kv_head, grid.row][..., 0, :]  # (B, H, Tq, K)
    # (B, H, Tq, 1, K) against (1, 1, 1, Tk, 1): listed anywhere in the row, once or twice
    return (listed[..., None, :] == grid.key[..., None]).sum(-1) > 0


def packed_bits(mask) -> np.ndarray:
    """A boolean (Tq_s, Tk_s) block flattened row-major and packed eight bits a byte, the first
    bit in the lowest (little-endian, as FlashInfer's wrappers pack it; ``flashinfer.packbits``
    alone defaults to big-endian)."""
    return np.packbits(np.asarray(mask, bool).reshape(-1), bitorder="little")


def _packed_mask_problem(options, dims: Dims) -> str | None:
    packed, offsets = options.get("packed_mask"), options.get("mask_indptr")
    if packed is None or offsets is None:
        return (
            "packed_mask and mask_indptr come together: the bits, and where each sequence's "
            f"bytes start (given: packed_mask={type(packed).__name__}, "
            f"mask_indptr={type(offsets).__name__})"
        )
    if not (hasattr(packed, "dtype") and str(packed.dtype) == "uint8" and packed.ndim == 1):
        return (
            f"packed_mask is {type(packed).__name__} {getattr(packed, 'dtype', '')} of shape "
            f"{tuple(getattr(packed, 'shape', ()))}, but should be a 1-D uint8 array: each "
            "sequence's (Tq_s x Tk_s) block, row-major, eight bits a byte, little-endian"
        )
    offsets = host_values(offsets)
    if offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer):
        return f"mask_indptr={offsets.tolist()!r}, but should be a 1-D integer array of offsets"
    sizes = _packed_block_sizes(options, dims)
    if len(offsets) != len(sizes) + 1:
        where = "sequence" if options.get("cu_seqlens_q") is not None else "batch item"
        return (
            f"mask_indptr has {len(offsets)} offsets, but should have {len(sizes) + 1}: one per "
            f"{where} and the end"
        )
    for s, (rows, keys) in enumerate(sizes):
        needed = -(-rows * keys // 8)
        given = int(offsets[s + 1]) - int(offsets[s])
        if offsets[s] < 0 or given < needed:
            return (
                f"mask_indptr[{s}:{s + 2}] = {offsets[s : s + 2].tolist()}, {given} bytes, but "
                f"{s}'s ({rows} x {keys}) block needs {needed}: mask_indptr counts bytes"
            )
    if int(offsets[-1]) > packed.shape[0]:
        return (
            f"packed_mask has {packed.shape[0]} bytes, but mask_indptr ends at {int(offsets[-1])}"
        )
    return _dense_only_but_packed("packed_mask", options)


def _packed_block_sizes(options: dict, dims: Dims) -> list[tuple[int, int]]:
    """(rows, keys) of each block a packed mask holds: each packed sequence's, or each batch
    item's (Tq, Tk)."""
    starts_q, starts_k = options.get("cu_seqlens_q"), options.get("cu_seqlens_k")
    if starts_q is None or starts_k is None:
        return [(dims.tq, dims.tk)] * dims.batch
    return [(int(q1) - int(q0), int(k1) - int(k0)) for q0, q1, k0, k1 in zip(
        starts_q[:-1], starts_q[1:], starts_k[:-1], starts_k[1:], strict=True)]  # fmt: skip


def _dense_only_but_packed(name: str, options: dict) -> str | None:
    """As :func:`_dense_only`, packed sequences allowed: a packed mask holds one block each."""
    if options.get("key_lengths") is not None:
        return f"{name} with key_lengths: its blocks are (Tq x Tk), or each packed sequence's"
    return _dense_only(name, {**options, "cu_seqlens_q": None}, "attn_mask", "tree_mask",
                       "kv_indices")  # fmt: skip


def _packed_mask_prepared(options: dict) -> dict:
    # offsets given as a list or tuple are indexed by the grid's batch indices
    offsets = options["mask_indptr"]
    return {**options, "mask_indptr": np.asarray(offsets) if isinstance(offsets, list | tuple)
            else offsets}  # fmt: skip


def packed_mask_sees(grid: Grid, options: dict):
    """Bit row * Tk_b + key of item b's block, its bytes from mask_indptr[b] on: a packed
    sequence is an item of its own (spec.formula.per_sequence cuts the call to it)."""
    packed, offsets = options["packed_mask"], options["mask_indptr"]
    bit = offsets[grid.batch] * 8 + grid.row * grid.length + grid.key
    return (packed[bit >> 3] >> (bit & 7)) & 1 == 1


def _packed_mask_cut(options: dict, item: int, rows: slice, keys: slice) -> dict:
    # The bytes stay whole and the offsets keep counting from their start, as the kernel got them.
    offsets = options["mask_indptr"]
    return {**options, "mask_indptr": offsets[item : item + 2]}


MASK_KINDS: tuple[MaskKind, ...] = (
    # The document's: row i sees the keys up to its position.
    MaskKind(
        "causal", ("causal",), lambda g, o: g.key <= g.position, on=lambda o: bool(o.get("causal"))
    ),
    # Item b's padding past its L_b keys is never seen; its rows sit at i + L_b - Tq (the Grid).
    MaskKind(
        "key_lengths",
        ("key_lengths",),
        lambda g, o: g.key < g.length,
        extent=lambda o: (len(o["key_lengths"]), 1),
    ),
    MaskKind(
        "window",
        ("window",),
        lambda g, o: g.key >= g.position - o["window"],
        problem=_causal_bound("window", 0, "the window is a left window of causal attention"),
    ),
    MaskKind(
        "chunk",
        ("chunk",),
        lambda g, o: g.key // o["chunk"] == g.position // o["chunk"],
        problem=_causal_bound("chunk", 1, "chunked attention is causal within each chunk"),
    ),
    MaskKind(
        "attn_mask",
        ("attn_mask",),
        custom_mask_sees,
        extent=lambda o: tuple(as_four_dims(o["attn_mask"]).shape[:2]),
        problem=_custom_mask_problem,
        cut=lambda o, item, rows, keys: _custom_mask_cut(o, item, rows, keys),
        listed=True,
        arrays=("attn_mask",),
    ),
    MaskKind(
        "tree_mask",
        ("tree_mask",),
        tree_mask_sees,
        extent=lambda o: (o["tree_mask"].shape[0], 1),
        problem=_tree_mask_problem,
        cut=_tree_mask_cut,
        listed=True,
        arrays=("tree_mask",),
    ),
    # FlashInfer's custom mask bit-packed: one (Tq_s x Tk_s) block per packed sequence (or per
    # batch item), the blocks' bytes starting at mask_indptr.
    MaskKind(
        "packed_mask",
        ("packed_mask", "mask_indptr"),
        packed_mask_sees,
        extent=lambda o: (len(o["mask_indptr"]) - 1, 1),
        problem=_packed_mask_problem,
        prepared=_packed_mask_prepared,
        cut=_packed_mask_cut,
        listed=True,
        arrays=("packed_mask",),
        companions=("mask_indptr",),
    ),
    MaskKind(
        "kv_indices",
        ("kv_indices", "topk_length", "kv_block_size"),
        sparse_indices_sees,
        extent=lambda o: tuple(o["kv_indices"].shape[:2]),
        problem=_sparse_problem,
        prepared=_sparse_prepared,
        cut=_sparse_cut,
        listed=True,
        conventions={"sparse_duplicates": SPARSE_DUPLICATES},
        counts=sparse_indices_counts,
        arrays=("kv_indices",),
    ),
)
MASK_KEYWORDS = tuple(keyword for kind in MASK_KINDS for keyword in kind.keywords)
# The conventions the kinds declare ({name: values, the default first}): options of the truth's,
# not keywords of a call.
MASK_CONVENTIONS = {name: values for kind in MASK_KINDS
                    for name, values in kind.conventions.items()}  # fmt: skip
# The keywords whose values list which keys each row sees, as arrays (MaskKind.listed).
LISTED_KEYWORDS = tuple(keyword for kind in MASK_KINDS if kind.listed for keyword in kind.keywords)
# The keywords whose value is an array of any dims (MaskKind.arrays).
ARRAY_KEYWORDS = frozenset(keyword for kind in MASK_KINDS for keyword in kind.arrays)
# The keywords a test sets (a field of its case each): all but the companions of another's.
CASE_KEYWORDS = tuple(keyword for kind in MASK_KINDS for keyword in kind.keywords
                      if keyword not in kind.companions)  # fmt: skip


def with_mask_fields(cls: type, keywords=(*MASK_KEYWORDS, *MASK_CONVENTIONS)) -> type:
    """Gives the class a field per keyword of ``keywords`` it does not declare itself (default
    None), before @dataclass makes its fields: a call's or a case's mask keywords follow the
    kinds' declarations."""
    for keyword in keywords:
        if keyword not in cls.__annotations__:
            cls.__annotations__[keyword] = "Any"
            setattr(cls, keyword, None)
    return cls


def mask_options(options: dict) -> dict:
    """The keywords of a call's options that say which keys it sees (``causal`` included), and
    the conventions the truth reads with them (:data:`MASK_CONVENTIONS`)."""
    return {name: options[name] for name in (*MASK_KEYWORDS, *MASK_CONVENTIONS)
            if options.get(name) is not None}  # fmt: skip


def only_mask_options(options: dict) -> dict:
    """``options``, all of which must say which keys a call sees: another keyword is refused by
    name rather than dropped."""
    unknown = sorted(name for name in options
                     if name not in MASK_KEYWORDS and name not in MASK_CONVENTIONS)  # fmt: skip
    if unknown:
        raise TypeError(f"{', '.join(unknown)} do not say which keys a query sees; the mask "
                        f"keywords are {', '.join(MASK_KEYWORDS)}")  # fmt: skip
    for name, value in options.items():
        if name in MASK_CONVENTIONS and value not in MASK_CONVENTIONS[name]:
            raise ValueError(f"{name}={value!r}, but should be one of "
                             f"{', '.join(MASK_CONVENTIONS[name])}")  # fmt: skip
    return mask_options(options)


def cut_to_item(options: dict, item: int, rows: slice, keys: slice) -> dict:
    """``options`` for batch item ``item``'s query rows ``rows`` and keys ``keys`` alone, as a
    call of its own (a batch of one): each kind's inputs given per item, row or key cut to them.
    Of a packed call, ``item`` is a sequence and ``rows`` and ``keys`` its tokens."""
    for kind in MASK_KINDS:
        if kind.cut is not None and kind.applies(options):
            options = kind.cut(options, item, rows, keys)
    return options


def _custom_mask_cut(options: dict, item: int, rows: slice, keys: slice) -> dict:
    mask = as_four_dims(options["attn_mask"])
    items = slice(item, item + 1) if mask.shape[0] != 1 else slice(None)
    rows = rows if mask.shape[2] != 1 else slice(None)
    keys = keys if mask.shape[3] != 1 else slice(None)
    return {**options, "attn_mask": mask[items, :, rows, keys]}


def prepared(options: dict) -> dict:
    """The options as the predicates read them (each kind's :attr:`MaskKind.prepared`)."""
    for kind in MASK_KINDS:
        if kind.prepared is not None and kind.applies(options):
            options = kind.prepared(options)
    return options


def problems(options: dict, dims: Dims) -> list[str]:
    """What is wrong with a call's mask keywords, each kind's words; empty where nothing is."""
    found = (kind.problem(options, dims) for kind in MASK_KINDS if kind.applies(options))
    return [problem for problem in found if problem is not None]


def extent_of(options: dict, batch: int = 1, heads: int = 1) -> tuple[int, int]:
    for kind in MASK_KINDS:
        if kind.applies(options):
            items, kind_heads = kind.extent(options)
            batch, heads = max(batch, items), max(heads, kind_heads)
    return batch, heads


def visible(grid: Grid, options: dict, *, instead: dict[str, Predicate | None] | None = None):
    """True where the query may see the key, over ``grid``: the intersection of the predicates of
    the kinds ``options`` turn on. ``instead`` swaps a kind's predicate for another by name (a
    mistake's wrong twin; None leaves the kind out)."""
    instead = instead or {}
    options = prepared(options)
    seen = grid.key >= 0  # every key, shaped as the grid's keys
    for kind in MASK_KINDS:
        if kind.name in instead:
            predicate = instead[kind.name]
        else:
            predicate = kind.sees if kind.applies(options) else None
        if predicate is not None:
            seen = seen & predicate(grid, options)
    return seen


def counted_keys(tq: int, tk: int, *, heads: int = 1, **options):
    """(B or 1, H or 1, Tq, Tk): how many times each query counts each key, as
    :func:`visible_keys` lays out which it sees; None where every key counts once."""
    if all(options.get(name, values[0]) == values[0] for name, values in MASK_CONVENTIONS.items()):
        return None  # the default conventions count each key once
    options = prepared(options)
    batch, heads = extent_of(options, heads=heads)
    grid = Grid.over(batch, heads, tq, tk, key_lengths=options.get("key_lengths"))
    return key_counts(grid, options)


def key_counts(grid: Grid, options: dict):
    """How many times each query counts each key (the product of the kinds' counts), over
    ``grid``; None where every kind counts a visible key once."""
    options = prepared(options)
    counted = None
    for kind in MASK_KINDS:
        if kind.counts is not None and kind.applies(options):
            counts = kind.counts(grid, options)
            if counts is not None:
                counted = counts if counted is None else counted * counts
    return counted


def visible_keys(tq: int, tk: int, *, causal: bool = True, heads: int = 1, **options):
    """Boolean (B or 1, H or 1, Tq, Tk), True where query row i of batch item b and head h sees
    key j: the document's causal mask (bottom-right aligned) intersected with the extensions'
    kinds the options turn on. ``heads``: the call's query heads, where a kind's inputs are per
    key/value head (kv_indices) and the call's heads are grouped."""
    options = prepared({**options, "causal": causal})
    batch, heads = extent_of(options, heads=heads)
    grid = Grid.over(batch, heads, tq, tk, key_lengths=options.get("key_lengths"))
    seen = visible(grid, options)
    return np.broadcast_to(seen, np.broadcast_shapes(seen.shape, (1, 1, tq, tk)))
