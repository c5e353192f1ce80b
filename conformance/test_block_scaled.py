"""Extensions, block-scaled low precision as Blackwell kernels run it: MXFP8 attention, FP4
key/value caches and DeepSeek's FP8 latent cache, dense and as page pools (BLOCK-SCALES,
BLOCK-MAGNITUDE, BLOCK-PAGED, BLOCK-ACCURACY, BLOCK-NAN). Inputs are quantized as callers
quantize them (spec.block_scaled's recipes); conformance.judge.block_scaled holds the output to
the float64 formula on the dequantized inputs within the budget of the arithmetic the
implementation declares."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.block_scaled import (
    BLOCK_CASES,
    PAGED_CASES,
    accuracy_draw,
    assert_block_lse_matches,
    assert_block_matches,
    block_case,
    call_block,
    call_block_with_lse,
    declared_call,
    spread_draw,
    with_largest_elements,
    with_nan_planted,
)
from spec.block_scaled import CACHE_LAYOUTS


@pytest.mark.claim("BLOCK-SCALES")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_each_block_scale_multiplies_its_own_block(subject, convention, fmt):
    """Where the log-sum-exp is declared it is held too: a log-sum-exp whose scores miss q's or
    k's block scales is right at q = k = 0 (BLOCK-MAGNITUDE) and wrong here."""
    case = block_case(subject, convention, fmt, batch=2, heads=4, tq=64, head_dim=64)
    call = declared_call(subject, case, *spread_draw(subject, case))
    call = with_largest_elements(call)
    if not subject.client.capabilities.lse:
        assert_block_matches(subject, case, call_block(subject, case, call), call)
        return
    lse_case = case.with_(return_lse=True)
    out, lse = call_block_with_lse(subject, lse_case, call)
    assert_block_matches(subject, lse_case, out, call)
    assert_block_lse_matches(subject, lse_case, lse, call)


@pytest.mark.claim("BLOCK-MAGNITUDE")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_zero_queries_and_keys_with_unit_values_give_one_in_every_row(subject, convention, fmt):
    case = block_case(subject, convention, fmt, batch=1, heads=2, tq=96, head_dim=64)
    q, k = np.zeros(case.q_shape), np.zeros(case.k_shape)
    call = declared_call(subject, case, q, k, np.ones(case.v_shape))
    assert_block_matches(subject, case, call_block(subject, case, call), call)


@pytest.mark.claim("BLOCK-MAGNITUDE")
@pytest.mark.parametrize(("convention", "fmt"), BLOCK_CASES)
def test_zero_queries_and_keys_give_the_log_of_the_keys_seen_as_lse(subject, convention, fmt):
    """FlashInfer PR #3838's NVFP4 kernel returned a wrong log-sum-exp beside its halved output: a
    merge of split states weighs each by it, so it is held as the output is."""
    case = block_case(subject, convention, fmt, batch=1, heads=2, tq=96, head_dim=64,
                      return_lse=True)  # fmt: skip
    q, k = np.zeros(case.q_shape), np.zeros(case.k_shape)
    call = declared_call(subject, case, q, k, np.ones(case.v_shape))
    out, lse = call_block_with_lse(subject, case, call)
    assert_block_matches(subject, case, out, call)
    assert_block_lse_matches(subject, case, lse, call)


# A batch over pools: one item past several pages and mid-page, one short and mid-page, one
# ending on a page's boundary; FlashMLA's pages of 64 for the latent cache, vLLM's 16 else. Each
# item decodes one row, or a chunk of 5 rows (speculative decoding, chunked prefill: the last
# rows of each item, bottom-right).
PAGED_LENGTHS = (150, 37, 64)


@pytest.mark.claim("BLOCK-PAGED")
@pytest.mark.parametrize("tq", [1, 5], ids=["decode", "chunk of 5"])
@pytest.mark.parametrize(("convention", "fmt"), PAGED_CASES)
def test_page_pools_are_read_through_the_table_and_nothing_else(subject, convention, fmt, tq):
    page_size = 64 if fmt in CACHE_LAYOUTS else 16
    case = block_case(subject, convention, fmt, batch=3, heads=4, tq=tq, tk=max(PAGED_LENGTHS),
                      head_dim=64, key_lengths=PAGED_LENGTHS, page_size=page_size)  # fmt: skip
    call = declared_call(subject, case, *spread_draw(subject, case))
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
