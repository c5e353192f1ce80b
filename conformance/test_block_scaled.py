"""Extensions, block-scaled low precision as Blackwell kernels run it: MXFP8 attention and FP4
key/value caches (BLOCK-SCALES, BLOCK-MAGNITUDE, BLOCK-NAN). Inputs are quantized as callers
quantize them (spec.block_scaled's recipes); conformance.judge.block_scaled holds the output to
the float64 formula on the dequantized inputs within the budget of the arithmetic the
implementation declares."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.block_scaled import (
    BLOCK_CASES,
    assert_block_matches,
    block_case,
    call_block,
    declared_call,
    spread_draw,
    with_largest_elements,
)
from conformance.judge.fp8_calls import dominant_key
from spec.fp8 import codes_of


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
    q, k, v = dominant_key(subject, case, gap=7.5, spread=0.05)
    call = declared_call(subject, case, q, k, v + 1.0)
    assert_block_matches(subject, case, call_block(subject, case, call), call)


# Where BLOCK-NAN plants its NaN scales, all in one call: (operand, its index in the operand's
# scale tensor), each read by outputs the formula makes NaN and beside outputs none of them
# reads: q's row 5 of item 0, head 1, second block (that row); k's key 0 of item 1, kv head 0
# (every row of its query heads there); v's first block of item 0, kv head 0 at column 7
# (mx_attention: keys 0..31, so column 7 of every row of its query heads) or key 0's first
# block (fp4_cache: columns 0..15). Item 0's heads 2 and 3 and item 1's read none.
NAN_PLANTS = {"q": (0, 1, 5, 1), "k": (1, 0, 0, 0), "v": (0, 0, 0, 7)}
# And, in MXFP8's elements (e2m1 has no NaN), beside them: q's row 20 of item 1, its last head
# (that row), and v's key 40 of item 0, its last kv head, at column 11 (column 11 of the rows
# that see key 40 in its query heads). The index's -1 is the last head or kv head.
NAN_ELEMENTS = {"q": (1, -1, 20, 5), "v": (0, -1, 40, 11)}


@pytest.mark.claim("BLOCK-NAN")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_nan_scales_and_elements_reach_exactly_the_outputs_that_read_them(subject, convention, fmt):
    if subject.client.capabilities.fp8_nan != "propagate":
        pytest.skip(f"{subject.name} declares fp8_nan={subject.client.capabilities.fp8_nan!r}")
    case = block_case(subject, convention, fmt, batch=2, heads=4, tq=64, head_dim=64)
    call = declared_call(subject, case, *spread_draw(subject, case))
    nan_byte = 0xFF if call.format.scale == "e8m0" else codes_of(np.nan, call.format.scale)
    keywords = dict(call.keywords)
    for operand, index in NAN_PLANTS.items():
        name = f"{operand}_block_scales"
        if name not in keywords:  # fp4_cache's q is not block-scaled
            continue
        scales = np.array(keywords[name])
        scales[index if scales.shape[-1] > index[-1] else (*index[:-1], 0)] = nan_byte
        keywords[name] = scales
    elements = {}
    if not call.format.packed:
        for operand, index in NAN_ELEMENTS.items():
            elements[operand] = np.array(getattr(call, operand))
            elements[operand][index] = np.nan
    call = call.with_(keywords=keywords, **elements)
    assert_block_matches(subject, case, call_block(subject, case, call), call)
