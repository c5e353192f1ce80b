"""Which regimes of spec.regimes a call draws, read off the call itself (its case and inputs).

A test's regimes are what its calls were, not what it says it draws: the judge notes them on every
call and merge, and ``docs/regimes.md`` is their sum over a run.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict

import numpy as np

from conformance.judge.truth import inputs_digest
from impls.capabilities import LAYOUTS
from spec.formula import causal_mask, keys_read_and_blind_rows
from spec.masks import as_four_dims, visible_keys
from spec.regimes import FAR_ABOVE, FAR_BELOW, FAR_SCORES, LSE_NEAR_1000, SINK_FAR

# Beyond this many scores a call's score regimes are not read: the suite's large cases are there
# for their length, not their scores, and a (B, H, Tq, Tk) float64 matrix this size is 256 MiB.
MOST_SCORES = 1 << 25
# Rows' score extremes by inputs, the least recently asked for dropped first: a test's calls of one
# implementation, and the next implementation's on the same inputs, find theirs here.
MOST_REMEMBERED = 32
_ROW_EXTREMES: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()


def _scaled_scores(case, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(B, H, Tq, Tk) scaled scores, NaN at keys past each item's key length."""
    batch, heads, tq, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(head_dim)
    grouped = q.reshape(batch, kv_heads, group * tq, head_dim)  # (B, Hkv, g*Tq, D)
    # A matrix product, not einsum's loop: ten times faster at ANDREA's shape, where the judge
    # reads every call's scores. Inputs with infinities or NaN (the contract's tests) make NaN.
    with np.errstate(invalid="ignore", over="ignore"):
        scores = grouped @ np.swapaxes(k, -1, -2)  # (B, Hkv, g*Tq, Tk)
        scores *= scale
    scores = scores.reshape(batch, heads, tq, k.shape[2])  # (B, H, Tq, Tk)
    if case.key_lengths is not None:
        for item, length in enumerate(case.key_lengths):
            scores[item, :, :, length:] = np.nan
    return scores


