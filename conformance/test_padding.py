"""Extensions, padded batches: a key length per batch item (PAD-KEYS)."""

from __future__ import annotations

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
