"""The speed estimate of perf/kernel_estimate.py reads the right loops: in each tensor-core kernel's
SASS, each of its three key-tile loops holds exactly the m16n8k16 instructions the tiling implies,
and the loop over whole tiles computes no mask. Needs NVRTC,
cuobjdump and nvdisasm (attnspec's nvrtc extra): skipped without them, saying so, unless
ATTNSPEC_REQUIRE_NVRTC=1."""

from __future__ import annotations

import os

import pytest

from impls.cuda_kernels import FLASH_HEAD_DIMS, NvrtcUnavailable
from impls.numpy_flash import BLOCK_N
from perf.kernel_estimate import (
    ARCH,
    KernelLoops,
    ToolMissing,
    disassemble,
    expected_mmas,
    key_tile_loops,
    tile_kinds,
)
from tests.nvrtc_once import compiled_once


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> bytes:
    try:
        return compiled_once(tmp_path_factory, "cupy_flash", ARCH)[1]
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
    loops = key_tile_loops(sass, kernel)
    # a window's edge, the tiles every row sees whole, the diagonal and the tile past Tk
    assert len(loops) == 3, f"{kernel}: {len(loops)} loops hold HMMA, but should be 3"
    for loop in loops:
        assert loop.mmas == expected_mmas(head_dim), (
            f"{kernel}: {loop.mmas} HMMA in a key-tile loop, but the tiling implies "
            f"{expected_mmas(head_dim)} per key tile: {dict(loop.opcodes)}"
        )
    assert sass.count("HMMA") == 3 * expected_mmas(head_dim), f"{kernel}: an HMMA outside the loops"
    kinds = KernelLoops.from_sass(sass, kernel)
    # The mask selects -inf or the scaled score for each of a thread's BLOCK_N / 2 scores.
    selects = {kind: loop.opcodes["FSEL"] for kind, loop in vars(kinds).items()}
    assert selects["whole"] < BLOCK_N // 2 <= selects["masked"], (
        f"{kernel}: FSEL per tile {selects}, but a masked tile needs one per score (BLOCK_N / 2 "
        "a thread) and a whole tile should compute no mask"
    )
    assert 0 < kinds.masked.issue_ceiling < kinds.whole.issue_ceiling <= 1


def test_tile_kinds_count_the_diagonal_and_the_partial_tiles():
    # T = 1024: 16 query blocks, block i visits tiles 0 .. i, the last on the diagonal
    assert tile_kinds(1024, causal=True) == (120, 16)
    # without the mask every block visits all 16 tiles, the last one partial
    assert tile_kinds(1000, causal=False) == (16 * 15, 16)
