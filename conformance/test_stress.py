"""Extensions, stress: repeats at a larger batch, and a batch's members independent of each other
(STRESS-REPEAT, BATCH-INVARIANT)."""

from __future__ import annotations

import pytest

from conformance.judge.assertions import assert_identical
from conformance.judge.harness import Case

# Repeats of a full call at the case below: well within a second or two on two CPU cores; on an
# accelerator, where a race shows up only now and then, many more for the same few seconds.
REPEATS = {"cpu": 8}
ACCELERATOR_REPEATS = 200


@pytest.mark.claim("STRESS-REPEAT")
def test_repeated_calls_at_a_larger_batch_are_bit_identical(subject, dtype):
    case = subject.fit(Case(batch=8, heads=4, tq=128, head_dim=64, dtype=dtype))
    q, k, v = subject.inputs(case)
    first = subject.call(case, q, k, v)
    for repeat in range(1, REPEATS.get(subject.client.device, ACCELERATOR_REPEATS) + 1):
        # Bit for bit: the very same call, inputs and shape.
        assert_identical(
            subject, case, f"out of call {repeat + 1}", subject.call(case, q, k, v), first
        )


@pytest.mark.claim("BATCH-INVARIANT")
def test_a_sequence_does_not_depend_on_its_batch(subject, dtype):
    case = subject.fit(Case(batch=6, heads=2, tq=65, head_dim=32, dtype=dtype))
    q, k, v = subject.inputs(case)
    together = subject.call(case, q, k, v)
    for members in ([0], [5], [4, 1, 3], [5, 4, 3, 2, 1, 0]):
        alone = subject.call(case.with_(batch=len(members)), q[members], k[members], v[members])
        # Bit for bit across shapes, which BLAS may block and sum in another order: exactly why
        # this claim is a SHOULD, the one identity no MUST claim asks for.
        assert_identical(
            subject,
            case,
            f"out of items {members} called as a batch of {len(members)}",
            alone,
            together[members],
        )
