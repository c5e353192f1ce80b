"""The regimes each extension claim must be checked in: where real kernels broke, and where a
kernel's special cases live.

A feature tested only in the regimes its author thought of lets through the bugs reported in
serving kernels: a running maximum started at a finite sentinel (FlashInfer #4450) passes every
test whose scores are moderate; a merge that weighs an empty part correctly but returns NaN for a
row every part left empty (FlashInfer PR #4975) passes every merge with one part seen; a paged
decode wrong at 28 query heads over 4 (FlashInfer #2896) passes every group that is a power of
two. Each regime below is a property of one call (or one merge), which the judge reads off the
call itself (``conformance.judge.regimes``), so that which tests draw it is measured, not
declared: ``docs/regimes.md`` is generated from a run, and a test fails when a regime of this
table is drawn by no test of its claims.
"""

from __future__ import annotations

from dataclasses import dataclass

# A score below every finite sentinel a kernel has been seen to start its running maximum at
# (FlashInfer's -5e4), with room: a row whose every visible score lies below it computes exactly
# what the rows of moderate scores compute, shifted.
FAR_BELOW = -1.0e5
# Above log(float64's largest): exp of such a score overflows in any precision unless the row's
# maximum is subtracted first.
FAR_ABOVE = 1.0e3
# A merge's or a row's log-sum-exp this far from zero costs |lse| * u in every exponent a kernel
# converts between bases (docs/tolerance.md, LSE-MERGE's floor).
LSE_NEAR_1000 = (500.0, 2000.0)
# Scores this large make a backward's exponentials and a softcap's dtanh work at their edge.
FAR_SCORES = 20.0
# A sink this far from a row's scores outweighs them (or vanishes beside them) by exp(30) = 1e13.
SINK_FAR = 30.0


@dataclass(frozen=True)
class Regime:
    id: str  # stable: tests, docs/regimes.md and attnspec explain name it
    feature: str  # the feature of spec.features (or "scores", "shape") whose special case it is
    claims: tuple[str, ...]  # a test of one of these must draw it
    what: str  # the property of the call, in words
    why: str  # where a kernel breaks in it


def _groups(sizes: tuple[int, ...]) -> tuple[Regime, ...]:
    return tuple(
        Regime(
            f"gqa.group-{g}",
            "gqa",
            ("GQA-GROUPS",),
            f"{g} query heads per key/value head",
            "a group that is not a power of two breaks kernels that shift instead of divide"
            if g in (3, 7)
            else "the grouping's edge cases: no grouping, the smallest, the widest tile",
        )
        for g in sizes
    )


