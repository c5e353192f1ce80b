"""Extensions, custom masks: a boolean attn_mask, True where a query may see a key, intersected
with the causal mask, a window and key lengths (MASK-CUSTOM, MASK-CUSTOM-INVARIANT,
MASK-CUSTOM-AS-CAUSAL), and speculative decoding's draft trees (MASK-TREE)."""

from __future__ import annotations

import pytest

from conformance.judge.assertions import (
    assert_identical,
    assert_matches_oracle,
    assert_output_and_empty_rows,
    blind_rows_of,
)
from conformance.judge.harness import Case
from conformance.judge.mask_draws import MaskDraw, PackedMaskDraw, TreeDraw
from conformance.judge.truth import CaseTruth

CUSTOM_CASES = {
    # a mask per item, causal and not: a kernel that reads item 0's mask for every item fails
    "per-item": Case(batch=2, heads=2, tq=70, head_dim=16, attn_mask=MaskDraw(0.3, seed=1)),
    "per-item non-causal": Case(
        batch=2,
        heads=2,
        tq=40,
        tk=70,
        head_dim=16,
        causal=False,
        attn_mask=MaskDraw(0.5, seed=2),
    ),
    # a mask per head, over grouped heads: head h's mask is not its kv head's
    "per-head grouped": Case(
        batch=1,
        heads=4,
        kv_heads=2,
        tq=64,
        head_dim=16,
        causal=False,
        attn_mask=MaskDraw(0.2, per_item=False, per_head=True, seed=3),
    ),
    # nearly nothing seen: many rows see one key or none
    "1%": Case(
        batch=2,
        heads=2,
        tq=48,
        tk=96,
        head_dim=16,
        causal=False,
        attn_mask=MaskDraw(0.01, per_head=True, seed=4),
    ),
    "99%": Case(
        batch=1, heads=2, tq=80, head_dim=16, attn_mask=MaskDraw(0.99, per_item=False, seed=5)
    ),
    # all true, without causal: plain non-causal attention
    "all": Case(
        batch=1,
        heads=2,
        tq=33,
        tk=65,
        head_dim=16,
        causal=False,
        attn_mask=MaskDraw(pattern="all", per_item=False),
    ),
    # rows that see nothing, in every item and head
    "blind rows": Case(
        batch=2, heads=2, tq=40, head_dim=16, attn_mask=MaskDraw(0.5, blind_rows=5, seed=6)
    ),
    # decoding: one query against a cache
    "decode": Case(
        batch=2, heads=2, tq=1, tk=90, head_dim=32, attn_mask=MaskDraw(0.4, per_head=True, seed=7)
    ),
    # with a window and with key lengths: the mask is intersected with them
    "window Tq<Tk": Case(
        batch=1, heads=2, tq=7, tk=48, head_dim=16, window=12, attn_mask=MaskDraw(0.6, seed=8)
    ),
    "key lengths": Case(
        batch=2,
        heads=2,
        tq=5,
        tk=90,
        head_dim=16,
        key_lengths=(90, 41),
        attn_mask=MaskDraw(0.5, seed=9),
    ),
}


@pytest.mark.claim("MASK-CUSTOM")
@pytest.mark.parametrize("case", list(CUSTOM_CASES.values()), ids=list(CUSTOM_CASES))
def test_each_row_sees_the_keys_its_mask_marks(subject, dtype, case):
    # Fresh allocations read as NaN: rows left unwritten show, whatever the convention.
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case, spread=1.5)
    out = subject.call(case, q, k, v)
    assert_output_and_empty_rows(subject, case, out, q, k, v, blind_rows_of(case))


@pytest.mark.claim("MASK-TREE")
@pytest.mark.parametrize("tree", ["chain", "star", "binary"])
def test_each_draft_sees_the_cache_and_its_ancestors(subject, dtype, tree):
    # 15 drafts (a full binary tree of depth 4) verified against a cache of 100 tokens
    case = subject.fit(Case(batch=2, heads=2, tq=15, tk=115, head_dim=32, dtype=dtype,
                            tree_mask=TreeDraw(tree)))  # fmt: skip
    q, k, v = subject.inputs(case, spread=1.5)
    assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("MASK-CUSTOM-INVARIANT")
