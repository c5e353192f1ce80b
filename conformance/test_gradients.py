"""Extensions, the backward: the gradients of every feature a training kernel ships, each feature's
gradient claim a row of one table (a case costs one backward call per dtype), judged by
``conformance.judge.gradients``: exact zeros where no gradient flows, every gradient (and a
sink's own) within its budget of the float64 backward, a failure diagnosed among the backward's
mistakes. The document's own gradient claims (OUT-GRAD, MASK-GRAD) are in test_output.py and
test_mask.py; their cases go through the same judge.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import fail
from conformance.judge.gradients import assert_backward_of, backward
from conformance.judge.harness import Case
from conformance.judge.tables import BACKWARD_CASES
from spec.dtypes import round_to


@pytest.mark.parametrize(("case", "spread"), BACKWARD_CASES)
def test_gradients_of_each_feature(subject, dtype, case, spread):
    assert_backward_of(subject, case.with_(dtype=dtype), spread)


@pytest.mark.claim("GRAD-DETERMINISM")
def test_repeated_backward_passes_are_bit_identical(subject, dtype):
    case = subject.fit(
        Case(batch=2, heads=4, tq=70, tk=113, head_dim=16, dtype=dtype)
    )  # several key tiles summed into each dq row, several query blocks into dk and dv
    subject.require(case, autograd=True)
    q, k, v = subject.inputs(case)
    grad_out = round_to(subject.rng.standard_normal(case.out_shape), dtype)
    first = backward(subject, case, q, k, v, grad_out)
    for repeat in range(1, 4):
        again = backward(subject, case, q, k, v, grad_out)
        for name, grad in first.items():
            differ = ~((again[name] == grad) | (np.isnan(again[name]) & np.isnan(grad)))
            if differ.any():
                fail(
                    subject,
                    case,
                    f"d{name} of call {repeat + 1} differs from call 1's in "
                    f"{np.count_nonzero(differ)} entries (largest by "
                    f"{np.nanmax(np.abs(again[name] - grad)):.3g}), but repeated backward "
                    "passes should be bit-identical",
                )
