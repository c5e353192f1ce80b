"""Extensions, FP8 as serving kernels run it: the scales, the formats, accuracy where P's
rounding breaks, and a NaN stored (FP8-SCALES, FP8-FORMAT, FP8-ACCURACY, FP8-NAN), and
MASK-NONFINITE's SHOULD for what FP8 operands store at future positions. Inputs are
quantized as callers quantize them (spec.fp8's recipes); conformance.judge.fp8 holds the output to
the float64 formula on the dequantized inputs within the budget of the arithmetic the
implementation declares."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_identical
from conformance.judge.fp8 import Fp8Inputs, assert_fp8_matches, call_fp8, quantized
from conformance.judge.fp8_calls import (
    ACCURACY_CASES,
    SCALING_IDS,
    SCALINGS,
    accuracy_call,
    first_declared,
    format_call,
    fp8_case,
    per_head_amplitudes,
    scales_call,
)
from conformance.judge.harness import Case, Subject
from spec.fp8 import FP8_FORMATS, fp8_format


@pytest.mark.claim("FP8-SCALES")
@pytest.mark.parametrize(("convention", "kv_scale", "page_size"), SCALINGS, ids=SCALING_IDS)
def test_each_scale_is_applied_once_to_its_operand_by_kv_head(
    subject, convention, kv_scale, page_size
):
    case, inputs = scales_call(subject, convention, kv_scale, page_size)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


@pytest.mark.claim("FP8-FORMAT")
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_fp8_values_are_read_in_their_format_over_its_whole_range(subject, fmt):
    case, inputs = format_call(subject, fmt)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


@pytest.mark.claim("FP8-ACCURACY")
@pytest.mark.parametrize(("shape", "draw"), ACCURACY_CASES)
def test_fp8_output_within_the_budget_of_its_declared_rounding(subject, shape, draw):
    case, inputs = accuracy_call(subject, shape, draw)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


# Where FP8-NAN plants its NaN: (operand, its index (b, head, position, d)), each read by outputs
# the formula makes NaN and beside outputs it leaves alone: a query's row 5 (the other rows
# not); the first key, which every row sees (the other items not); the first value's column 7
# (the other columns not).
NAN_PLANTS = [("q", (0, 1, 5, 3)), ("k", (1, 0, 0, 2)), ("v", (0, 0, 0, 7))]


def small_scales_draw(subject: Subject, fmt: str) -> tuple[Case, Fp8Inputs]:
    """FP8-SCALES' draw, small, in ``fmt``: two items, grouped heads, Tq = 48, every (b, kv
    head) at its own amplitude, in the first convention the implementation declares."""
    convention, kv_scale, _ = first_declared(subject)
    case = fp8_case(subject, convention, kv_scale, fmt, batch=2, heads=4, tq=48, head_dim=16)
    q, k, v = per_head_amplitudes(subject, case, case.q_shape, case.k_shape, case.v_shape)
    return case, quantized(case, q, k, v)


def with_stored(inputs: Fp8Inputs, operand: str, where, value: float) -> Fp8Inputs:
    """``inputs`` with ``value`` stored in ``operand`` at ``where`` (an index), in a copy."""
    stored = {name: getattr(inputs, name) for name in "qkv"}
    stored[operand] = stored[operand].copy()
    stored[operand][where] = value
    return Fp8Inputs(*stored.values(), inputs.scales)


def nan_call(subject: Subject, fmt: str, operand: str, index: tuple):
    """FP8-NAN's call: :func:`small_scales_draw` with a NaN stored in ``operand`` at
    ``index``."""
    if operand == "q" and first_declared(subject)[0] == "kv_scale":
        pytest.skip("under the key/value cache's convention q is not FP8")
    case, inputs = small_scales_draw(subject, fmt)
    return case, with_stored(inputs, operand, index, np.nan)


@pytest.mark.claim("FP8-NAN")
@pytest.mark.parametrize(("operand", "index"), NAN_PLANTS, ids=[op for op, _ in NAN_PLANTS])
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_a_nan_in_an_fp8_operand_reaches_the_outputs_that_read_it(subject, fmt, operand, index):
    if subject.client.capabilities.fp8_nan != "propagate":
        pytest.skip(f"{subject.name} declares fp8_nan={subject.client.capabilities.fp8_nan!r}")
    case, inputs = nan_call(subject, fmt, operand, index)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


# MASK-NONFINITE's SHOULD in FP8: what an FP8 operand can hold that is not a number, stored at
# positions after the cut, must not reach rows 0..cut (a NaN, and e5m2's infinities)
FUTURE_CUT = 20


def nonfinite_values(fmt: str) -> list[float]:
    return [np.nan] + ([np.inf, -np.inf] if fp8_format(fmt).overflow == "inf" else [])


def assert_fp8_future_does_not_reach_past_rows(subject: Subject, fmt: str, operand: str):
    """:func:`small_scales_draw` in ``fmt`` called clean, then with each value
    :func:`nonfinite_values` gives stored in ``operand`` at every position after FUTURE_CUT:
    rows 0..FUTURE_CUT bit for bit as clean."""
    case, inputs = small_scales_draw(subject, fmt)
    clean = call_fp8(subject, case, inputs)[..., : FUTURE_CUT + 1, :]
    future = (..., slice(FUTURE_CUT + 1, None), slice(None))  # positions after the cut
    for bad in nonfinite_values(fmt):
        with np.errstate(invalid="ignore", over="ignore"):
            out = call_fp8(subject, case, with_stored(inputs, operand, future, bad))
        what = f"rows 0..{FUTURE_CUT} with {operand}[positions > {FUTURE_CUT}] = {bad} in {fmt}"
        assert_identical(subject, case, what, out[..., : FUTURE_CUT + 1, :], clean)


@pytest.mark.claim("MASK-NONFINITE", "MASK-NONFINITE-KEYS")
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_nonfinite_fp8_future_keys_do_not_reach_past_rows(subject, fmt):
    assert_fp8_future_does_not_reach_past_rows(subject, fmt, "k")


@pytest.mark.claim("MASK-NONFINITE", "MASK-NONFINITE-VALUES")
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_nonfinite_fp8_future_values_do_not_reach_past_rows(subject, fmt):
    assert_fp8_future_does_not_reach_past_rows(subject, fmt, "v")