@pytest.mark.parametrize(
    "case",
    [
        Case(batch=2, heads=2, tq=70, head_dim=16, attn_mask=MaskDraw(0.5, hidden_keys=9, seed=11)),
        Case(
            batch=1,
            heads=4,
            kv_heads=2,
            tq=40,
            tk=100,
            head_dim=16,
            causal=False,
            attn_mask=MaskDraw(0.3, per_head=True, hidden_keys=20, seed=12),
        ),
    ],
    ids=["causal", "non-causal grouped"],
)
def test_keys_the_mask_hides_have_no_influence(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    mask = case.variant["attn_mask"]
    hidden = ~mask.any(axis=(0, 1, 2))  # (Tk,): keys no row of any item or head sees
    assert hidden.any(), f"{case.describe()} hides no key from every row"
    clean = subject.call(case, q, k, v)
    fresh = subject.inputs(case, spread=3.0)  # other finite values for the same places
    changed_k, changed_v = k.copy(), v.copy()
    changed_k[..., hidden, :] = fresh[1][..., hidden, :]
    changed_v[..., hidden, :] = fresh[2][..., hidden, :]
    # Bit for bit: the same shape and call, only keys no row reads changed.
    assert_identical(
        subject,
        case,
        f"out with the keys and values at the {int(hidden.sum())} keys the mask hides changed",
        subject.call(case, q, changed_k, changed_v),
        clean,
    )


@pytest.mark.claim("MASK-CUSTOM-AS-CAUSAL")
@pytest.mark.parametrize(
    "case",
    [
        Case(batch=2, heads=2, tq=70, head_dim=16),
        Case(batch=1, heads=2, tq=9, tk=77, head_dim=32),  # chunked prefill: Tq < Tk
    ],
    ids=["prefill", "Tq<Tk"],
)
def test_the_causal_mask_given_as_a_mask_is_causal_attention(subject, dtype, case):
    causal = subject.fit(case.with_(dtype=dtype))
    as_mask = causal.with_(causal=False, attn_mask=MaskDraw(pattern="causal", per_item=False))
    subject.require(as_mask)
    q, k, v = subject.inputs(causal)
    before = subject.call(causal, q, k, v)
    # Judged against the causal call's truth: the two calls see the same keys.
    assert_matches_oracle(
        subject, as_mask, subject.call(as_mask, q, k, v), q, k, v,
        truth=CaseTruth(q, k, v).attention(causal=True, scale=causal.scale),
    )  # fmt: skip
    # Another mask of the same shape, then the causal call again: a mask buffer kept from an
    # earlier call (FlashInfer PR #1028) shows here, where the causal pattern itself would not.
    other = causal.with_(attn_mask=MaskDraw(0.5, per_item=False, own_key=True, seed=51))
    subject.call(other, q, k, v)
    assert_identical(
        subject,
        causal,
        "out of the causal call after two masked calls, against the same call before them",
        subject.call(causal, q, k, v),
        before,
    )


PACKED_CASES = {
    # three sequences, one of them a single query row: FlashInfer's batch prefill
    "sequences": Case(
        heads=4, kv_heads=2, tq=60, tk=110, head_dim=16, cu_seqlens_q=(0, 25, 26, 60),
        cu_seqlens_k=(0, 40, 70, 110), packed_mask=PackedMaskDraw(MaskDraw(0.4, seed=21)),
    ),
    # blocks whose bits do not end on a byte, bytes of ones between blocks, rows that see nothing
    "spare bytes": Case(
        heads=2, tq=31, tk=47, head_dim=16, causal=False, cu_seqlens_q=(0, 13, 31),
        cu_seqlens_k=(0, 21, 47),
        packed_mask=PackedMaskDraw(MaskDraw(0.5, blind_rows=3, seed=22), spare=3),
    ),
    # no packed sequences: one block per batch item, self-attention
    "per item": Case(
        batch=2, heads=2, tq=37, head_dim=16,
        packed_mask=PackedMaskDraw(MaskDraw(0.6, seed=23)),
    ),
}  # fmt: skip


@pytest.mark.claim("MASK-PACKED")
@pytest.mark.parametrize("case", list(PACKED_CASES.values()), ids=list(PACKED_CASES))
def test_each_row_sees_the_keys_its_packed_bits_mark(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case, spread=1.5)
    out = subject.call(case, q, k, v)
    assert_output_and_empty_rows(subject, case, out, q, k, v, blind_rows_of(case))
