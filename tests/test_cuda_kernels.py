"""Every CUDA kernel compiles with NVRTC for sm_80 and sm_90, with no register spills and static
shared memory within the per-block limit; the table of registers and shared memory per kernel
prints at the end of the run. Needs cuda-bindings and nvidia-cuda-nvrtc (no GPU): without them
these tests skip, saying so, unless ATTNSPEC_REQUIRE_NVRTC=1 (tox's numpy env installs them)."""

from __future__ import annotations

import os

import pytest

from impls.cuda_kernels import (
    ARCHITECTURES,
    SOURCES,
    NvrtcUnavailable,
    parse_ptxas_log,
)
from tests.nvrtc_once import compiled_once

KERNEL_RESOURCES = pytest.StashKey[list]()

# ptxas -v for one entry point of an early cupy_flash.cu on sm_90 (NVRTC 13.5), which spilled.
SPILLING_LOG = """\
ptxas info    : Compiling entry function 'flash_f16_d32' for 'sm_90'
ptxas info    : Function properties for flash_f16_d32
ptxas         .     24 bytes stack frame, 28 bytes spill stores, 48 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 24 bytes cumulative stack size, 10240 bytes smem
"""


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("source_name", list(SOURCES))
def test_kernels_compile_without_spills_within_shared_memory(
    source_name, arch, request, tmp_path_factory
):
    try:
        log, _ = compiled_once(tmp_path_factory, source_name, arch)
    except NvrtcUnavailable as exc:
        if os.environ.get("ATTNSPEC_REQUIRE_NVRTC") == "1":
            pytest.fail(f"ATTNSPEC_REQUIRE_NVRTC=1, but {exc}")
        pytest.skip(f"NVRTC compile check not run: {exc}")
    resources = parse_ptxas_log(log, source_name, arch)
    request.config.stash.setdefault(KERNEL_RESOURCES, []).extend(resources)
    compiled = {r.kernel for r in resources}
    missing = set(SOURCES[source_name].entry_points) - compiled
    assert not missing, (
        f"{SOURCES[source_name].filename} for {arch} defines no entry point {sorted(missing)}; "
        f"ptxas reported {sorted(compiled)}"
    )
    problems = [f"{r.kernel}: {p}" for r in resources for p in r.problems()]
    assert not problems, f"{SOURCES[source_name].filename} for {arch}: " + "; ".join(problems)


def test_a_spilling_kernel_is_reported_as_a_problem():
    (resources,) = parse_ptxas_log(SPILLING_LOG, "cupy_flash", "sm_90")
    assert (resources.kernel, resources.registers, resources.shared_memory) == (
        "flash_f16_d32",
        80,
        10240,
    )
    assert resources.problems() == ["spills registers (28 bytes stored, 48 bytes loaded)"]
