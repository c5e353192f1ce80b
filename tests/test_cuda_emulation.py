"""The CUDA kernels' own code, run on the host (tests/cuda_emulation): every flash kernel (dtype x
head dim, and its _softcap twin) at partial tiles, Tq < Tk, without the mask, with an explicit
scale and with sinks, its log-sum-exp, every FP8 kernel (format x head dim) and the key/value
cache's FP8 path, every block-scaled kernel (MXFP8, the FP4 caches), and the naive kernels, each
judged against the float64 oracle with the suite's tolerance budget; and the emulation's own FP8
conversions against spec.fp8, the kernels' e8m0 against spec.block_scaled. The whole suite on
them: ``--impl tests.cuda_emulation:flash``."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.fp8 import Fp8Inputs, compare_dequantized, compare_fp8, fp8_budget
from conformance.judge.tolerance import compare_lse, compare_to_oracle
from impls.cuda_kernels import FLASH_HEAD_DIMS, FP8_KERNEL_FORMATS
from spec.block_scaled import e8m0_values, stored_dtypes
from spec.block_scaled import output_dtype as block_output_dtype
from spec.block_scaled import quantize_call as quantize_block_call
from spec.dtypes import round_to
from spec.formula import naive_log_sum_exp, reference_log_sum_exp
from spec.fp8 import output_dtype, quantize_call, round_to_fp8, values_of_bytes
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


# (Tq, Tk, causal): one row; partial query blocks and key tiles with Tq < Tk, bottom-right; no
# mask. FP8 calls have no window, cap or sinks (impls.fp8_calls).
FP8_CASES = [(1, 1, True), (65, 130, True), (70, 150, False)]
# (convention, kv scale granularity, q's dtype under kv_scale): FlashAttention 3's on the FP8
# kernels, and the key/value cache's on the kernel of each dtype q may have
FP8_CALLS = [
    ("descale", None, None), ("kv_scale", "kv_head", "bfloat16"), ("kv_scale", "tensor", "float16"),
    ("kv_scale", "kv_head", "float32"),
]  # fmt: skip


@pytest.mark.parametrize("head_dim", FLASH_HEAD_DIMS)
@pytest.mark.parametrize("fmt", list(FP8_KERNEL_FORMATS))
def test_fp8_kernels_match_the_truth_within_their_budget(emulation, fmt, head_dim):
    """Two items, Hq = 4 over Hkv = 2, each (b, kv head) at its own amplitude (so every scale
    differs), quantized as each convention's callers do, held as the FP8 claims hold them."""
    impl = emulation.flash
    rng = np.random.default_rng([head_dim, len(fmt), 8])
    p_rounding = impl.capabilities.fp8_p
    for tq, tk, causal in FP8_CASES:
        amplitude = rng.uniform(0.5, 4.0, (2, 2, 1, 1))  # (B, Hkv, 1, 1)
        q = np.repeat(amplitude, 2, axis=1) * rng.standard_normal((2, 4, tq, head_dim))
        k, v = (amplitude * rng.standard_normal((2, 2, tk, head_dim)) for _ in range(2))
        for convention, kv_scale, query_dtype in FP8_CALLS:
            *stored, scales = quantize_call(q, k, v, fmt, convention, kv_scale, query_dtype)
            dtypes = (query_dtype or fmt, fmt, fmt)
            out = impl.attention(
                *(impl.from_numpy(x, dtype) for x, dtype in zip(stored, dtypes, strict=True)),
                causal=causal, **scales.keywords,
            )  # fmt: skip
            expected = output_dtype(convention, query_dtype, impl.capabilities.fp8_output)
            where = f"{fmt} D={head_dim} Tq={tq} Tk={tk} causal={causal} {convention} {kv_scale}"
            assert impl.dtype_name(out) == expected, f"{where}: out is {impl.dtype_name(out)}"
            comparison = compare_fp8(
                impl.to_numpy(out).astype(np.float64), Fp8Inputs(*stored, scales),
                causal=causal, scale=None, p_rounding=p_rounding, out_dtype=expected,
            )  # fmt: skip
            assert comparison.ok, f"{where}: {comparison.describe()}"