def _in(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def _shape_regimes(case) -> set[str]:
    if case.tq == 1 and case.tk > 1:
        return {"shape.decode"}
    if case.tq < case.tk:
        return {"shape.tq-below-tk"}
    if case.tq == case.tk:
        return {"shape.tq-equals-tk"}
    return {"shape.tq-above-tk"} if case.causal else set()


def _group_regimes(case) -> set[str]:
    group = case.heads // case.key_value_heads
    drawn = {f"gqa.group-{group}"}
    if case.key_value_heads == 1 and case.heads > 1:
        drawn.add("gqa.one-kv-head")
    if case.page_size is not None and group > 1:
        drawn.add("paged.gqa")
        if group & (group - 1):
            drawn.add("paged.group-not-a-power-of-two")
    return drawn


def _length_regimes(case) -> set[str]:
    if case.key_lengths is None:
        return set()
    lengths = set(case.key_lengths)
    drawn = {
        regime
        for regime, length in (
            ("keys.length-0", 0),
            ("keys.length-1", 1),
            ("keys.capacity", case.tk),
        )
        if length in lengths
    }
    page = case.page_size
    if page is not None and page > 2:  # pages of 1 or 2 put every length on or beside a boundary
        drawn |= {
            regime
            for regime, offset in (
                ("keys.page-minus-1", -1),
                ("keys.page", 0),
                ("keys.page-plus-1", 1),
            )
            if any(n > 0 and (n - offset) % page == 0 and n - offset > 0 for n in lengths)
        }
        if all(n % page for n in lengths if n > 0):
            drawn.add("paged.page-divides-no-length")
    return drawn


def _paging_regimes(case) -> set[str]:
    if case.page_size is None:
        return set()
    drawn = {f"paged.page-{case.page_size}"} if case.page_size in (1, 16) else set()
    if case.tq == 1:
        drawn.add("paged.decode")
    return drawn


def _custom_mask_regimes(case) -> set[str]:
    """Read off the mask the call is given."""
    mask = as_four_dims(case.variant["attn_mask"])
    first_item, first_head = mask[:1], mask[:, :1]
    density = float(mask.mean())
    return {
        regime
        for regime, holds in (
            ("custom-mask.per-item", not np.array_equal(np.broadcast_to(first_item, mask.shape),
                                                        mask)),
            ("custom-mask.per-head", not np.array_equal(np.broadcast_to(first_head, mask.shape),
                                                        mask)),
            ("custom-mask.blind-rows", bool((~mask.any(axis=-1)).any())),
            ("custom-mask.all", bool(mask.all())),
            ("custom-mask.sparse", density <= 0.05),
            ("custom-mask.dense", 0.95 <= density < 1.0),
            ("custom-mask.decode", case.tq == 1),
        )
        if holds
    }  # fmt: skip


def _sparse_regimes(case) -> set[str]:
    """Read off the indices the call is given."""
    indices = case.variant["kv_indices"]
    if case.topk_length is not None:
        past = np.arange(indices.shape[-1]) >= np.asarray(case.topk_length)[:, None, None, None]
        indices = np.where(past, -1, indices)
    _, blind = keys_read_and_blind_rows(case.tq, case.tk, causal=case.causal, heads=case.heads,
                                        **case.formula_variant)  # fmt: skip
    ordered = np.sort(indices, axis=-1)
    repeats = bool(((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any())
    return {
        regime
        for regime, holds in (
            ("sparse.duplicates", repeats),
            ("sparse.empty-slots", bool((indices < 0).any())),
            ("sparse.blind-rows", bool(blind.any())),
            ("sparse.slots-past-tk", indices.shape[-1] > case.tk),
            ("sparse.one-kv-head", case.key_value_heads == 1 and case.heads > 1),
            ("sparse.mla", case.head_dim == 576 and case.value_dim == 512),
            ("sparse.topk-zero", case.topk_length is not None and 0 in case.topk_length),
        )
        if holds
    } | (_sparse_block_regimes(case, indices, repeats) if case.kv_block_size else set())


def _sparse_block_regimes(case, indices, repeats: bool) -> set[str]:
    """Read off the blocks the call lists (``indices``: the slots that count; ``repeats``: a
    row lists one twice) and the keys its rows see."""
    block = case.kv_block_size
    seen = visible_keys(case.tq, case.tk, causal=case.causal, heads=case.heads,
                        **case.formula_variant).any(axis=(1, 2))  # (B, Tk)  # fmt: skip
    lengths = case.key_lengths or ()  # the items' lengths short of Tk, where they are given
    listed = [set(indices[b][indices[b] >= 0].tolist()) for b in range(case.batch)]
    return {
        regime
        for regime, holds in (
            ("sparse-blocks.partial-last-block",
             case.tk % block != 0 and bool(seen[:, case.tk - case.tk % block :].any())),
            ("sparse-blocks.length-inside-block",
             any(n < case.tk and n % block and n // block in listed[b]
                 for b, n in enumerate(lengths))),
            ("sparse-blocks.repeated-block", repeats),
            ("sparse-blocks.block-64", block == 64),
        )
        if holds
    }  # fmt: skip


def _packed_mask_regimes(case) -> set[str]:
    """Read off the blocks and offsets the call is given."""
    drawn = case.variant
    draw, offsets = case.packed_mask, np.asarray(drawn["mask_indptr"])
    sizes = [block.shape for block in draw.blocks(case)]
    needed = np.array([-(-rows * keys // 8) for rows, keys in sizes])
    return {
        regime
        for regime, holds in (
            ("packed-mask.sequences", case.cu_seqlens_q is not None and len(sizes) > 1),
            ("packed-mask.ragged-bits", any(rows * keys % 8 for rows, keys in sizes)),
            ("packed-mask.spare-bytes", bool((np.diff(offsets) > needed).any())),
            ("packed-mask.single-row", any(rows == 1 for rows, _ in sizes)),
        )
        if holds
    }


def _tree_regimes(case) -> set[str]:
    """Read off the tree: a draft's parent is the latest other draft it sees."""
    tree = case.variant["tree_mask"][0]  # (Tq, Tq)
    drafts = tree.shape[-1]
    parents = [max((j for j in range(i) if tree[i, j]), default=-1) for i in range(drafts)]
    children = np.bincount([p for p in parents if p >= 0], minlength=drafts)
    drawn = {"tree.branching"} if (children >= 2).any() else set()
    if np.array_equal(tree, causal_mask(drafts, drafts)):
        drawn.add("tree.chain")
    return drawn


def _mask_regimes(case) -> set[str]:
    drawn = _custom_mask_regimes(case) if case.attn_mask is not None else set()
    if case.tree_mask is not None:
        drawn |= _tree_regimes(case)
    if case.kv_indices is not None:
        drawn |= _sparse_regimes(case)
    if case.packed_mask is not None:
        drawn |= _packed_mask_regimes(case)
    if case.window is not None:
        drawn |= {
            regime
            for regime, holds in (
                ("window.zero", case.window == 0),
                ("window.one", case.window == 1),
                ("window.covers-all", case.window >= case.tk),
            )
            if holds
        }
    if case.chunk is not None:
        if case.chunk == 1:
            drawn.add("chunk.one")
        elif case.tk % case.chunk == 0 and case.chunk < case.tk:
            drawn.add("chunk.divides-tk")
        elif case.tk % case.chunk:
            drawn.add("chunk.does-not-divide-tk")
    grouped_and_padded = case.key_value_heads != case.heads and case.key_lengths is not None
    for modifier in ("softcap", "alibi", "sinks"):
        keyword = "alibi_slopes" if modifier == "alibi" else modifier
        if grouped_and_padded and getattr(case, keyword) is not None:
            drawn.add(f"{modifier}.gqa-key-lengths")
    return drawn


def _row_extremes(case, q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, H, Tq) largest and least scaled score of each row, NaN where a row sees no key; once
    per inputs in a process, since every implementation judged is called on the same inputs
    (hashing q and k as the shared truth does costs a few percent of their scores)."""
    key = f"{inputs_digest(q, k)} {case.scale!r} {case.key_lengths!r}"
    if key in _ROW_EXTREMES:
        _ROW_EXTREMES.move_to_end(key)
        return _ROW_EXTREMES[key]
    scores = _scaled_scores(case, q, k)
    # fmax and fmin pass over NaN: a row's largest and least seen score, NaN where it sees none
    extremes = np.fmax.reduce(scores, axis=-1), np.fmin.reduce(scores, axis=-1)  # (B, H, Tq) x 2
    for extreme in extremes:
        extreme.setflags(write=False)  # shared by every later call on these inputs
    _ROW_EXTREMES[key] = extremes
    while len(_ROW_EXTREMES) > MOST_REMEMBERED:
        _ROW_EXTREMES.popitem(last=False)
    return extremes


def _score_regimes(case, q: np.ndarray, k: np.ndarray) -> set[str]:
    if q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] > MOST_SCORES or 0 in q.shape + k.shape:
        return set()
    row_max, row_min = _row_extremes(case, q, k)
    if np.isnan(row_max).all():
        return set()
    drawn = set()
    if max(np.nanmax(row_max), -np.nanmin(row_min)) < 1.0:  # max |score| < 1
        drawn.add("scores.near-zero")
    if np.nanmax(row_min) > FAR_ABOVE:
        drawn.add("scores.far-above-zero")
    if np.nanmin(row_max) < FAR_BELOW:
        drawn.add("scores.far-below-zero")
    if case.return_lse:
        # a row's lse lies within log(Tk) of its largest score
        if any(_in(m, LSE_NEAR_1000) for m in row_max.ravel()):
            drawn.add("lse.near-plus-1000")
        if any(_in(-m, LSE_NEAR_1000) for m in row_max.ravel()):
            drawn.add("lse.near-minus-1000")
    if case.sinks is not None:
        for head, sink in enumerate(case.sinks):
            if sink == -math.inf:
                drawn.add("sinks.minus-inf")
                continue
            head_max = row_max[:, head]
            if np.isnan(head_max).all():
                continue
            if sink > np.nanmax(head_max) + SINK_FAR:
                drawn.add("sinks.far-above-scores")
            if sink < np.nanmin(head_max) - SINK_FAR:
                drawn.add("sinks.far-below-scores")
    return drawn


def regimes_of_call(case, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> set[str]:
    """The regimes one attention call draws: ``case`` as called, q, k, v its float64 inputs;
    and the kernel's independent choices it makes (choices_of_call)."""
    return (
        _shape_regimes(case)
        | _group_regimes(case)
        | _length_regimes(case)
        | _paging_regimes(case)
        | _mask_regimes(case)
        | _score_regimes(case, q, k)
        | choices_of_call(case)
    )


def choices_of_call(case, direction: str = "forward") -> set[str]:
    """The choices a kernel makes independently of each other that one call of ``case`` draws,
    as ``choice.AXIS.VALUE``: forward or backward, Tq against Tk, k's and v's heads against q's,
    the dtype, one layout for all operands or one of their own each, the keywords it sets
    together.
    A claim whose tests draw one value of an axis never varies that choice (docs/regimes.md)."""
    tq, tk = case.tq, case.tk
    length = "tq-equals-tk" if tq == tk else "tq-below-tk" if tq < tk else "tq-above-tk"
    heads = "grouped" if case.key_value_heads != case.heads else "equal"
    layout = f"shared-{case.layout}" if case.layout in LAYOUTS else "own"
    drawn = {
        f"choice.direction.{direction}",
        f"choice.lengths.{length}",
        f"choice.heads.{heads}",
        f"choice.dtype.{case.dtype}",
        f"choice.keywords.{'+'.join(sorted(case.formula_variant)) or 'none'}",
        f"choice.layout.{layout}",
    }
    if case.page_size is not None:
        drawn.add("choice.keywords.paged")
    return drawn


def regimes_of_backward(case, q: np.ndarray, k: np.ndarray) -> set[str]:
    """The backward's regimes (spec.regimes.BACKWARD_REGIMES) one vjp call of ``case`` draws."""
    tk = case.tk
    lengths = {tk} | set(case.key_lengths or ())
    if case.cu_seqlens_k is not None:
        lengths = set(np.diff(case.cu_seqlens_k).tolist())
    drawn = set()
    if any(n > 64 and n % 64 for n in lengths):
        drawn.add("backward.partial-last-tile")
    if tk >= 1023:
        drawn.add("backward.long")
    _, blind = keys_read_and_blind_rows(case.tq, tk, causal=case.causal, heads=case.heads,
                                        **case.formula_variant)  # fmt: skip
    if blind.any():
        drawn.add("backward.blind-rows")
    if case.batch >= 2:
        drawn.add("backward.distinct-items")
    group = case.heads // case.key_value_heads
    if group in (3, 7):
        drawn.add(f"backward.group-{group}")
    if not case.causal:
        drawn.add("backward.non-causal")
    if case.window is not None and case.window < tk:
        drawn.add("backward.window")
    if case.cu_seqlens_q is not None:
        bounds = list(zip(np.diff(case.cu_seqlens_q), np.diff(case.cu_seqlens_k), strict=True))
        if (1, 1) in [tuple(int(x) for x in b) for b in bounds]:
            drawn.add("backward.packed-length-1")
        starts_and_ends = itertools.pairwise(case.cu_seqlens_k)
        if any(a % 64 and a // 64 != (b - 1) // 64 for a, b in starts_and_ends):
            drawn.add("backward.packed-crosses-tile")
    with np.errstate(invalid="ignore"):
        if np.nanmax(np.abs(_scaled_scores(case, q, k)), initial=0.0) >= FAR_SCORES:
            drawn.add("backward.far-scores")
    return drawn


def regimes_of_merge(lses: np.ndarray) -> set[str]:
    """The regimes one merge draws: ``lses`` (P, B, H, Tq), its parts' log-sum-exps."""
    finite = np.isfinite(lses)
    seen_by_some = finite.any(0)
    drawn = set()
    if (~finite.all(0) & seen_by_some).any():
        drawn.add("merge.empty-part")
    if (~seen_by_some).any():
        drawn.add("merge.row-no-part-saw")
    values = lses[finite]
    if ((values >= LSE_NEAR_1000[0]) & (values <= LSE_NEAR_1000[1])).any():
        drawn.add("lse.near-plus-1000")
    if ((-values >= LSE_NEAR_1000[0]) & (-values <= LSE_NEAR_1000[1])).any():
        drawn.add("lse.near-minus-1000")
    return drawn
