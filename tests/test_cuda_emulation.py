"""The CUDA kernels' own code, run on the host (tests/cuda_emulation): every flash kernel (dtype x
head dim, and its _softcap twin) at partial tiles, Tq < Tk, without the mask, with an explicit
scale and with sinks, its log-sum-exp, and the naive kernels, each judged against the float64
oracle with the suite's tolerance budget. The whole suite on them: ``--impl
tests.cuda_emulation:flash``."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.tolerance import compare_to_oracle
from impls.cuda_kernels import FLASH_HEAD_DIMS
from spec.dtypes import round_to
from spec.formula import reference_log_sum_exp
from tests import cuda_emulation

# (Tq, Tk, causal, scale, modifiers): one row; partial query blocks and key tiles; Tq < Tk
# bottom-right; no mask; an explicit scale; the _softcap twin, and sinks (one per head, the last
# none), with either.
FLASH_CASES = [
    (1, 1, True, None, {}),
    (65, 65, True, None, {}),
    (130, 130, True, None, {}),
    (63, 129, True, None, {}),
    (70, 150, False, None, {}),
    (40, 40, True, 0.3, {}),
    (70, 150, True, None, {"softcap": 1.5}),
    (65, 65, True, None, {"sinks": (1.0, -np.inf)}),
    (63, 129, False, 0.3, {"softcap": 1.5, "sinks": (0.5, 3.0)}),
]


@pytest.fixture(scope="module")
def emulation():
    reason = cuda_emulation.flash.unavailable_reason()
    if reason:
        pytest.skip(f"host emulation not built: {reason}")
    return cuda_emulation


def inputs(rng, dtype: str, shapes, spread: float = 1.0):
    return [round_to(spread * rng.standard_normal(shape), dtype) for shape in shapes]


@pytest.mark.parametrize("head_dim", FLASH_HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_flash_kernel_matches_the_oracle_and_its_log_sum_exp(emulation, dtype, head_dim):
    impl = emulation.flash
    rng = np.random.default_rng([head_dim, len(dtype)])
    for tq, tk, causal, scale, modifiers in FLASH_CASES:
        # spread 3: scaled scores well past a cap of 1.5
        spread = 3.0 if "softcap" in modifiers else 1.0
        q, k, v = inputs(rng, dtype, [(2, 2, tq, head_dim), *[(2, 2, tk, head_dim)] * 2], spread)
        native = [impl.from_numpy(x, dtype) for x in (q, k, v)]
        out, lse = impl.attention_and_lse(*native, causal=causal, scale=scale, **modifiers)
        where = (
            f"flash {dtype} D={head_dim} Tq={tq} Tk={tk} causal={causal} scale={scale} {modifiers}"
        )
        assert impl.dtype_name(out) == dtype, f"{where}: out is {out.dtype}"
        comparison = compare_to_oracle(
            impl.to_numpy(out).astype(np.float64), q, k, v, dtype=dtype, causal=causal,
            scale=scale, **modifiers,
        )  # fmt: skip
        assert comparison.ok, f"{where}: {comparison.describe()}"
        # (B, H, Tq), the sink left out
        expected = reference_log_sum_exp(q, k, causal=causal, scale=scale, **modifiers)
        # float32 log-sum-exp of scores that are exact products of the inputs: a few ulps.
        np.testing.assert_allclose(lse, expected, rtol=1e-5, atol=1e-5, err_msg=where)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_naive_kernels_match_the_oracle(emulation, causal):
    impl = emulation.naive
    rng = np.random.default_rng(7)
    for tq, tk, d, dv, scale in [(1, 1, 8, 8, None), (20, 33, 16, 24, None), (9, 140, 5, 3, 0.7)]:
        q, k, v = inputs(rng, "float32", [(2, 3, tq, d), (2, 3, tk, d), (2, 3, tk, dv)])
        out = impl.attention(*(impl.from_numpy(x, "float32") for x in (q, k, v)), causal=causal,
                             scale=scale)  # fmt: skip
        comparison = compare_to_oracle(
            out.astype(np.float64), q, k, v, dtype="float32", causal=causal, scale=scale
        )
        assert comparison.ok, (
            f"naive Tq={tq} Tk={tk} D={d} Dv={dv} scale={scale}: {comparison.describe()}"
        )


@pytest.mark.parametrize(
    ("missing", "reported"),
    [
        (0, ""),
        (1, "reads a shared-memory chunk another warp wrote"),
        (2, "writes a shared-memory chunk another warp read"),
    ],
    ids=["both-barriers", "no-barrier-after-the-wait", "no-barrier-before-the-next-copy"],
)
def test_the_emulation_reports_a_race_exactly_when_a_barrier_is_missing(
    emulation, missing, reported
):
    """Warp 0 copies a tile in with cp.async and both warps read it with ldmatrix, twice: the
    race check of host_cuda.h must see a barrier left out, whichever fiber ran first."""
    race = emulation.library().run_race_probe(missing).decode()
    if reported:
        assert reported in race, f"missing barrier {missing}: reported {race!r}"
    else:
        assert race == "", f"every barrier in place, but reported {race!r}"