# (Tq, Tk, causal) for the block-scaled kernels: MXFP8's v scales run along the keys, 32 a block,
# so Tk is a multiple of 32; one row; partial query blocks, a key tile half past the end, Tq < Tk;
# no mask.
BLOCK_CASES = [(1, 32, True), (65, 160, True), (70, 96, False)]
# (convention, format, q's dtype): MXFP8 on the FP8 kernels; the FP4 caches on the kernel of each
# 16-bit q, and, for float32's q, decoded first for the float32 kernel
BLOCK_CALLS = [
    ("mx_attention", "mxfp8_e4m3", "float8_e4m3fn"), ("mx_attention", "mxfp8_e5m2", "float8_e5m2"),
    ("fp4_cache", "nvfp4", "bfloat16"), ("fp4_cache", "nvfp4", "float16"),
    ("fp4_cache", "mxfp4", "bfloat16"), ("fp4_cache", "mxfp4", "float16"),
    ("fp4_cache", "nvfp4", "float32"),
]  # fmt: skip


@pytest.mark.parametrize("head_dim", FLASH_HEAD_DIMS)
@pytest.mark.parametrize(("convention", "fmt", "query_dtype"), BLOCK_CALLS)
def test_block_scaled_kernels_match_the_truth_within_their_budget(
    emulation, convention, fmt, query_dtype, head_dim
):
    """Two items, Hq = 4 over Hkv = 2, each row at its own magnitude in 2^-8..2^8 (so neighbouring
    blocks' scales differ), quantized by the recipe, held as BLOCK-SCALES holds them; the
    log-sum-exp as BLOCK-MAGNITUDE holds it."""
    impl = emulation.flash
    rng = np.random.default_rng([head_dim, len(fmt), len(query_dtype)])
    for tq, tk, causal in BLOCK_CASES:
        q, k, v = (
            rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 9, (*shape[:-1], 1))
            for shape in ((2, 4, tq, head_dim), (2, 2, tk, head_dim), (2, 2, tk, head_dim))
        )
        options = dict(causal=causal, scale=None)
        out_dtype = block_output_dtype(convention, query_dtype, impl.capabilities.block_output)
        call = quantize_block_call(q, k, v, convention, fmt, query_dtype, options).with_(
            p_rounding=impl.capabilities.block_p_of(convention), out_dtype=out_dtype
        )
        dtypes = stored_dtypes(convention, fmt, query_dtype)
        stored = (call.q, call.k, call.v)
        natives = [impl.from_numpy(x, dtype) for x, dtype in zip(stored, dtypes, strict=True)]
        out, lse = impl.attention(*natives, causal=causal, return_lse=True, **call.keywords)
        where = f"{fmt} q in {query_dtype} D={head_dim} Tq={tq} Tk={tk} causal={causal}"
        assert impl.dtype_name(out) == out_dtype, f"{where}: out is {impl.dtype_name(out)}"
        true_inputs = call.dequantized()
        comparison = compare_dequantized(
            impl.to_numpy(out).astype(np.float64), true_inputs, call.baseline(),
            options=options, budget=fp8_budget(out_dtype, call.p_rounding),
        )  # fmt: skip
        assert comparison.ok, f"{where}: {comparison.describe()}"
        true_q, true_k, _ = true_inputs
        truth = reference_log_sum_exp(true_q, true_k, **options)
        naive = naive_log_sum_exp(true_q, true_k, dtype="float32", **options)
        lse_comparison = compare_lse(lse.astype(np.float64), truth, naive, dtype="float32")
        assert lse_comparison.ok, f"{where}: lse {lse_comparison.describe()}"


