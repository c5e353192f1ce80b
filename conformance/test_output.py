"""Section 3, from scores to output: the formula against the float64 oracle, and the head shape."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.assertions import assert_matches_oracle, assert_shape, fail
from conformance.harness import Case

LENGTHS = (1, 2, 3, 17, 63, 64, 65, 127, 129, 1024)
HEAD_DIMS = (1, 2, 3, 8, 16, 32, 40, 64, 80, 96, 128, 160, 256)
CROSS_LENGTHS = ((1, 1), (1, 17), (1, 239), (3, 799), (17, 64), (63, 129), (64, 1024))
SCALES = (0.0, 0.01, 0.3, 1.0, 2.5)


def causal_id(causal: bool) -> str:
    return "causal" if causal else "full"


@pytest.mark.claim("OUT-FORMULA")
@pytest.mark.parametrize("causal", [True, False], ids=causal_id)
@pytest.mark.parametrize("length", LENGTHS)
def test_formula_at_length(subject, dtype, length, causal):
    case = Case(batch=1, heads=2, tq=length, head_dim=64, dtype=dtype, causal=causal)
    q, k, v = subject.inputs(case)
    assert_matches_oracle("OUT-FORMULA", subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("OUT-FORMULA")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_formula_at_head_dim(subject, dtype, head_dim):
    case = Case(batch=2, heads=2, tq=65, head_dim=head_dim, dtype=dtype)
    q, k, v = subject.inputs(case)
    assert_matches_oracle("OUT-FORMULA", subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("OUT-FORMULA")
@pytest.mark.parametrize("causal", [True, False], ids=causal_id)
@pytest.mark.parametrize(("tq", "tk"), CROSS_LENGTHS, ids=[f"{a}x{b}" for a, b in CROSS_LENGTHS])
def test_formula_with_fewer_queries_than_keys(subject, dtype, tq, tk, causal):
    case = Case(batch=1, heads=3, tq=tq, tk=tk, head_dim=32, dtype=dtype, causal=causal)
    q, k, v = subject.inputs(case)
    assert_matches_oracle("OUT-FORMULA", subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("OUT-FORMULA")
@pytest.mark.parametrize("causal", [True, False], ids=causal_id)
@pytest.mark.parametrize("scale", SCALES)
def test_formula_with_explicit_scale(subject, dtype, scale, causal):
    case = Case(batch=1, heads=2, tq=47, head_dim=48, dtype=dtype, causal=causal, scale=scale)
    q, k, v = subject.inputs(case)
    assert_matches_oracle("OUT-FORMULA", subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("OUT-FORMULA")
def test_formula_with_value_dim_unlike_head_dim(subject, dtype):
    case = Case(batch=2, heads=2, tq=31, tk=45, head_dim=16, value_dim=40, dtype=dtype)
    q, k, v = subject.inputs(case)
    assert_matches_oracle("OUT-FORMULA", subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("OUT-HEAD-SHAPE")
@pytest.mark.parametrize(
    "case",
    [
        Case(batch=1, heads=1, tq=1024, head_dim=64),  # one ANDREA-120M head: (1024, 64)
        Case(batch=1, heads=12, tq=1024, head_dim=64),  # all twelve heads at once
        Case(batch=2, heads=3, tq=7, tk=11, head_dim=64, value_dim=24),
    ],
    ids=["andrea-one-head", "andrea-12-heads", "Tq<Tk,Dv=24"],
)
def test_head_output_shape(subject, case):
    case = case.with_(dtype=subject.impl.capabilities.dtypes[0])
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    assert_shape("OUT-HEAD-SHAPE", subject, case, "out.shape", out.shape, case.out_shape)
    if case.heads == 1 and case.batch == 1:
        assert_shape(
            "OUT-HEAD-SHAPE", subject, case, "out[0, 0].shape", out[0, 0].shape, (1024, 64)
        )
    if not np.isfinite(out).all():
        fail("OUT-HEAD-SHAPE", subject, case, "out has non-finite entries for finite inputs")
