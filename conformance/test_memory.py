"""Extensions, memory that was never written: outputs whole even when fresh allocations hold
NaN (OUT-WRITTEN)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_matches_oracle, fail
from conformance.judge.harness import Case

# Lengths that leave partial tiles, a decoding step and a head count that is not a power of two.
UNWRITTEN_CASES = [
    Case(batch=2, heads=3, tq=100, head_dim=40),
    Case(batch=1, heads=2, tq=1, tk=77, head_dim=64),
    Case(batch=1, heads=2, tq=130, head_dim=64),
]
UNWRITTEN_IDS = ["partial-tiles", "decode", "two-tiles-and-two-rows"]


@pytest.mark.claim("OUT-WRITTEN")
@pytest.mark.parametrize("case", UNWRITTEN_CASES, ids=UNWRITTEN_IDS)
def test_every_output_element_is_written(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    # First a plain call: a buffer it frees may come back, right answer and all, to the next;
    # and where the poisoned call's answer holds NaN, the plain one's tells written from not.
    plain = subject.call(case, q, k, v)
    poisoned = case.with_(poison_allocations=True)
    out = subject.call(poisoned, q, k, v)
    unwritten = np.isnan(out) & ~np.isnan(plain)
    computed = np.isnan(out) & np.isnan(plain)
    said = []
    for what, where in (
        ("NaN only with fresh allocations filled with NaN: it never wrote them", unwritten),
        ("NaN in the plain call too: it computed them (0 * inf, inf - inf, 0 / 0)", computed),
    ):
        if where.any():
            first = tuple(int(i) for i in np.argwhere(where)[0])
            said.append(f"{int(where.sum())} of {out.size} elements, first at {first}, hold {what}")
    if said:
        fail(subject, poisoned, "with finite inputs, out: " + "; ".join(said))
    assert_matches_oracle(subject, poisoned, out, q, k, v)
