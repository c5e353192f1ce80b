"""Extensions, padded and packed batches: a key length per batch item (PAD-KEYS), and sequences
packed along the token axis (PAD-PACKED)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conformance.judge.assertions import (
    assert_empty_rows,
    assert_identical,
    assert_matches_oracle,
    assert_within_budget,
    fail,
)
from conformance.judge.harness import Case, packed_rows
from conformance.judge.tolerance import compare_to_oracle
from conformance.judge.truth import oracle_attention

PADDED_CASES = [
    Case(batch=3, heads=2, tq=1, tk=40, head_dim=16, key_lengths=(40, 23, 1)),  # decode
    Case(batch=3, heads=2, tq=4, tk=33, head_dim=32, key_lengths=(4, 33, 18)),  # chunked
    Case(batch=2, heads=2, tq=8, tk=20, head_dim=16, key_lengths=(20, 5), causal=False),
]
PADDED_IDS = ["decode", "chunked", "full"]


@pytest.mark.claim("PAD-KEYS")
@pytest.mark.parametrize("case", PADDED_CASES, ids=PADDED_IDS)
def test_each_item_attends_its_own_keys_alone(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    # The claim's own statement: item b computed on its first L_b keys, without the padding.
    truth = np.concatenate(
        [
            oracle_attention(
                q[b : b + 1], k[b : b + 1, :, :length], v[b : b + 1, :, :length], causal=case.causal
            )
            for b, length in enumerate(case.key_lengths)
        ]
    )
    assert_matches_oracle(subject, case, out, q, k, v, truth=truth)


@pytest.mark.claim("PAD-KEYS")
@pytest.mark.parametrize("tensor", ["k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_nonfinite_padding_never_reaches_a_row(subject, dtype, tensor, bad):
    case = subject.fit(PADDED_CASES[1].with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    clean = subject.call(case, q, k, v)
    planted = {"k": k.copy(), "v": v.copy()}
    for b, length in enumerate(case.key_lengths):
        planted[tensor][b, :, length:, :] = bad
    with np.errstate(invalid="ignore", over="ignore"):
        padded = subject.call(case, q, planted["k"], planted["v"])
    # Bit for bit: the same shape and call, only values past each key length (never read) changed.
    assert_identical(
        subject,
        case,
        f"out with {tensor} = {bad} past each item's key length",
        padded,
        clean,
        answer=(padded, q, planted["k"], planted["v"]),
    )


PACKED_CASES = [
    # prefill of three sequences, one of them a single token
    Case(
        batch=1,
        heads=2,
        tq=60,
        head_dim=16,
        cu_seqlens_q=(0, 17, 18, 60),
        cu_seqlens_k=(0, 17, 18, 60),
    ),
    # one decoding step for each of three sequences against caches of 30, 1 and 39 keys
    Case(
        batch=1,
        heads=2,
        tq=3,
        tk=70,
        head_dim=32,
        cu_seqlens_q=(0, 1, 2, 3),
        cu_seqlens_k=(0, 30, 31, 70),
    ),
    # chunked prefill: 5 and 7 new tokens after 15 and 23 cached ones
    Case(
        batch=1,
        heads=2,
        tq=12,
        tk=50,
        head_dim=16,
        cu_seqlens_q=(0, 5, 12),
        cu_seqlens_k=(0, 20, 50),
    ),
]
PACKED_IDS = ["prefill", "decode", "chunked"]


def sequences(case: Case):
    """(query slice, key slice) of each packed sequence."""
    bounds = zip(
        itertools.pairwise(case.cu_seqlens_q), itertools.pairwise(case.cu_seqlens_k), strict=True
    )
    return [(slice(qa, qb), slice(ka, kb)) for (qa, qb), (ka, kb) in bounds]


@pytest.mark.claim("PAD-PACKED")
@pytest.mark.parametrize("case", PACKED_CASES, ids=PACKED_IDS)
def test_each_packed_sequence_attends_its_own_keys(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    # The claim's own statement: each sequence's attention, computed alone, packed again.
    truth = np.concatenate(
        [
            oracle_attention(q[..., rows, :], k[..., keys, :], v[..., keys, :])
            for rows, keys in sequences(case)
        ],
        axis=-2,
    )
    assert_matches_oracle(subject, case, out, q, k, v, truth=truth)


@pytest.mark.claim("PAD-PACKED")
@pytest.mark.parametrize("case", PACKED_CASES, ids=PACKED_IDS)
def test_no_token_attends_across_a_sequence_boundary(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    fresh = subject.inputs(case, spread=3.0)
    for s, (rows, keys) in enumerate(sequences(case)):
        others_q, others_k, others_v = (new.copy() for new in fresh)
        others_q[..., rows, :], others_k[..., keys, :], others_v[..., keys, :] = (
            q[..., rows, :],
            k[..., keys, :],
            v[..., keys, :],
        )
        changed = subject.call(case, others_q, others_k, others_v)
        # Bit for bit: the same shape and call, only values sequence s never reads changed.
        assert_identical(
            subject,
            case,
            f"rows {rows.start}..{rows.stop - 1} (sequence {s}) with every other sequence changed",
            changed[..., rows, :],
            out[..., rows, :],
        )


QUERY_PADDED_CASES = [
    # a padded prefill: three prompts of 24, 9 and 1 tokens in a batch of 24 rows
    Case(batch=3, heads=2, tq=24, head_dim=16, query_lengths=(24, 9, 1), key_lengths=(24, 9, 1)),
    # chunks of 4, 1 and 3 new tokens after caches of 29, 10 and 0 keys
    Case(
        batch=3, heads=2, tq=4, tk=33, head_dim=32, query_lengths=(4, 1, 3), key_lengths=(33, 11, 3)
    ),
]
QUERY_PADDED_IDS = ["prefill", "chunked"]


@pytest.mark.claim("PAD-KEYS")
@pytest.mark.parametrize("case", QUERY_PADDED_CASES, ids=QUERY_PADDED_IDS)
def test_padded_query_rows_hold_the_declared_convention(subject, dtype, case):
    # Fresh allocations read as NaN: padded rows declared zero must have been written as zeros.
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    rows, *packed, offsets = packed_rows(case, out, q, k, v)
    comparison = compare_to_oracle(rows, *packed, dtype=case.dtype, causal=case.causal, **offsets)
    assert_within_budget(subject, case, "out's rows within each item's query length", comparison)
    convention = subject.client.capabilities.padded_query_rows
    if convention == "zeros":
        padding = np.concatenate([out[b, :, n:].ravel() for b, n in enumerate(case.query_lengths)])
        if np.any(padding != 0):
            fail(
                subject,
                case,
                f"{int(np.sum(padding != 0))} of {padding.size} elements of the padded query rows "
                f"are not 0 (first: {padding[padding != 0][0]!r}), but it declares "
                "padded_query_rows='zeros'",
            )


EMPTY_CASES = [
    # a decoding batch in which item 1 has no key cached yet
    Case(batch=3, heads=2, tq=1, tk=24, head_dim=16, key_lengths=(24, 0, 9)),
    # a chunk of 5 new rows for two items, the first without any key
    Case(batch=2, heads=2, tq=5, tk=20, head_dim=16, key_lengths=(0, 20)),
]
EMPTY_IDS = ["decode", "prefill"]


@pytest.mark.claim("EMPTY-KV")
@pytest.mark.parametrize("case", EMPTY_CASES, ids=EMPTY_IDS)
def test_an_item_with_no_key_gives_the_declared_empty_rows(subject, dtype, case):
    # Fresh allocations read as NaN: rows left unwritten show, whatever the convention.
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    lengths = np.asarray(case.key_lengths)
    empty, full = np.flatnonzero(lengths == 0), np.flatnonzero(lengths > 0)
    others = case.with_(
        batch=len(full), key_lengths=tuple(int(n) for n in lengths[full]), poison_allocations=False
    )
    assert_matches_oracle(subject, others, out[full], q[full], k[full], v[full])
    assert_empty_rows(
        subject, case, f"rows of item(s) {empty.tolist()}, which have no key", out[empty]
    )
    if subject.client.capabilities.lse:
        _, lse = subject.call_with_lse(case, q, k, v)
        # Bit for bit against a constant: the log of an empty sum is -inf exactly.
        assert_identical(
            subject,
            case,
            f"lse of item(s) {empty.tolist()}, which have no key",
            lse[empty],
            np.full_like(lse[empty], -np.inf),
        )


@pytest.mark.claim("EMPTY-KV")
def test_a_packed_sequence_with_no_key_gives_the_declared_empty_rows(subject, dtype):
    # Two packed sequences of 3 query rows each; the second has no key.
    case = Case(
        batch=1, heads=2, tq=6, tk=10, head_dim=16, cu_seqlens_q=(0, 3, 6), cu_seqlens_k=(0, 10, 10)
    )
    case = subject.fit(case.with_(dtype=dtype, poison_allocations=True))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    # Sequence 0 within budget of its truth: an empty sequence beside it changes nothing of it.
    # Not bit for bit against a call of 3 rows: that call has another shape, which BLAS may block
    # and sum in another order (a correct block-diagonal kernel differs in the last bit on an
    # AVX2 machine); bit identity across shapes is what BATCH-INVARIANT, a SHOULD, asks. The
    # rows are a slice of a call no mistake's variant computes (the formula has no empty
    # sequence), so a failure says where its errors lie and neither names nor rules out a mistake.
    alone = case.with_(tq=3, cu_seqlens_q=(0, 3), cu_seqlens_k=(0, 10), poison_allocations=False)
    assert_matches_oracle(
        subject,
        alone,
        out[..., :3, :],
        q[..., :3, :],
        k,
        v,
        what="out rows 0..2 (sequence 0)",
        diagnosable=False,
    )
    assert_empty_rows(subject, case, "rows 3..5 (sequence 1, which has no key)", out[..., 3:, :])
    if subject.client.capabilities.lse:
        _, lse = subject.call_with_lse(case, q, k, v)
        # Bit for bit against a constant: the log of an empty sum is -inf exactly.
        assert_identical(
            subject,
            case,
            "lse of rows 3..5 (sequence 1, which has no key)",
            lse[..., 3:],
            np.full_like(lse[..., 3:], -np.inf),
        )