def test_an_fp4_cache_past_float16s_range_is_still_read_exactly_by_a_float16_q(emulation):
    """An MXFP4 block of keys at 2^16 decodes past 65504, which the float16 tiles cannot hold:
    the call reads that cache decoded in float32 and still matches the truth; the float16 kernel
    alone would not."""
    impl = emulation.flash
    rng = np.random.default_rng(16)
    q = rng.standard_normal((1, 2, 40, 64)) * 2.0**-12
    k, v = (rng.standard_normal((1, 2, 64, 64)) for _ in range(2))
    k[0, 1, 7, :32] *= 2.0**16  # one block of one key
    options = dict(causal=True, scale=None)
    call = quantize_block_call(q, k, v, "fp4_cache", "mxfp4", "float16", options).with_(
        p_rounding=impl.capabilities.block_p_of("fp4_cache"), out_dtype="float16"
    )
    stored = zip((call.q, call.k, call.v), ("float16", "uint8", "uint8"), strict=True)
    natives = [impl.from_numpy(x, dtype) for x, dtype in stored]
    out = impl.attention(*natives, causal=True, **call.keywords)
    judged = dict(true_inputs=call.dequantized(), baseline=call.baseline(), options=options,
                  budget=fp8_budget("float16", call.p_rounding))  # fmt: skip
    comparison = compare_dequantized(out.astype(np.float64), **judged)
    assert comparison.ok, comparison.describe()
    scales = [np.asarray(call.keywords[name]) for name in ("k_block_scales", "v_block_scales")]
    tiles_only, _ = impl.fp4_kernel(*natives, *scales, None, fmt="mxfp4", causal=True,
                                    scale=np.float32(64**-0.5))  # fmt: skip
    alone = compare_dequantized(tiles_only.astype(np.float64), **judged)
    assert not alone.ok, "the float16 tiles held a key past 65504"


def test_the_emulations_fp8_conversions_are_spec_fp8s(emulation):
    """Its decoding of every byte of e4m3fn and e5m2 (what its m16n8k32 reads), and its rounding
    of P to e4m3 (cvt.rn.satfinite: to nearest even, past 448 saturated, NaN kept), near every
    e4m3 value, at the ties and past the range."""
    library = emulation.library()
    for fmt, e5m2 in (("float8_e4m3fn", 0), ("float8_e5m2", 1)):
        decoded = np.array([library.emulated_fp8_value(byte, e5m2) for byte in range(256)])
        np.testing.assert_array_equal(decoded, values_of_bytes(fmt), err_msg=fmt)
    finite = np.unique(np.abs(values_of_bytes("float8_e4m3fn")[np.isfinite(values_of_bytes(
        "float8_e4m3fn"))]))  # fmt: skip
    ties = (finite[:-1] + finite[1:]) / 2
    values = np.concatenate([finite, ties, np.nextafter(ties, 0), np.nextafter(ties, 1),
                             [463.9, 464.0, 480.0, 1e6, np.inf]])  # fmt: skip
    values = np.concatenate([values, -values]).astype(np.float32)
    rounded = np.array([values_of_bytes("float8_e4m3fn")[library.emulated_pack_e4m3(x, 0) & 0xFF]
                        for x in values])  # fmt: skip
    expected = round_to_fp8(np.clip(values.astype(np.float64), -448, 448), "float8_e4m3fn")
    np.testing.assert_array_equal(rounded, expected)
    high = library.emulated_pack_e4m3(0.0, np.float32(np.nan)) >> 8
    assert high & 0x7F == 0x7F, f"NaN rounded to byte {high:#04x}, but should stay NaN"


def test_the_kernels_e8m0_decoding_is_spec_block_scaleds(emulation):
    """impls/cupy_flash.cu's own e8m0_value on every byte: 2^(code - 127), code 0 the float32
    subnormal 2^-127, 0xFF NaN."""
    library = emulation.library()
    decoded = np.array([library.emulated_e8m0_value(byte) for byte in range(256)])
    np.testing.assert_array_equal(decoded, e8m0_values(np.arange(256)).astype(np.float32))


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
