"""The contract of an implementation: dtype, shape and device of the output, independence of batch
items and heads, determinism, and clear errors for invalid inputs."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.assertions import (
    assert_equal,
    assert_identical,
    assert_raises_clearly,
    assert_shape,
    fail,
)
from conformance.harness import Case


@pytest.mark.claim("CONTRACT-DTYPE")
@pytest.mark.parametrize(
    "case",
    [
        Case(batch=2, heads=3, tq=17, head_dim=32),
        Case(batch=1, heads=2, tq=5, tk=29, head_dim=16, value_dim=24),
    ],
    ids=["square", "Tq<Tk,Dv!=D"],
)
def test_output_dtype_shape_device(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    native_q = subject.to_native(case, q)[0]
    out = subject.call_native(case, q, k, v)
    got_dtype = subject.impl.dtype_name(out)
    assert_equal("CONTRACT-DTYPE", subject, case, "out.dtype", got_dtype, dtype)
    assert_shape("CONTRACT-DTYPE", subject, case, "out.shape", tuple(out.shape), case.out_shape)
    assert_equal(
        "CONTRACT-DTYPE",
        subject,
        case,
        "out.device",
        subject.impl.device_of(out),
        subject.impl.device_of(native_q),
    )


@pytest.mark.claim("CONTRACT-BATCH")
def test_batch_items_and_heads_are_independent(subject, dtype):
    case = subject.fit(Case(batch=3, heads=4, tq=33, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    out = subject.call(case, q, k, v)
    for b, h in [(0, 0), (1, 2), (2, 3)]:
        # Changing one (batch item, head) must leave every other one's output bit for bit as it was.
        q2, k2, v2 = (x.copy() for x in (q, k, v))
        fresh = subject.inputs(case.with_(batch=1, heads=1))
        q2[b, h], k2[b, h], v2[b, h] = (x[0, 0] for x in fresh)
        out2 = subject.call(case, q2, k2, v2)
        others = np.ones(out.shape[:2], dtype=bool)
        others[b, h] = False
        assert_identical(
            "CONTRACT-BATCH",
            subject,
            case,
            f"out of other items after changing item (b={b}, h={h})",
            out2[others],
            out[others],
        )
        if np.array_equal(out2[b, h], out[b, h]):
            fail(
                "CONTRACT-BATCH", subject, case, f"out[{b}, {h}] did not change when its inputs did"
            )


@pytest.mark.claim("CONTRACT-DETERMINISM")
def test_repeat_call_is_bit_identical(subject, dtype):
    case = Case(batch=2, heads=3, tq=129, head_dim=64, dtype=dtype)
    q, k, v = subject.inputs(case)
    first = subject.call(case, q, k, v)
    for repeat in range(1, 3):
        assert_identical(
            "CONTRACT-DETERMINISM",
            subject,
            case,
            f"out of call {repeat + 1}",
            subject.call(case, q, k, v),
            first,
        )


INVALID = {
    # name: (q shape, k shape, v shape, causal, scale)
    "q-rank-3": ((2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4), True, None),
    "k-rank-5": ((1, 2, 8, 4), (1, 1, 2, 8, 4), (1, 2, 8, 4), True, None),
    "batch-mismatch": ((2, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4), True, None),
    "heads-mismatch": ((1, 2, 8, 4), (1, 3, 8, 4), (1, 3, 8, 4), True, None),
    "qk-dim-mismatch": ((1, 2, 8, 4), (1, 2, 8, 5), (1, 2, 8, 4), True, None),
    "kv-length-mismatch": ((1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 9, 4), True, None),
    "causal-Tq>Tk": ((1, 2, 9, 4), (1, 2, 8, 4), (1, 2, 8, 4), True, None),
    "head-dim-0": ((1, 2, 8, 0), (1, 2, 8, 0), (1, 2, 8, 4), True, None),
    "scale-nan": ((1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4), True, float("nan")),
    "scale-inf": ((1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4), True, float("inf")),
}


@pytest.mark.claim("CONTRACT-ERRORS")
@pytest.mark.parametrize("problem", list(INVALID))
def test_invalid_input_raises(subject, dtype, problem):
    q_shape, k_shape, v_shape, causal, scale = INVALID[problem]
    case = Case(dtype=dtype, causal=causal, scale=scale)
    q, k, v = (np.ones(shape) for shape in (q_shape, k_shape, v_shape))
    native = subject.to_native(case, q, k, v)
    assert_raises_clearly(
        "CONTRACT-ERRORS",
        subject,
        case,
        f"{problem} (q{q_shape} k{k_shape} v{v_shape})",
        lambda: subject.impl.attention(*native, causal=causal, scale=scale),
    )


@pytest.mark.claim("CONTRACT-ERRORS")
def test_mixed_dtypes_raise(subject):
    dtypes = subject.impl.capabilities.dtypes
    if len(dtypes) < 2:
        pytest.skip(f"{subject.name} declares one dtype only: nothing to mix")
    case = subject.fit(Case(batch=1, heads=1, tq=4, head_dim=4, dtype=dtypes[0]))
    q, k, v = subject.inputs(case)
    native = [
        subject.impl.from_numpy(q, dtypes[0]),
        subject.impl.from_numpy(k, dtypes[1]),
        subject.impl.from_numpy(v, dtypes[0]),
    ]
    assert_raises_clearly(
        "CONTRACT-ERRORS",
        subject,
        case,
        f"mixed dtypes (q {dtypes[0]}, k {dtypes[1]})",
        lambda: subject.impl.attention(*native, causal=True, scale=None),
    )