REGIMES: tuple[Regime, ...] = (
    *_groups((1, 2, 3, 7, 8)),
    Regime(
        "gqa.one-kv-head",
        "gqa",
        ("GQA-MQA",),
        "Hkv = 1 under several query heads (multi-query attention)",
        "a kernel that indexes key/value heads by h % Hkv rather than h // g still passes here",
    ),
    Regime(
        "shape.decode",
        "shape",
        ("OUT-FORMULA", "PAD-KEYS", "PAGED-KV"),
        "Tq = 1 against several keys (a decoding step)",
        "decode kernels are separate code paths (split-K, one row per block)",
    ),
    Regime(
        "shape.tq-below-tk",
        "shape",
        ("OUT-FORMULA", "PAD-KEYS", "PAGED-KV"),
        "1 < Tq < Tk (a chunk of prefill after a cache)",
        "bottom-right alignment: top-left kernels are right only when Tq = Tk",
    ),
    Regime(
        "shape.tq-equals-tk",
        "shape",
        ("OUT-FORMULA", "PAD-KEYS", "PAGED-KV"),
        "Tq = Tk (prefill)",
        "the square case every kernel is written for first",
    ),
    Regime(
        "shape.tq-above-tk",
        "shape",
        ("CONTRACT-ERRORS",),
        "Tq > Tk, causal: the first Tq - Tk rows see no key (a convention: raise, or fill them)",
        "rows that see no key: 0/0 in the normalisation",
    ),
    Regime(
        "keys.length-0",
        "key_lengths",
        ("EMPTY-KV", "PAGED-KV"),
        "an item with key length 0",
        "a row with no key: the running maximum stays -inf and the sum 0",
    ),
    Regime(
        "keys.length-1",
        "key_lengths",
        ("PAD-KEYS", "PAGED-KV"),
        "an item with key length 1",
        "one key: every weight is exactly 1, and a split-K decode has one empty split per split",
    ),
    Regime(
        "keys.capacity",
        "key_lengths",
        ("PAD-KEYS", "PAGED-KV"),
        "an item whose key length is the whole buffer (Tk, or every page of its table)",
        "an off-by-one past the last valid key reads beyond the buffer",
    ),
    Regime(
        "keys.page-minus-1",
        "paged",
        ("PAGED-KV",),
        "a paged item whose key length is one short of a page boundary",
        "the last page is read as full, or as empty",
    ),
    Regime(
        "keys.page",
        "paged",
        ("PAGED-KV",),
        "a paged item whose key length ends exactly on a page boundary",
        "FlashInfer's kv_last_page_len is then the page size, not 0",
    ),
    Regime(
        "keys.page-plus-1",
        "paged",
        ("PAGED-KV",),
        "a paged item whose key length is one past a page boundary",
        "a last page holding a single key",
    ),
    Regime(
        "paged.page-1",
        "paged",
        ("PAGED-KV",),
        "pages of one key",
        "every key through the block table: the table's indexing alone",
    ),
    Regime(
        "paged.page-16",
        "paged",
        ("PAGED-KV",),
        "pages of 16 keys (vLLM's default)",
        "the size serving kernels are tuned and specialised for",
    ),
    Regime(
        "paged.page-divides-no-length",
        "paged",
        ("PAGED-KV",),
        "a page size that divides none of the call's non-zero key lengths",
        "every item's last page is part full",
    ),
    Regime(
        "paged.gqa",
        "paged",
        ("PAGED-KV",),
        "a paged call with grouped heads (paged x GQA)",
        "FlashInfer #2896: tensor-core paged decode wrong at 28 query heads over 4",
    ),
    Regime(
        "paged.group-not-a-power-of-two",
        "paged",
        ("PAGED-KV",),
        "a paged call whose group is not a power of two (3, 7)",
        "FlashInfer #2896: a group rounded to a power of two on the paged path alone",
    ),
    Regime(
        "paged.decode",
        "paged",
        ("PAGED-KV",),
        "a paged call with Tq = 1 (paged x decode)",
        "the paged decode kernel is the one serving runs most",
    ),
    Regime(
        "scores.near-zero",
        "scores",
        ("SOFTMAX-STABLE", "OUT-FORMULA"),
        "every scaled score of the call within (-1, 1)",
        "near-uniform weights: errors in the normalisation show undiluted",
    ),
    Regime(
        "scores.far-above-zero",
        "scores",
        ("SOFTMAX-STABLE",),
        f"a row whose every scaled score exceeds {FAR_ABOVE:g}",
        "exp overflows in any precision unless the row's maximum is subtracted",
    ),
    Regime(
        "scores.far-below-zero",
        "scores",
        ("SOFTMAX-STABLE",),
        f"a row whose every scaled score lies below {FAR_BELOW:g}, beyond any finite sentinel",
        "FlashInfer #4450: a running maximum started at -5e4 returns 0 for such rows",
    ),
    Regime(
        "lse.near-plus-1000",
        "lse",
        ("LSE-VALUE", "LSE-MERGE"),
        "a row's log-sum-exp, or a merged part's, between +500 and +2000",
        "base conversions cost |lse| * u in every exponent",
    ),
    Regime(
        "lse.near-minus-1000",
        "lse",
        ("LSE-VALUE", "LSE-MERGE"),
        "a row's log-sum-exp, or a merged part's, between -2000 and -500",
        "base conversions cost |lse| * u in every exponent",
    ),
    Regime(
        "merge.empty-part",
        "lse",
        ("LSE-MERGE",),
        "a merge where a part saw no key of a row (its lse -inf) and another did",
        "an empty part must weigh nothing, not NaN",
    ),
    Regime(
        "merge.row-no-part-saw",
        "lse",
        ("LSE-MERGE",),
        "a merge of a row every part left empty (every lse -inf)",
        "FlashInfer PR #4975: -inf - (-inf) is NaN; the contract says 0 with lse -inf",
    ),
    Regime(
        "sinks.far-above-scores",
        "sinks",
        ("SINK-LOGIT",),
        f"a sink more than {SINK_FAR:g} above its head's every score",
        "the sink takes the row's weight: the running maximum must include it",
    ),
    Regime(
        "sinks.far-below-scores",
        "sinks",
        ("SINK-LOGIT",),
        f"a sink more than {SINK_FAR:g} below its head's scores",
        "the sink vanishes: a kernel that adds it to the maximum instead still passes elsewhere",
    ),
    Regime(
        "sinks.minus-inf",
        "sinks",
        ("SINK-LOGIT",),
        "a sink of -inf (no sink for that head)",
        "exp(-inf - max) must be 0, and -inf must not become the row's maximum",
    ),
    Regime(
        "window.zero",
        "window",
        ("WINDOW-BOUNDS",),
        "a window of 0 (each query sees its own key alone)",
        "window 0 read as no window",
    ),
    Regime(
        "window.one",
        "window",
        ("WINDOW-BOUNDS",),
        "a window of 1",
        "an off-by-one in the window's left edge",
    ),
    Regime(
        "window.covers-all",
        "window",
        ("WINDOW-BOUNDS",),
        "a window at least Tk (the window masks nothing)",
        "a window that wraps or clips at the buffer's start",
    ),
    *(
        Regime(f"custom-mask.{name}", "custom_mask", ("MASK-CUSTOM",), what, why)
        for name, what, why in (
            (
                "per-item",
                "a mask that differs between batch items",
                "a mask pointer not advanced by the batch stride",
            ),
            (
                "per-head",
                "a mask that differs between query heads",
                "a per-head mask read through the key/value head, or broadcast from head 0",
            ),
            (
                "blind-rows",
                "rows the mask leaves no key at all",
                "0 / 0 in the softmax: NaN where the declared convention is zeros",
            ),
            (
                "all",
                "a mask of every key",
                "an all-true mask taken as no mask and the causal mask dropped with it",
            ),
            (
                "sparse",
                "a mask of at most 5 % of the keys",
                "tiles skipped wrongly where most of them hold no visible key",
            ),
            (
                "dense",
                "a mask of at least 95 % of the keys",
                "a mask read as its complement hides almost everything: the error shows",
            ),
            (
                "decode",
                "one query row against a cache, under a mask",
                "a decoding path that ignores the mask for its single row",
            ),
        )
    ),
    *(
        Regime(f"packed-mask.{name}", "packed_mask", ("MASK-PACKED",), what, why)
        for name, what, why in (
            (
                "sequences",
                "blocks of several packed sequences of different lengths",
                "every block but the first read from the wrong offset (offsets left in bits)",
            ),
            (
                "ragged-bits",
                "a block whose bits do not end on a byte",
                "a row's bits taken from a block rounded to bytes per row, not per block",
            ),
            (
                "spare-bytes",
                "bytes between blocks that no block's bits are in",
                "offsets computed from the shapes rather than read from mask_indptr",
            ),
            (
                "single-row",
                "a sequence of one query row",
                "a decoding row whose block is read as the next sequence's",
            ),
        )
    ),
    Regime(
        "tree.chain",
        "tree_mask",
        ("MASK-TREE",),
        "a chain of drafts (the tree is causal attention)",
        "a tree kernel that is right only where the tree is the causal mask",
    ),
    Regime(
        "tree.branching",
        "tree_mask",
        ("MASK-TREE",),
        "a draft with two children or more",
        "siblings seeing each other: a tree read as a chain",
    ),
    *(
        Regime(f"sparse.{name}", "sparse", claims, what, why)
        for name, claims, what, why in (
            (
                "duplicates",
                ("SPARSE-KEYS", "GRAD-SPARSE"),
                "a key listed twice in a row",
                "a softmax over the slots, not the keys: the key weighs twice",
            ),
            (
                "empty-slots",
                ("SPARSE-KEYS", "GRAD-SPARSE"),
                "empty slots (-1) among a row's",
                "-1 converted to 0, or wrapped to the last key",
            ),
            (
                "blind-rows",
                ("SPARSE-KEYS",),
                "rows that list no key they may see",
                "0 / 0 where the convention is zeros",
            ),
            (
                "slots-past-tk",
                ("SPARSE-KEYS",),
                "more slots per row than keys",
                "a K larger than Tk sized by K alone",
            ),
            (
                "one-kv-head",
                ("SPARSE-KEYS", "GRAD-SPARSE"),
                "one key/value head for every query head, as MLA's absorbed form",
                "a row's list read through the query head's index",
            ),
            (
                "mla",
                ("SPARSE-KEYS",),
                "MLA's absorbed shapes: D = 576, Dv = 512",
                "a head dim that is no power of two, and Dv != D",
            ),
            (
                "topk-zero",
                ("SPARSE-TOPK",),
                "a topk_length of 0: no slot counts",
                "a row with no key left unwritten or NaN",
            ),
        )
    ),
    *(
        Regime(f"sparse-blocks.{name}", "sparse_blocks", claims, what, why)
        for name, claims, what, why in (
            (
                "partial-last-block",
                ("SPARSE-BLOCKS", "GRAD-SPARSE"),
                "a row sees keys of a last block that holds fewer than kv_block_size",
                "only whole blocks read (Tk // b of them): the partial block dropped",
            ),
            (
                "length-inside-block",
                ("SPARSE-BLOCKS",),
                "an item's key length ends inside a block a row lists",
                "a listed block read whole, past the item's keys into its padding",
            ),
            (
                "repeated-block",
                ("SPARSE-BLOCKS", "GRAD-SPARSE"),
                "a block listed twice in a row",
                "each of its keys weighs twice under a set's convention",
            ),
            (
                "block-64",
                ("SPARSE-BLOCKS",),
                "blocks of 64 keys, native sparse attention's default",
                "a kernel right only at the block size it was written for",
            ),
        )
    ),
    Regime(
        "chunk.one",
        "chunked",
        ("CHUNKED-LOCAL",),
        "chunks of one key",
        "each query sees its own key alone",
    ),
    Regime(
        "chunk.divides-tk",
        "chunked",
        ("CHUNKED-LOCAL",),
        "a chunk of more than one key that divides Tk",
        "the chunks' boundaries fall on the buffer's",
    ),
    Regime(
        "chunk.does-not-divide-tk",
        "chunked",
        ("CHUNKED-LOCAL",),
        "a chunk that does not divide Tk",
        "a last chunk part full; chunks counted from the wrong end",
    ),
    *(
        Regime(
            f"{modifier}.gqa-key-lengths",
            modifier,
            (claim,),
            f"{modifier} with grouped heads and key lengths together",
            "a per-head parameter indexed by the key/value head, or a position by the padding",
        )
        for modifier, claim in (
            ("softcap", "SOFTCAP"),
            ("alibi", "ALIBI"),
            ("sinks", "SINK-LOGIT"),
        )
    ),
)

