"""The contract of an implementation: dtype, shape and device of the output, independence of batch
items and heads, determinism, and clear errors for invalid inputs."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import (
    answer_or_none_if_raised,
    assert_equal,
    assert_follows_convention,
    assert_identical,
    assert_raises_clearly,
    assert_shape,
    fail,
)
from conformance.judge.conventions import FOLLOWS, promoted_to_an_input_dtype
from conformance.judge.harness import Case
from spec.dtypes import UNIT_ROUNDOFF, round_to


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
    out = subject.call_native(case, q, k, v)
    got_dtype = subject.client.dtype_name(out)
    assert_equal(subject, case, "out.dtype", got_dtype, dtype)
    assert_shape(subject, case, "out.shape", tuple(out.shape), case.out_shape)
    assert_equal(
        subject,
        case,
        "out.device",
        subject.client.device_of(out),
        out.input_device,
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
        # Bit for bit: the same shape and call, only values item (b, h) alone reads changed.
        assert_identical(
            subject,
            case,
            f"out of other items after changing item (b={b}, h={h})",
            out2[others],
            out[others],
        )
        if np.array_equal(out2[b, h], out[b, h]):
            fail(subject, case, f"out[{b}, {h}] did not change when its inputs did")


@pytest.mark.claim("CONTRACT-DETERMINISM")
def test_repeat_call_is_bit_identical(subject, dtype):
    case = Case(batch=2, heads=3, tq=129, head_dim=64, dtype=dtype)
    q, k, v = subject.inputs(case)
    first = subject.call(case, q, k, v)
    # The repeats' fresh allocations read as NaN: output memory the call leaves unwritten must
    # not pass for determinism by holding the first call's answer in a recycled buffer.
    case = case.with_(poison_allocations=True)
    for repeat in range(1, 3):
        # Bit for bit: the very same call, inputs and shape.
        assert_identical(
            subject,
            case,
            f"out of call {repeat + 1}",
            subject.call(case, q, k, v),
            first,
        )


# The shapes of the calls below are built around a base call fitted to the implementation's
# declared head dims and lengths (B = 1, H = 2, T = 8, D = 4 where any are declared): a kernel is
# refused or answered on what the test is about, never on a head dim or length it does not take.
BASE_CALL = Case(batch=1, heads=2, tq=8, head_dim=4)


def fitted_shapes(subject, shapes) -> tuple[tuple[int, ...], ...]:
    """``shapes(t, d, longer)`` around the base call fitted to ``subject``: t and d its length
    and head dim, ``longer`` the next declared length past t."""
    base = subject.fit(BASE_CALL)
    caps = subject.client.capabilities
    return shapes(base.tq, base.head_dim, caps.fit_length(base.tq + 1))


# Inputs that no implementation can attend: each must raise an error with a message. All are
# called with the default scale, which for D = 0 is 1/sqrt(0): no number (the catalogue's
# CONTRACT-ERRORS says why an explicit scale is another matter).
UNATTENDABLE = {
    # name: (t, d, longer) -> (q shape, k shape, v shape)
    "batch-2-vs-3": lambda t, d, _: ((2, 2, t, d), (3, 2, t, d), (3, 2, t, d)),
    "heads-2-vs-3": lambda t, d, _: ((1, 2, t, d), (1, 3, t, d), (1, 3, t, d)),
    "qk-dim-mismatch": lambda t, d, _: ((1, 2, t, d), (1, 2, t, d + 1), (1, 2, t, d)),
    "kv-length-mismatch": lambda t, d, longer: ((1, 2, t, d), (1, 2, t, d), (1, 2, longer, d)),
    "head-dim-0": lambda t, d, _: ((1, 2, t, 0), (1, 2, t, 0), (1, 2, t, d)),
}


@pytest.mark.claim("CONTRACT-ERRORS")
@pytest.mark.parametrize("problem", list(UNATTENDABLE))
def test_unattendable_inputs_raise(subject, dtype, problem):
    q_shape, k_shape, v_shape = fitted_shapes(subject, UNATTENDABLE[problem])
    case = Case(dtype=dtype)
    native = subject.to_native(case, *(np.ones(shape) for shape in (q_shape, k_shape, v_shape)))
    assert_raises_clearly(
        subject,
        None,
        f"{problem} (q{q_shape} k{k_shape} v{v_shape}, causal=True)",
        lambda: subject.client.attention(*native, causal=True, scale=None),
    )


# Inputs on which widely used kernels follow different conventions on purpose
# (impls.contract.CONVENTIONS): an error, or exactly the convention's result; nothing else.
CONVENTION_INPUTS = {
    # name: (convention, (t, d, longer) -> (q shape, k shape, v shape), scale)
    "q-rank-3": (
        "batch_axes", lambda t, d, _: ((2, t, d), (1, 2, t, d), (1, 2, t, d)), None,
    ),
    "k-rank-5": (
        "batch_axes", lambda t, d, _: ((1, 2, t, d), (1, 1, 2, t, d), (1, 2, t, d)), None,
    ),
    "batch-2-vs-1": (
        "batch_axes", lambda t, d, _: ((2, 2, t, d), (1, 2, t, d), (1, 2, t, d)), None,
    ),
    "causal-Tq>Tk": (
        "unseen_rows", lambda t, d, longer: ((1, 2, longer, d), (1, 2, t, d), (1, 2, t, d)), None,
    ),
    "scale-nan": (
        "nonfinite_scale", lambda t, d, _: ((1, 2, t, d),) * 3, float("nan"),
    ),
    "scale-inf": (
        "nonfinite_scale", lambda t, d, _: ((1, 2, t, d),) * 3, float("inf"),
    ),
}  # fmt: skip


def convention_followed(subject, problem: str, call, judge) -> tuple[str | None, str]:
    """("raise", "") where ``call()`` raised with a message, else ``judge(output as float64,
    its dtype name)``: the convention the answer followed, or None and why it follows none."""
    out = answer_or_none_if_raised(subject, problem, call)
    if out is None:
        return "raise", ""
    return judge(subject.client.to_numpy(out).astype(np.float64), subject.client.dtype_name(out))


@pytest.mark.claim("CONTRACT-ERRORS")
@pytest.mark.parametrize("problem", list(CONVENTION_INPUTS))
def test_convention_inputs_raise_or_follow_the_convention(subject, dtype, problem):
    convention, shapes, scale = CONVENTION_INPUTS[problem]
    q_shape, k_shape, v_shape = fitted_shapes(subject, shapes)
    if scale is not None:
        subject.require(Case(dtype=dtype, scale=1.0))
    case = Case(dtype=dtype, scale=scale)
    q, k, v = (
        round_to(subject.rng.standard_normal(shape), dtype) for shape in (q_shape, k_shape, v_shape)
    )
    described = f"{problem} (q{q_shape} k{k_shape} v{v_shape}, causal=True, scale={scale})"
    if len(q_shape) == len(k_shape) == 4 and q_shape[0] == k_shape[0]:  # a call of a Case's shape
        (batch, heads, tq, head_dim), tk = q_shape, k_shape[2]
        shaped = case.with_(batch=batch, heads=heads, tq=tq, tk=tk, head_dim=head_dim)
        subject.note_regimes_of_call(shaped, q, k, v)
    native = subject.to_native(case, q, k, v)
    followed, why_not = convention_followed(
        subject,
        described,
        lambda: subject.client.attention(*native, causal=True, scale=scale),
        lambda got, _: FOLLOWS[convention](got, q, k, v, dtype=dtype, scale=scale),
    )
    assert_follows_convention(subject, described, convention, followed, why_not)


@pytest.mark.claim("CONTRACT-ERRORS")
def test_mixed_dtypes_raise_or_promote(subject):
    dtypes = subject.client.capabilities.dtypes
    if len(dtypes) < 2:
        pytest.skip(f"{subject.name} declares one dtype only: nothing to mix")
    coarser = max(dtypes[:2], key=lambda name: UNIT_ROUNDOFF[name])
    case = subject.fit(Case(batch=1, heads=1, tq=4, head_dim=4, dtype=coarser))
    q, k, v = subject.inputs(case)
    native = [
        subject.client.from_numpy(q, dtypes[0]),
        subject.client.from_numpy(k, dtypes[1]),
        subject.client.from_numpy(v, dtypes[0]),
    ]
    described = f"mixed dtypes (q {dtypes[0]}, k {dtypes[1]}, v {dtypes[0]})"
    followed, why_not = convention_followed(
        subject,
        described,
        lambda: subject.client.attention(*native, causal=True, scale=None),
        lambda got, got_dtype: promoted_to_an_input_dtype(
            got, got_dtype, q, k, v, dtypes=dtypes[:2], coarser=coarser
        ),
    )
    assert_follows_convention(subject, described, "mixed_dtypes", followed, why_not)
