"""The tiling that numpy_flash mirrors for cupy_flash: which tiles are visited, and the
log-sum-exp the kernel can return. (The output itself is judged by the conformance suite.)"""

from __future__ import annotations

import numpy as np
import pytest

from impls.numpy_flash import BLOCK_M, BLOCK_N, NumpyFlash, key_tiles
from spec.formula import causal_mask, reference_log_sum_exp

SHAPES = [(1, 1), (63, 63), (64, 64), (65, 65), (200, 200), (1, 129), (63, 129), (70, 300)]


@pytest.mark.parametrize(("tq", "tk"), SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_causal_blocks_visit_exactly_the_tiles_with_a_visible_key(tq, tk):
    visible = causal_mask(tq, tk)  # (Tq, Tk)
    for block_start in range(0, tq, BLOCK_M):
        block_stop = min(block_start + BLOCK_M, tq)
        visited = key_tiles(block_start, block_stop, tk, tk - tq, causal=True)
        block_visible = visible[block_start:block_stop].any(axis=0)  # (Tk,)
        needed = [
            (start, min(start + BLOCK_N, tk))
            for start in range(0, tk, BLOCK_N)
            if block_visible[start : start + BLOCK_N].any()
        ]
        assert visited == needed, (
            f"query block [{block_start}, {block_stop}) of Tq={tq}, Tk={tk} visits key tiles "
            f"{visited}, but should visit {needed}"
        )


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(("tq", "tk"), SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_log_sum_exp_is_that_of_the_scaled_masked_scores(tq, tk, causal):
    rng = np.random.default_rng([tq, tk])
    q, k, v = (rng.standard_normal((2, 3, t, 32)) for t in (tq, tk, tk))
    _, lse = NumpyFlash().attention_and_lse(q, k, v, causal=causal)
    expected = reference_log_sum_exp(q, k, causal=causal)  # (B, H, Tq)
    assert lse.shape == expected.shape, f"lse.shape={lse.shape}, but should be {expected.shape}"
    np.testing.assert_allclose(lse, expected, rtol=1e-13, atol=1e-13)
