"""The speed estimate of perf/kernel_estimate.py reads the right loop: in each tensor-core kernel's
SASS, the key-tile loop holds exactly the m16n8k16 instructions the tiling implies. Needs NVRTC,
cuobjdump and nvdisasm (attnspec's nvrtc extra): skipped without them, saying so, unless
ATTNSPEC_REQUIRE_NVRTC=1."""

from __future__ import annotations

import os

import pytest

from impls.cuda_kernels import FLASH_HEAD_DIMS, NvrtcUnavailable, compile_to_cubin
from perf.kernel_estimate import ARCH, ToolMissing, disassemble, expected_mmas, main_loop


@pytest.fixture(scope="module")
def cubin() -> bytes:
    try:
        return compile_to_cubin("cupy_flash", ARCH)[1]
    except NvrtcUnavailable as exc:
        if os.environ.get("ATTNSPEC_REQUIRE_NVRTC") == "1":
            pytest.fail(f"ATTNSPEC_REQUIRE_NVRTC=1, but {exc}")
        pytest.skip(f"no NVRTC: {exc}")


@pytest.mark.parametrize("head_dim", FLASH_HEAD_DIMS)
@pytest.mark.parametrize("format_", ["bf16", "f16"])
def test_the_key_tile_loop_holds_the_tiles_mmas(cubin, format_, head_dim):
    kernel = f"flash_{format_}_d{head_dim}"
    try:
        sass = disassemble(cubin, kernel)
    except ToolMissing as exc:
        if os.environ.get("ATTNSPEC_REQUIRE_NVRTC") == "1":
            pytest.fail(f"ATTNSPEC_REQUIRE_NVRTC=1, but {exc}")
        pytest.skip(str(exc))
    loop = main_loop(sass, kernel)
    assert loop.mmas == expected_mmas(head_dim), (
        f"{kernel}: {loop.mmas} HMMA in the loop found, but the tiling implies "
        f"{expected_mmas(head_dim)} per key tile: {dict(loop.opcodes)}"
    )
    assert sass.count("HMMA") == loop.mmas, f"{kernel}: an HMMA outside the loop found"
    assert 0 < loop.issue_ceiling <= 1
