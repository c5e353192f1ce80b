"""Hypothesis strategies for attention cases: shapes (B, H, Tq <= Tk, D, Dv), causal, scale and a
data seed. Shrinking moves toward the smallest failing shape."""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.judge.harness import Case


@st.composite
def cases(draw, dtype: str, max_length: int = 96, max_dim: int = 72) -> Case:
    tk = draw(st.integers(1, max_length))
    tq = draw(st.integers(1, tk))
    head_dim = draw(st.integers(1, max_dim))
    return Case(
        batch=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 3)),
        tq=tq,
        tk=tk,
        head_dim=head_dim,
        value_dim=draw(st.one_of(st.just(head_dim), st.integers(1, max_dim))),
        dtype=dtype,
        causal=draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.floats(0.0, 2.0, allow_nan=False))),
    )


data_seeds = st.integers(0, 2**32 - 1)
