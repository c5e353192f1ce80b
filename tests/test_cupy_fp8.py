"""``cupy_flash``'s FP8 declarations and its device arrays for FP8, where they can be checked
without a GPU (tests/test_cuda_emulation.py runs the FP8 kernels themselves on the host)."""

from __future__ import annotations

import numpy as np
import pytest

from impls.cupy_arrays import Fp8DeviceArray
from impls.cupy_flash import FLASH_CAPABILITIES, CupyFlash


def test_an_fp8_device_array_names_its_format_and_holds_bytes():
    bits = np.zeros((1, 2, 3, 32), np.uint8)  # a cupy.ndarray on a GPU; only its dtype is read
    array = Fp8DeviceArray(bits, "float8_e5m2")
    assert (array.shape, array.ndim, array.dtype) == ((1, 2, 3, 32), 4, "float8_e5m2")
    with pytest.raises(ValueError, match="format='e4m3', but should be one of float8_e4m3fn"):
        Fp8DeviceArray(bits, "e4m3")
    with pytest.raises(TypeError, match="bits of dtype float16, but should be uint8"):
        Fp8DeviceArray(bits.astype(np.float16), "float8_e4m3fn")


def test_before_sm_89_cupy_flash_declares_fp8_under_the_cache_convention_only(monkeypatch):
    """FlashAttention 3's convention runs on FP8 tensor cores, which sm_80 lacks; the key/value
    cache's widens k and v to q's dtype and runs anywhere."""
    monkeypatch.setattr(CupyFlash, "unavailable_reason", lambda self: None)
    monkeypatch.setattr(CupyFlash, "compute_capability", lambda self: 80)
    assert CupyFlash().capabilities.fp8_conventions == ("kv_scale",)
    # MXFP8 runs on the FP8 tensor cores; the FP4 caches decode to q's 16 bits
    assert CupyFlash().capabilities.block_conventions == ("fp4_cache",)
    monkeypatch.setattr(CupyFlash, "compute_capability", lambda self: 90)
    assert CupyFlash().capabilities == FLASH_CAPABILITIES
    assert FLASH_CAPABILITIES.fp8_conventions == ("descale", "kv_scale")


def test_an_fp4_cache_leaves_the_16_bit_tiles_only_where_a_value_would_leave_their_range():
    """A block of zeros (e8m0's code 0, 2^-127) decodes to zeros in any dtype and keeps the tiles;
    a block of keys at 2^16 decodes past float16's 65504, not past bfloat16's range."""
    from impls.cupy_flash import decodes_exactly
    from spec.block_scaled import quantize_call

    x = np.random.default_rng(0).standard_normal((1, 1, 32, 64))
    x[0, 0, 3, :32] = 0
    large = x.copy()
    large[0, 0, 5, :32] *= 2.0**16
    for k, fits in ((x, {"float16": True, "bfloat16": True}),
                    (large, {"float16": False, "bfloat16": True})):  # fmt: skip
        call = quantize_call(x, k, x, "fp4_cache", "mxfp4", "float16")
        cache = (call.k, call.keywords["k_block_scales"], call.v, call.keywords["v_block_scales"])
        assert {dtype: decodes_exactly("mxfp4", dtype, *cache) for dtype in fits} == fits
