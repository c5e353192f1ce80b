"""Extensions, strided inputs: views of other arrays, as a model's projections hand them over
(LAYOUT-STRIDES): all three operands in one layout, and each operand in a layout of its own beside
dense others, so that a kernel reading one operand with another's strides is seen."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import answer_or_none_if_raised, assert_matches_oracle
from conformance.judge.harness import Case
from impls.capabilities import OPERAND_VIEWS, layout_views, operand_layouts
from impls.contract import LAYOUTS

VIEWS = [layout for layout in LAYOUTS if layout != "contiguous"]
# Each view for each operand alone (k dense beside a v view, and the reverse), then k and v in
# two different views: the strides of q, k and v all differ from each other somewhere.
MIXED = [
    f"{operand}={view}"
    for view in OPERAND_VIEWS
    for operand in ("q", "k", "v")
    if not (operand == "q" and view == "broadcast_kv")
] + ["k=heads_last,v=row_gaps", "k=row_gaps,v=heads_last"]


def described(layout: str) -> str:
    if layout in LAYOUTS:
        return f"inputs as {layout} views ({LAYOUTS[layout]})"
    views = {o: view for o, view in operand_layouts(layout).items() if view != "contiguous"}
    dense = [o for o in ("q", "k", "v") if o not in views]
    return (
        ", ".join(f"{o} as {view} views" for o, view in views.items())
        + (f", {' and '.join(dense)} dense" if dense else "")
        + f" ({'; '.join(LAYOUTS[view] for view in sorted(set(views.values())))})"
    )


@pytest.mark.claim("LAYOUT-STRIDES")
@pytest.mark.parametrize("layout", VIEWS + MIXED)
def test_views_are_read_where_they_point(subject, dtype, layout):
    case = subject.fit(Case(batch=2, heads=3, tq=40, head_dim=16, dtype=dtype, layout=layout))
    q, k, v = subject.inputs(case)
    broadcast = [o for o, view in operand_layouts(layout).items() if view == "broadcast_kv"]
    # one head's keys or values, seen by every head
    k, v = (
        np.broadcast_to(x[:, :1], x.shape).copy() if name in broadcast else x
        for name, x in (("k", k), ("v", v))
    )
    if layout_views(layout) <= set(subject.client.capabilities.layouts):
        out = subject.call(case, q, k, v)
    else:
        problem = f"{described(layout)}, a layout it does not declare"
        out = answer_or_none_if_raised(subject, problem, lambda: subject.call(case, q, k, v))
        if out is None:
            return  # a clear error: what the claim allows for a layout it does not declare
    assert_matches_oracle(subject, case, out, q, k, v)
