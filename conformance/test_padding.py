"""Extensions, padded and packed batches: a key length per batch item (PAD-KEYS), and sequences
packed along the token axis (PAD-PACKED)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conformance.judge.assertions import assert_identical, assert_matches_oracle
from conformance.judge.harness import Case
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
    assert_identical(
        subject, case, f"out with {tensor} = {bad} past each item's key length", padded, clean
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
        assert_identical(
            subject,
            case,
            f"rows {rows.start}..{rows.stop - 1} (sequence {s}) with every other sequence changed",
            changed[..., rows, :],
            out[..., rows, :],
        )
