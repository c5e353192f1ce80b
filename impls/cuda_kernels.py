"""The CUDA sources of the CuPy built-ins, their compile options, and an NVRTC compile check.

Each ``.cu`` file under ``impls/`` is named here with the options it is compiled with (the flash
kernel takes its tile sizes from :mod:`impls.numpy_flash`, so the CPU mirror and the GPU kernel
cannot drift apart) and the entry points it must define. ``cupy_arrays`` compiles them through
``cupy.RawModule`` on a GPU; :func:`compile_with_nvrtc` compiles them with NVRTC from the PyPI
packages ``cuda-bindings`` and ``nvidia-cuda-nvrtc`` (no GPU or driver needed) and reads what
ptxas reports per kernel: registers, spills, static shared memory.

``python -m impls.cuda_kernels`` prints that report for sm_80 and sm_90.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from impls.numpy_flash import BLOCK_M, BLOCK_N

KERNEL_DIR = Path(__file__).parent
COMMON_OPTIONS = ("-std=c++17",)
# cupy.RawModule appends these to every compile (CuPy 14), after the caller's options; NVRTC lets
# the last -ftz win, so the kernels flush float32 subnormals to zero. The compile check adds them
# too, so that it compiles what CuPy compiles.
CUPY_APPENDED_OPTIONS = ("-ftz=true",)
ARCHITECTURES = ("sm_80", "sm_90")
# Static shared memory is capped at 48 KiB per block on every architecture; more needs dynamic
# shared memory and an opt-in attribute, which these kernels do not use.
STATIC_SHARED_MEMORY_LIMIT = 48 * 1024
FLASH_HEAD_DIMS = (32, 64, 128)


@dataclass(frozen=True)
class KernelSource:
    filename: str
    options: tuple[str, ...]
    entry_points: tuple[str, ...]

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.filename

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def backward_entry_points(head_dim: int, softcap: bool = False) -> tuple[str, str]:
    """The backward's two kernels for ``head_dim``, float32 (dK and dV, then dQ)."""
    name = f"flash_backward_d{head_dim}" + ("_softcap" if softcap else "")
    return f"{name}_dk_dv", f"{name}_dq"


KERNEL_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
# The FP4 caches' formats (spec.block_scaled) the tensor-core kernels decode, q in 16 bits
FP4_KERNEL_FORMATS = ("nvfp4", "mxfp4")


def flash_entry_point(dtype: str, head_dim: int, softcap: bool = False) -> str:
    """The flash kernel for ``dtype`` and ``head_dim``, the one with a softcap compiled in when
    ``softcap``."""
    return f"flash_{KERNEL_DTYPES[dtype]}_d{head_dim}" + ("_softcap" if softcap else "")


def fp4_entry_point(dtype: str, fp4_format: str, head_dim: int) -> str:
    """The tensor-core kernel for q in ``dtype`` (float16, bfloat16) over an FP4 cache of
    ``fp4_format`` (FP4_KERNEL_FORMATS)."""
    return f"flash_{KERNEL_DTYPES[dtype]}_{fp4_format}_d{head_dim}"


def sparse_entry_point(head_dim: int, softcap: bool = False) -> str:
    """The index-sparse forward (kv_indices) for ``head_dim``, float32."""
    return f"flash_sparse_d{head_dim}" + ("_softcap" if softcap else "")


# The FP8 formats the FP8 kernels read, by their PTX names
FP8_KERNEL_FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def fp8_entry_point(fp8_format: str, head_dim: int) -> str:
    """The FP8 kernel (FlashAttention 3's convention) for ``fp8_format`` and ``head_dim``."""
    return f"flash_{FP8_KERNEL_FORMATS[fp8_format]}_d{head_dim}"


def mx_entry_point(fp8_format: str, head_dim: int) -> str:
    """The MXFP8 kernel (spec.block_scaled's mx_attention) for ``fp8_format`` and ``head_dim``."""
    return f"flash_mx_{FP8_KERNEL_FORMATS[fp8_format]}_d{head_dim}"