# The backward's: where training kernels' gradients broke. Each is read off a backward call
# (conformance.judge.regimes.regimes_of_backward), and a gradient claim's test must draw it.
BACKWARD_REGIMES: tuple[Regime, ...] = (
    Regime(
        "backward.partial-last-tile",
        "shape",
        ("OUT-GRAD", "GRAD-PADDING", "GRAD-PACKED"),
        "keys not a multiple of 64 or 128 and more than 64 (FlashAttention's 113, 203, 1023)",
        "a backward whose key loop covers whole tiles only gives the last keys no dk or dv "
        "(FlashAttention #334)",
    ),
    Regime(
        "backward.long",
        "shape",
        ("OUT-GRAD",),
        "1023 keys: many tiles of dq accumulated",
        "dq summed over many key tiles, where an atomic or a split accumulation drifts",
    ),
    Regime(
        "backward.blind-rows",
        "shape",
        ("GRAD-PADDING",),
        "rows that see no key (an item's key length of 0)",
        "exp(s - lse) at lse = -inf gives NaN where the gradient is 0 (FlashAttention #443)",
    ),
    Regime(
        "backward.distinct-items",
        "shape",
        ("OUT-GRAD", "GRAD-GQA"),
        "a batch of two or more distinct items",
        "a gradient right for item 0 only, from a batch stride left out",
    ),
    *(
        Regime(
            f"backward.group-{g}",
            "gqa",
            ("GRAD-GQA",),
            f"{g} query heads per key/value head in the backward",
            "dk and dv summed over a group split with the wrong count (cudnn-frontend #384)",
        )
        for g in (3, 7)
    ),
    Regime(
        "backward.non-causal",
        "shape",
        ("OUT-GRAD",),
        "the backward without the causal mask",
        "a backward that masks causally whatever it is told",
    ),
    Regime(
        "backward.window",
        "window",
        ("GRAD-WINDOW",),
        "a window narrower than the keys, in the backward",
        "the backward's mask not the forward's (meta-pytorch/MSLK PR #263)",
    ),
    Regime(
        "backward.packed-length-1",
        "packed",
        ("GRAD-PACKED",),
        "a packed sequence of one query and one key",
        "varlen offsets off by one at the shortest sequence",
    ),
    Regime(
        "backward.packed-crosses-tile",
        "packed",
        ("GRAD-PACKED",),
        "a packed sequence that starts inside one tile of 64 and ends in another",
        "the backward's tiles reading across a sequence boundary (FlashAttention PRs #2337, #2333)",
    ),
    Regime(
        "backward.far-scores",
        "scores",
        ("OUT-GRAD", "GRAD-SOFTCAP"),
        f"scores of size {FAR_SCORES:g} or more",
        "exp overflow or dtanh's cancellation where scores are far from zero (FlashAttention's "
        "bwd_overflow)",
    ),
)

REGIMES = (*REGIMES, *BACKWARD_REGIMES)
REGIME_IDS = tuple(regime.id for regime in REGIMES)


def regimes_of_claim(claim: str) -> tuple[Regime, ...]:
    return tuple(regime for regime in REGIMES if claim in regime.claims)
