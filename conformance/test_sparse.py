"""Extensions, index-sparse attention: kv_indices (B, Hkv, Tq, K), the keys each query row of a
key/value head sees, -1 an empty slot, intersected with the causal mask; topk_length; indices
that name blocks of keys (SPARSE-KEYS, SPARSE-INVARIANT, SPARSE-TOPK, SPARSE-BLOCKS)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conformance.bench.shapes import MLA_SCALE
from conformance.judge.assertions import (
    assert_identical,
    assert_output_and_empty_rows,
    blind_rows_of,
)
from conformance.judge.harness import Case
from conformance.judge.mask_draws import IndexDraw
from spec.masks import visible_keys

SPARSE_CASES = {
    # grouped heads, some slots empty, some keys listed twice
    "prefill": Case(
        batch=2,
        heads=4,
        kv_heads=2,
        tq=70,
        head_dim=16,
        kv_indices=IndexDraw(keys=24, empty=0.2, duplicates=3, seed=1),
    ),
    "non-causal": Case(
        batch=1,
        heads=2,
        tq=40,
        tk=100,
        head_dim=16,
        causal=False,
        kv_indices=IndexDraw(keys=16, empty=0.1, duplicates=2, dtype="int64", seed=2),
    ),
    # rows that list nothing they may see
    "blind rows": Case(
        batch=2, heads=2, tq=33, head_dim=16, kv_indices=IndexDraw(keys=8, blind_rows=4, seed=3)
    ),
    # more slots than keys: every key listed, the rest empty
    "K>Tk": Case(batch=1, heads=2, tq=20, head_dim=16, kv_indices=IndexDraw(keys=32, seed=4)),
    "key lengths": Case(
        batch=2,
        heads=2,
        tq=5,
        tk=90,
        head_dim=16,
        key_lengths=(90, 41),
        kv_indices=IndexDraw(keys=16, empty=0.1, seed=5),
    ),
    # MLA's absorbed form, decoding two tokens (multi-token prediction) against a cache
    "mla-decode": Case(
        batch=2,
        heads=16,
        kv_heads=1,
        tq=2,
        tk=300,
        head_dim=576,
        value_dim=512,
        scale=MLA_SCALE,
        kv_indices=IndexDraw(keys=64, empty=0.05, duplicates=2, seed=6),
    ),
}


BLOCK_CASES = {
    # 100 keys in blocks of 32: the last block holds 4; grouped heads, a block listed twice
    "prefill": Case(
        batch=2,
        heads=4,
        kv_heads=2,
        tq=100,
        head_dim=16,
        kv_block_size=32,
        kv_indices=IndexDraw(keys=3, empty=0.2, duplicates=1, seed=21),
    ),
    # an item's key length ends inside a block: the block's keys past it are padding
    "key lengths": Case(
        batch=2,
        heads=2,
        tq=6,
        tk=128,
        head_dim=16,
        key_lengths=(128, 77),
        kv_block_size=32,
        kv_indices=IndexDraw(keys=2, seed=22),
    ),
    # native sparse attention's decoding: blocks of 64 over 300 cached keys (the last holds 44)
    "mla-decode": Case(
        batch=2,
        heads=16,
        kv_heads=1,
        tq=2,
        tk=300,
        head_dim=576,
        value_dim=512,
        scale=MLA_SCALE,
        kv_block_size=64,
        kv_indices=IndexDraw(keys=3, empty=0.1, seed=23),
    ),
}


def claimed(claim: str, cases: dict[str, Case], prefix: str = "") -> list:
    """The cases as parameters of a test, each held to ``claim``."""
    return [pytest.param(case, marks=pytest.mark.claim(claim), id=prefix + name)
            for name, case in cases.items()]  # fmt: skip


def mla_values(case: Case, k):
    """MLA's v: the first Dv columns of its latent k (the rotary part past them is k's alone)."""
    if case.kv_heads == 1 and case.head_dim == 576 and case.value_dim == 512:
        return k[..., :512].copy()
    return None


def assert_sparse_output(subject, case: Case, out, q, k, v) -> None:
    """Rows that see no key hold the declared convention, the others the truth."""
    __tracebackhide__ = True
    assert_output_and_empty_rows(subject, case, out, q, k, v, blind_rows_of(case))


@pytest.mark.parametrize(
    "case",
    [*claimed("SPARSE-KEYS", SPARSE_CASES), *claimed("SPARSE-BLOCKS", BLOCK_CASES, "blocks-")],
)
def test_each_row_sees_the_keys_it_lists(subject, dtype, case):
    # Fresh allocations read as NaN: rows left unwritten show, whatever the convention.
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case, spread=1.5)
    v = mla_values(case, k) if mla_values(case, k) is not None else v
    assert_sparse_output(subject, case, subject.call(case, q, k, v), q, k, v)


def with_unlisted(cases: dict[str, Case], names: tuple[str, ...], unlisted: int) -> dict:
    """The cases named, ``unlisted`` keys (or blocks) listed by no row."""
    return {name: cases[name].with_(kv_indices=replace(cases[name].kv_indices,
                                                       unlisted_keys=unlisted))
            for name in names}  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        *claimed("SPARSE-INVARIANT", with_unlisted(SPARSE_CASES, ("prefill", "non-causal"), 11)),
        *claimed("SPARSE-BLOCKS", with_unlisted(BLOCK_CASES, ("prefill",), 1), "blocks-"),
    ],
)
def test_keys_no_row_lists_have_no_influence(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    listed = visible_keys(case.tq, case.tk, causal=False, heads=case.heads,
                          **case.formula_variant).any(axis=(1, 2))  # (B, Tk)  # fmt: skip
    unlisted = ~listed
    assert unlisted.any(), f"{case.describe()} lists every key"
    clean = subject.call(case, q, k, v)
    fresh = subject.inputs(case, spread=3.0)  # other finite values for the same places
    where = unlisted[:, None, :, None]
    changed_k, changed_v = np.where(where, fresh[1], k), np.where(where, fresh[2], v)
    # Bit for bit: the same shape and call, only keys no row reads changed.
    assert_identical(
        subject,
        case,
        f"out with the keys and values of the {int(unlisted.sum())} keys no row lists changed",
        subject.call(case, q, changed_k, changed_v),
        clean,
    )


TOPK_CASES = {
    "prefill": Case(
        batch=2,
        heads=2,
        tq=40,
        head_dim=16,
        topk_length=(20, 7),
        kv_indices=IndexDraw(keys=20, seed=11),
    ),
    "mla-decode": Case(
        batch=2,
        heads=16,
        kv_heads=1,
        tq=1,
        tk=200,
        head_dim=576,
        value_dim=512,
        scale=MLA_SCALE,
        topk_length=(64, 0),
        kv_indices=IndexDraw(keys=64, seed=12),
    ),
}


@pytest.mark.claim("SPARSE-TOPK")
@pytest.mark.parametrize("case", list(TOPK_CASES.values()), ids=list(TOPK_CASES))
def test_only_the_first_topk_length_slots_count(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case, spread=1.5)
    v = mla_values(case, k) if mla_values(case, k) is not None else v
    out = subject.call(case, q, k, v)
    assert_sparse_output(subject, case, out, q, k, v)
    # The slots past each item's topk_length rewritten to other keys: nothing may change.
    rewritten = case.with_(kv_indices=replace(case.kv_indices, rewritten_past_topk=True))
    assert_identical(
        subject,
        rewritten,
        "out with the slots past topk_length rewritten to other keys",
        subject.call(rewritten, q, k, v),
        out,
    )
