"""The CUDA kernels of ``impls/*.cu``, compiled for the host with ``host_cuda.h`` and called on
NumPy arrays through ctypes: where no GPU is at hand, the kernels' own code still runs.

``flash`` and ``naive`` are implementations for the suite: ``python -m pytest conformance --impl
tests.cuda_emulation:flash`` judges impls/cupy_flash.cu's kernels, launched on the host as
``impls/cupy_naive.py`` and ``impls/cupy_flash.py`` launch them on a GPU. What the emulation
cannot show: the hardware's own rounding inside mma.sync, timing, races through plain
shared-memory loads and stores (host_cuda.h tracks only cp.async and ldmatrix), and anything CuPy
adds."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from impls.contract import Implementation, resolve_scale, validate_inputs
from impls.cuda_kernels import (
    FLASH_HEAD_DIMS,
    SOURCES,
    backward_entry_points,
    flash_entry_point,
    fp4_entry_point,
    fp8_entry_point,
    mx_entry_point,
    sparse_entry_point,
)
from impls.cupy_arrays import bfloat16_bits, bfloat16_values
from impls.cupy_flash import FLASH_CAPABILITIES, CupyFlash, kernel_softcap
from impls.cupy_naive import CupyNaive
from spec.fp8 import FP8_FORMATS
from spec.fp8 import numpy_dtype as fp8_numpy_dtype
from tests.made_once import made_once

HERE = Path(__file__).parent
SOURCES_TO_BUILD = [HERE / "flash.cpp", HERE / "naive.cpp", HERE / "races.cpp"]
LIBRARY = "attnspec_cuda_emulation.so"
STORAGE = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32, "uint8": np.uint8}


class EmulationUnavailable(RuntimeError):
    """No C++20 compiler to build the emulation with."""


def build_command(library: Path) -> list[str]:
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise EmulationUnavailable("no g++ or clang++ on PATH to build the host emulation")
    return [
        # No _FORTIFY_SOURCE: its checked longjmp refuses to jump between fiber stacks.
        compiler, "-std=c++20", "-O1", "-U_FORTIFY_SOURCE", "-shared", "-fPIC",
        *SOURCES["cupy_flash"].options, *map(str, SOURCES_TO_BUILD), "-o", str(library),
    ]  # fmt: skip


def compile_into(directory: Path) -> None:
    """Compile the emulated kernels into ``directory`` (made if missing) as LIBRARY."""
    directory.mkdir(parents=True, exist_ok=True)
    command = build_command(directory / LIBRARY)
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"building the emulation failed: {' '.join(command)}\n{built.stderr}")


def built_once(directory: Path) -> ctypes.CDLL:
    """The emulation from ``directory``, keyed by what it is built from (the sources it
    includes and the compile command), built there by the first process to ask: a run's
    workers, two per implementation under -n 2, each compiled it (5 s) before."""
    kernels = (HERE.parent.parent / "impls").glob("*.cu")
    sources = sorted({*SOURCES_TO_BUILD, *HERE.glob("*.h"), *kernels})
    key = hashlib.sha256(" ".join(build_command(Path(LIBRARY))).encode())
    for source in sources:
        key.update(source.read_bytes())
    directory.mkdir(parents=True, exist_ok=True)
    built = made_once(directory / f"attnspec-cuda-emulation-{key.hexdigest()[:24]}", compile_into)
    return load(built / LIBRARY)


def load(library: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library))
    pointer, integer, real = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.run_flash.argtypes = [
        ctypes.c_char_p, *[pointer] * 5, *[integer] * 3, real, *[integer] * 3, real, pointer,
        integer, pointer, pointer,
    ]  # fmt: skip
    lib.run_flash.restype = integer
    lib.run_flash_fp8.argtypes = [
        ctypes.c_char_p, *[pointer] * 5, *[integer] * 3, real, integer, integer, *[pointer] * 3,
    ]  # fmt: skip
    lib.run_flash_fp8.restype = integer
    lib.run_flash_mx.argtypes = lib.run_flash_fp8.argtypes
    lib.run_flash_mx.restype = integer
    lib.run_flash_fp4.argtypes = [
        ctypes.c_char_p, *[pointer] * 5, *[integer] * 3, real, integer, integer, *[pointer] * 4,
    ]  # fmt: skip
    lib.run_flash_fp4.restype = integer
    lib.emulated_pack_e4m3.argtypes = [real, real]
    lib.emulated_pack_e4m3.restype = ctypes.c_ushort
    lib.emulated_fp8_value.argtypes = [ctypes.c_ubyte, integer]
    lib.emulated_fp8_value.restype = real
    lib.emulated_e8m0_value.argtypes = [ctypes.c_ubyte]
    lib.emulated_e8m0_value.restype = real
    lib.run_flash_backward.argtypes = [
        ctypes.c_char_p, *[pointer] * 7, *[integer] * 5, real, *[integer] * 2, real,
        *[pointer] * 5,
    ]  # fmt: skip
    lib.run_flash_backward.restype = integer
    lib.run_flash_sparse.argtypes = [
        ctypes.c_char_p, *[pointer] * 5, *[integer] * 3, real, *[integer] * 3, real, pointer,
        integer, pointer, integer, pointer,
    ]  # fmt: skip
    lib.run_flash_sparse.restype = integer
    lib.run_naive.argtypes = [*[pointer] * 5, *[integer] * 5, real, integer, integer]
    lib.run_naive.restype = None
    lib.emulation_race.argtypes = []
    lib.emulation_race.restype = ctypes.c_char_p
    lib.run_race_probe.argtypes = [ctypes.c_int]
    lib.run_race_probe.restype = ctypes.c_char_p
    return lib


def storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values exact in ``dtype`` as the kernels' element type (bfloat16 as its bits, FP8
    in ml_dtypes' dtypes, whose bytes the kernels read)."""
    if dtype == "bfloat16":
        return np.ascontiguousarray(bfloat16_bits(values))
    if dtype in FP8_FORMATS:
        return np.ascontiguousarray(values, dtype=fp8_numpy_dtype(dtype))
    return np.ascontiguousarray(values, dtype=STORAGE[dtype])


