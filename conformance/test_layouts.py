"""Extensions, strided inputs: views of other arrays, as a model's projections hand them over
(LAYOUT-STRIDES)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import answer_or_none_if_raised, assert_matches_oracle
from conformance.judge.harness import Case
from impls.contract import LAYOUTS

VIEWS = [layout for layout in LAYOUTS if layout != "contiguous"]


@pytest.mark.claim("LAYOUT-STRIDES")
@pytest.mark.parametrize("layout", VIEWS)
def test_views_are_read_where_they_point(subject, dtype, layout):
    case = subject.fit(Case(batch=2, heads=3, tq=40, head_dim=16, dtype=dtype, layout=layout))
    q, k, v = subject.inputs(case)
    if layout == "broadcast_kv":  # one head's keys and values, seen by every head
        k, v = (np.broadcast_to(x[:, :1], x.shape).copy() for x in (k, v))
    if layout in subject.client.capabilities.layouts:
        out = subject.call(case, q, k, v)
    else:
        problem = f"inputs as {layout} views ({LAYOUTS[layout]}), a layout it does not declare"
        out = answer_or_none_if_raised(subject, problem, lambda: subject.call(case, q, k, v))
        if out is None:
            return  # a clear error: what the claim allows for a layout it does not declare
    assert_matches_oracle(subject, case, out, q, k, v)
