"""Extensions, block-scaled low precision as Blackwell kernels run it: MXFP8 attention, FP4
key/value caches and DeepSeek's FP8 latent cache (BLOCK-SCALES, BLOCK-MAGNITUDE, BLOCK-ACCURACY,
BLOCK-NAN). Inputs are quantized as callers
quantize them (spec.block_scaled's recipes); conformance.judge.block_scaled holds the output to
the float64 formula on the dequantized inputs within the budget of the arithmetic the
implementation declares."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.block_scaled import (
    BLOCK_CASES,
    accuracy_draw,
    assert_block_matches,
    block_case,
    call_block,
    declared_call,
    spread_draw,
    with_largest_elements,
    with_nan_planted,
)


@pytest.mark.claim("BLOCK-SCALES")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_each_block_scale_multiplies_its_own_block(subject, convention, fmt):
    case = block_case(subject, convention, fmt, batch=2, heads=4, tq=64, head_dim=64)
    call = declared_call(subject, case, *spread_draw(subject, case))
    call = with_largest_elements(call)
    assert_block_matches(subject, case, call_block(subject, case, call), call)


@pytest.mark.claim("BLOCK-MAGNITUDE")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_zero_queries_and_keys_with_unit_values_give_one_in_every_row(subject, convention, fmt):
    case = block_case(subject, convention, fmt, batch=1, heads=2, tq=96, head_dim=64)
    q, k = np.zeros(case.q_shape), np.zeros(case.k_shape)
    call = declared_call(subject, case, q, k, np.ones(case.v_shape))
    assert_block_matches(subject, case, call_block(subject, case, call), call)


@pytest.mark.claim("BLOCK-ACCURACY")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_long_rows_of_small_weights_within_the_declared_rounding(subject, convention, fmt):
    case = block_case(subject, convention, fmt, batch=1, heads=2, tq=32, tk=1024, head_dim=64)
    call = declared_call(subject, case, *accuracy_draw(subject, case))
    assert_block_matches(subject, case, call_block(subject, case, call), call)


@pytest.mark.claim("BLOCK-NAN")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_nan_scales_and_elements_reach_exactly_the_outputs_that_read_them(subject, convention, fmt):
    if subject.client.capabilities.fp8_nan != "propagate":
        pytest.skip(f"{subject.name} declares fp8_nan={subject.client.capabilities.fp8_nan!r}")
    case = block_case(subject, convention, fmt, batch=2, heads=4, tq=64, head_dim=64)
    call = declared_call(subject, case, *spread_draw(subject, case))
    call = with_nan_planted(call)
    assert_block_matches(subject, case, call_block(subject, case, call), call)