def _address(array: np.ndarray) -> int:
    return array.ctypes.data


def checked_launch(status: int, kernel: str, unknown: str) -> None:
    """After a launch through the library: ``unknown`` where it had no kernel of that name
    (status 1), and the first shared-memory race the emulation saw, as errors."""
    if status != 0:
        raise ValueError(unknown)
    race = library().emulation_race().decode()
    if race:
        raise RuntimeError(f"{kernel}: shared-memory race: {race}")


@functools.cache
def library() -> ctypes.CDLL:
    """The emulation, built once for every process of this machine that asks for the same."""
    return built_once(Path(tempfile.gettempdir()))


class EmulatedKernels(Implementation):
    """Arrays as ``cupy_arrays`` keeps them (bfloat16 as uint16 bits), in host memory."""

    family = "numpy"
    device = "cpu"

    def version(self) -> str:
        return f"{self.source} on the host through tests/cuda_emulation, numpy {np.__version__}"

    def unavailable_reason(self) -> str | None:
        if shutil.which("g++") is None and shutil.which("clang++") is None:
            return "no g++ or clang++ on PATH to build the host emulation"
        return None

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        return storage(array, dtype)

    def to_numpy(self, native) -> np.ndarray:
        return bfloat16_values(native) if native.dtype == np.uint16 else native

    def dtype_name(self, native) -> str:
        return "bfloat16" if native.dtype == np.uint16 else str(native.dtype)

    def fp8_bits(self, native: np.ndarray, label: str) -> np.ndarray:
        return native.view(np.uint8)

    def check(self, q, k, v, *, causal, scale, **variant) -> str:
        gqa = self.capabilities.gqa
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=gqa, **variant)
        dtype = self.dtype_name(q)
        if dtype not in self.capabilities.dtypes:
            raise TypeError(f"q.dtype={q.dtype}, but should be one of {self.capabilities.dtypes}")
        return dtype