SOURCES = {
    "cupy_naive": KernelSource(
        "cupy_naive.cu", (), ("attention_scores", "softmax_rows", "weighted_values")
    ),
    "cupy_flash": KernelSource(
        "cupy_flash.cu",
        (f"-DBLOCK_M={BLOCK_M}", f"-DBLOCK_N={BLOCK_N}"),
        tuple(
            flash_entry_point(dtype, head_dim, softcap)
            for dtype in ("float16", "bfloat16", "float32")
            for head_dim in FLASH_HEAD_DIMS
            for softcap in (False, True)
        )
        + tuple(
            kernel
            for head_dim in FLASH_HEAD_DIMS
            for softcap in (False, True)
            for kernel in backward_entry_points(head_dim, softcap)
        )
        + tuple(fp8_entry_point(fmt, d) for fmt in FP8_KERNEL_FORMATS for d in FLASH_HEAD_DIMS)
        + tuple(mx_entry_point(fmt, d) for fmt in FP8_KERNEL_FORMATS for d in FLASH_HEAD_DIMS)
        + tuple(
            fp4_entry_point(dtype, fmt, d)
            for dtype in ("float16", "bfloat16")
            for fmt in FP4_KERNEL_FORMATS
            for d in FLASH_HEAD_DIMS
        )
        + tuple(
            sparse_entry_point(head_dim, softcap)
            for head_dim in FLASH_HEAD_DIMS
            for softcap in (False, True)
        ),
    ),
}


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one entry point on one architecture."""

    source: str
    kernel: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    shared_memory: int

    def problems(self) -> list[str]:
        found = []
        if self.spill_stores or self.spill_loads:
            stored, loaded = self.spill_stores, self.spill_loads
            found.append(f"spills registers ({stored} bytes stored, {loaded} bytes loaded)")
        if self.shared_memory > STATIC_SHARED_MEMORY_LIMIT:
            found.append(
                f"uses {self.shared_memory} bytes of static shared memory, over the "
                f"{STATIC_SHARED_MEMORY_LIMIT}-byte per-block limit"
            )
        return found


class NvrtcUnavailable(RuntimeError):
    """cuda-bindings or the NVRTC library is not installed."""


class CompileError(RuntimeError):
    """NVRTC rejected a source; the message carries its log."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise NvrtcUnavailable(
            "cuda-bindings is not installed (pip install 'attnspec[nvrtc]')"
        ) from exc
    try:
        nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load libnvrtc lazily
        raise NvrtcUnavailable(
            f"NVRTC could not be loaded ({type(exc).__name__}: {exc}); "
            "pip install nvidia-cuda-nvrtc"
        ) from exc
    return nvrtc


def _check(nvrtc, result, what: str) -> tuple:
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {status.name}")
    return tuple(values)


def compile_with_nvrtc(name: str, arch: str) -> tuple[str, list[KernelResources]]:
    """Compile source ``name`` for ``arch``: (ptxas log, resources of each entry point)."""
    log, _ = compile_to_cubin(name, arch)
    return log, parse_ptxas_log(log, name, arch)


def compile_to_cubin(name: str, arch: str) -> tuple[str, bytes]:
    """Compile source ``name`` for ``arch`` as CuPy does: (ptxas log, the cubin)."""
    nvrtc = _nvrtc()
    source = SOURCES[name]
    (program,) = _check(
        nvrtc,
        nvrtc.nvrtcCreateProgram(source.text().encode(), source.filename.encode(), 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        options = [
            f"--gpu-architecture={arch}".encode(),
            b"--ptxas-options=-v",
            *(
                option.encode()
                for option in COMMON_OPTIONS + source.options + CUPY_APPENDED_OPTIONS
            ),
        ]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        (size,) = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        log_buffer = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(program, log_buffer), "nvrtcGetProgramLog")
        log = log_buffer.rstrip(b"\x00 ").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{source.filename} for {arch}: {status.name}\n{log}")
        (size,) = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return log, cubin


ENTRY = re.compile(r"Compiling entry function '(?P<kernel>\w+)' for '(?P<arch>\w+)'")
FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads"
)
USAGE = re.compile(r"Used (?P<registers>\d+) registers")
SHARED = re.compile(r"(?P<smem>\d+) bytes smem")


def parse_ptxas_log(log: str, source: str, arch: str) -> list[KernelResources]:
    """One :class:`KernelResources` per entry point in ptxas's ``-v`` report."""
    found: list[KernelResources] = []
    kernel, frame = None, None
    for line in log.splitlines():
        if match := ENTRY.search(line):
            kernel, frame = match["kernel"], None
        elif kernel and (match := FRAME.search(line)):
            frame = match
        elif kernel and frame and (match := USAGE.search(line)):
            shared = SHARED.search(line)
            found.append(
                KernelResources(
                    source=source,
                    kernel=kernel,
                    arch=arch,
                    registers=int(match["registers"]),
                    spill_stores=int(frame["stores"]),
                    spill_loads=int(frame["loads"]),
                    stack_frame=int(frame["stack"]),
                    shared_memory=int(shared["smem"]) if shared else 0,
                )
            )
            kernel = None
    return found


def report_lines(resources: list[KernelResources]) -> list[str]:
    header = ("kernel", "arch", "registers", "spills (st/ld B)", "stack B", "smem B")
    rows = [header] + [
        (
            f"{r.source}:{r.kernel}",
            r.arch,
            str(r.registers),
            f"{r.spill_stores}/{r.spill_loads}",
            str(r.stack_frame),
            str(r.shared_memory),
        )
        for r in resources
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]


def main() -> int:
    try:
        resources = [
            kernel
            for name in SOURCES
            for arch in ARCHITECTURES
            for kernel in compile_with_nvrtc(name, arch)[1]
        ]
    except (NvrtcUnavailable, CompileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(resources)))
    problems = [f"{r.kernel} ({r.arch}): {p}" for r in resources for p in r.problems()]
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
