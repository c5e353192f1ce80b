"""Extensions, grouped-query heads: k and v with fewer heads than q (GQA-GROUPS, GQA-MQA)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_matches_oracle
from conformance.judge.harness import Case, Subject
from conformance.judge.truth import oracle_attention
from spec.features import feature_named

# Shapes where query head h's key/value head h // g differs from h % Hkv, the usual slip; groups
# of 3 and 7, which a kernel that shifts by log2(g) gets wrong (spec/regimes.py), of 8, a whole
# tile of query heads, and of 1, where grouped attention is plain multi-head attention.
GROUPED_CASES = [
    Case(batch=2, heads=6, kv_heads=2, tq=33, head_dim=16),
    Case(batch=1, heads=8, kv_heads=4, tq=5, tk=40, head_dim=32),
    Case(batch=1, heads=4, kv_heads=2, tq=1, tk=57, head_dim=16),
    Case(batch=1, heads=14, kv_heads=2, tq=9, tk=20, head_dim=16),
    Case(batch=1, heads=16, kv_heads=2, tq=1, tk=45, head_dim=16),
    Case(batch=1, heads=3, kv_heads=3, tq=17, head_dim=16),
]
GROUPED_IDS = ["g3-square", "g2-Tq<Tk", "g2-decode", "g7-Tq<Tk", "g8-decode", "g1"]
MULTI_QUERY_CASES = [
    Case(batch=2, heads=4, kv_heads=1, tq=31, head_dim=16),
    Case(batch=1, heads=12, kv_heads=1, tq=1, tk=70, head_dim=64),
]
MULTI_QUERY_IDS = ["square", "decode"]


def repeated_heads(case: Case, kv: np.ndarray) -> np.ndarray:
    """``kv`` (B, Hkv, T, D) as (B, Hq, T, D): query head h reading head h // g."""
    return kv[:, np.arange(case.heads) // (case.heads // case.key_value_heads)]


def assert_grouped_heads(subject: Subject, case: Case) -> None:
    __tracebackhide__ = True
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    # The claim's own statement: multi-head attention with K and V repeated g times along heads.
    truth = oracle_attention(q, repeated_heads(case, k), repeated_heads(case, v))
    # A head mapped h % Hkv where h // g belongs is named by the diagnosis (gqa-heads-modulo).
    assert_matches_oracle(subject, case, out, q, k, v, truth=truth)


@pytest.mark.claim("GQA-GROUPS")
@pytest.mark.parametrize("case", GROUPED_CASES, ids=GROUPED_IDS)
def test_query_head_h_reads_key_value_head_h_over_g(subject, dtype, case):
    if not subject.client.capabilities.declares("gqa"):  # groups of 1 need no declaration
        pytest.skip(f"{subject.name} does not declare {feature_named('gqa').missing}")
    assert_grouped_heads(subject, subject.fit(case.with_(dtype=dtype)))


@pytest.mark.claim("GQA-MQA")
@pytest.mark.parametrize("case", MULTI_QUERY_CASES, ids=MULTI_QUERY_IDS)
def test_one_key_value_head_serves_every_query_head(subject, dtype, case):
    assert_grouped_heads(subject, subject.fit(case.with_(dtype=dtype)))