class EmulatedCupyFlash(EmulatedKernels):
    """``cupy_flash``'s kernels, launched on the host as ``CupyFlash`` launches them on a GPU."""

    name = "cupy_flash_emulated"
    source = "impls/cupy_flash.cu"
    capabilities = FLASH_CAPABILITIES

    # CupyFlash's, over this class's attention_and_lse, fp8_kernel and backward_kernels: the same
    # keywords, the same answer
    attention = CupyFlash.attention
    fp8_attention = CupyFlash.fp8_attention
    block_scaled_attention = CupyFlash.block_scaled_attention
    fp4_cache_attention = CupyFlash.fp4_cache_attention
    sparse_attention_and_lse = CupyFlash.sparse_attention_and_lse
    vjp = CupyFlash.vjp

    def sparse_kernel(self, q, k, v, keys, counted, *, causal, scale, window, softcap, sinks):
        batch, heads, tq, d = q.shape
        out = np.empty_like(q)  # (B, H, Tq, D)
        lse = np.empty((batch, heads, tq), dtype=np.float32)  # (B, H, Tq)
        kernel = sparse_entry_point(d, softcap=softcap is not None)
        optional = [None if x is None else _address(x) for x in (sinks, counted)]
        status = library().run_flash_sparse(
            kernel.encode(), *map(_address, (q, k, v, out, lse)), batch * heads, tq,
            k.shape[-2], scale, int(causal), heads // k.shape[1], -1 if window is None else window,
            kernel_softcap(softcap), optional[0], heads, _address(keys), keys.shape[-1],
            optional[1],
        )  # fmt: skip
        checked_launch(status, kernel, f"no sparse kernel {kernel}")
        return out, lse

    def fp8_kernel(self, q, k, v, *, causal, scale, descales):
        # q, k and v share a format the kernels read: fp8_attention's checked_scales saw to it
        batch, heads, tq, d = q.shape
        kernel = fp8_entry_point(self.dtype_name(q), d)
        q, k, v = (np.ascontiguousarray(x).view(np.uint8) for x in (q, k, v))
        out = np.empty(q.shape, dtype=np.uint16)  # (B, H, Tq, D), bfloat16 bits
        status = library().run_flash_fp8(
            kernel.encode(), *map(_address, (q, k, v, out)), None, batch * heads, tq,
            k.shape[-2], scale, int(causal), heads // k.shape[1], *map(_address, descales),
        )  # fmt: skip
        checked_launch(status, kernel, f"no FP8 kernel {kernel}")
        return out

    def mx_kernel(self, q, k, v, q_scales, k_scales, v_scales, *, fmt, causal, scale):
        batch, heads, tq, d = q.shape
        kernel = mx_entry_point(fmt, d)
        out = np.empty(q.shape, dtype=np.uint16)  # (B, H, Tq, D), bfloat16 bits
        lse = np.empty((batch, heads, tq), dtype=np.float32)  # (B, H, Tq)
        status = library().run_flash_mx(
            kernel.encode(), *map(_address, (q, k, v, out, lse)), batch * heads, tq, k.shape[-2],
            scale, int(causal), heads // k.shape[1], *map(_address, (q_scales, k_scales, v_scales)),
        )  # fmt: skip
        checked_launch(status, kernel, f"no MXFP8 kernel {kernel}")
        return out, lse

    def fp4_kernel(self, q, k, v, k_scales, v_scales, global_scales, *, fmt, causal, scale):
        batch, heads, tq, d = q.shape
        kernel = fp4_entry_point(self.dtype_name(q), fmt, d)
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
        out = np.empty_like(q)  # (B, H, Tq, D)
        lse = np.empty((batch, heads, tq), dtype=np.float32)  # (B, H, Tq)
        status = library().run_flash_fp4(
            kernel.encode(), *map(_address, (q, k, v, out, lse)), batch * heads, tq, k.shape[-2],
            scale, int(causal), heads // k.shape[1],
            *((None, None) if global_scales is None else map(_address, global_scales)),
            *map(_address, (k_scales, v_scales)),
        )  # fmt: skip
        checked_launch(status, kernel, f"no FP4 cache kernel {kernel}")
        return out, lse

    def backward_kernels(self, q, k, v, grad_out, lse, delta, grad_lse, *, causal, scale, window,
                         softcap, sinks, counts=None):  # fmt: skip
        batch, heads, tq, d = q.shape
        grads = [np.empty_like(x) for x in (q, k, v)]
        name = backward_entry_points(d, softcap=softcap is not None)[0].removesuffix("_dk_dv")
        optional = [None if x is None else _address(x) for x in (grad_lse, sinks, counts)]
        status = library().run_flash_backward(
            name.encode(), *map(_address, (q, k, v, grad_out, lse, delta)), optional[0],
            batch, heads, k.shape[1], tq, k.shape[-2], scale, int(causal),
            -1 if window is None else window, kernel_softcap(softcap), optional[1], optional[2],
            *map(_address, grads),
        )  # fmt: skip
        checked_launch(status, name, f"no backward kernel {name}")
        return tuple(grads)

    def attention_and_lse(
        self, q, k, v, *, causal=True, scale=None, window=None, softcap=None, sinks=None,
        kv_scales=None,
    ):  # fmt: skip
        dtype = self.check(
            q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks
        )
        batch, heads, tq, d = q.shape
        if d not in FLASH_HEAD_DIMS or v.shape[-1] != d:
            raise ValueError(f"D={d}, Dv={v.shape[-1]}: compiled for D = Dv in {FLASH_HEAD_DIMS}")
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
        out = np.empty_like(q)  # (B, H, Tq, D)
        lse = np.empty((batch, heads, tq), dtype=np.float32)  # (B, H, Tq)
        sink_logits = None if sinks is None else np.asarray(sinks, dtype=np.float32)  # (H,)
        kernel = flash_entry_point(dtype, d, softcap=softcap is not None)
        status = library().run_flash(
            kernel.encode(),
            *map(_address, (q, k, v, out, lse)),
            batch * heads, tq, k.shape[-2], resolve_scale(scale, d), int(causal),
            heads // k.shape[1], -1 if window is None else window,
            kernel_softcap(softcap), None if sink_logits is None else _address(sink_logits), heads,
            *((None, None) if kv_scales is None else map(_address, kv_scales)),
        )  # fmt: skip
        checked_launch(status, kernel, f"no flash kernel for dtype={dtype}, D={d}")
        return out, lse


class EmulatedCupyNaive(EmulatedKernels):
    """``cupy_naive``'s three kernels, launched on the host as ``CupyNaive`` launches them."""

    name = "cupy_naive_emulated"
    source = "impls/cupy_naive.cu"
    capabilities = CupyNaive.capabilities

    def attention(self, q, k, v, *, causal=True, scale=None):
        self.check(q, k, v, causal=causal, scale=scale)
        batch, heads, tq, d = q.shape
        tk, dv = k.shape[-2], v.shape[-1]
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
        scores = np.empty((batch * heads, tq, tk), dtype=np.float32)  # (B*H, Tq, Tk)
        out = np.empty((batch, heads, tq, dv), dtype=np.float32)  # (B, H, Tq, Dv)
        library().run_naive(
            *map(_address, (q, k, v, scores, out)),
            batch * heads, tq, tk, d, dv,
            resolve_scale(scale, d), int(scale is None), int(causal),
        )  # fmt: skip
        return out


flash = EmulatedCupyFlash()
naive = EmulatedCupyNaive()
