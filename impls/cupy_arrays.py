"""What the CuPy built-ins on CUDA share (``cupy_naive``, the document's kernel, and ``cupy_flash``,
one fused tensor-core kernel): CuPy arrays as native arrays, their checks and conversions, and
the kernels' compilation. Their sources are ``cupy_naive.cu`` and ``cupy_flash.cu``, listed in
:mod:`impls.cuda_kernels`, compiled once per process with ``cupy.RawModule``.

bfloat16: CuPy has no bfloat16 dtype, so a bfloat16 array is carried as its 16-bit patterns in a
``uint16`` CuPy array (the upper half of the float32 with the same value); ``from_numpy`` makes
such arrays, ``to_numpy`` widens them to float32 exactly, and ``dtype_name`` reports ``uint16``
as ``bfloat16``. Inputs must be C-contiguous CuPy arrays on the current device; anything else is
rejected with the reason, never copied behind the caller's back.

FP8: CuPy has no FP8 dtypes either, and one byte holds a value of any of four formats, so an FP8
array is an :class:`Fp8DeviceArray`: its bytes in a ``uint8`` CuPy array beside the name of their
format (spec.fp8), which ``dtype_name`` reports. CuPy compiles with
``-ftz=true``: float32 results below the smallest normal (1.2e-38) are flushed to zero.

cupy is optional: without it, or without a CUDA device, both implementations exist, declare what
they support, and say why they cannot run.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from impls.contract import (
    ContractViolation,
    resolve_scale,
)
from impls.cuda_kernels import COMMON_OPTIONS, SOURCES
from impls.numpy_flash import BLOCK_M
from spec.dtypes import numpy_storage
from spec.fp8 import FP8_FORMATS
from spec.fp8 import numpy_dtype as fp8_numpy_dtype

try:
    import cupy
except ImportError:  # optional dependency: reported through unavailable_reason()
    cupy = None

GRID_Y_LIMIT = 65535  # CUDA's limit on gridDim.y and gridDim.z
NAIVE_SCORE_THREADS = 128
NAIVE_VALUE_THREADS = 64
SOFTMAX_THREADS = 256  # as SOFTMAX_THREADS in cupy_naive.cu
# Both flash kernels run BLOCK_M * 2 threads: 16 rows per warp on the tensor cores, and two
# threads per row for float32 (TENSOR_CORE_THREADS and F32_THREADS in cupy_flash.cu).
FLASH_THREADS = BLOCK_M * 2


@functools.cache
def kernel_module(source_name: str):
    """The compiled module of one of :data:`impls.cuda_kernels.SOURCES`, once per process."""
    source = SOURCES[source_name]
    return cupy.RawModule(code=source.text(), options=COMMON_OPTIONS + source.options)


def bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """uint16 patterns of float64 values that are exact in bfloat16."""
    return (np.asarray(array, np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bfloat16_values(bits: np.ndarray) -> np.ndarray:
    """float32 values of uint16 bfloat16 patterns (exact)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


@dataclass(frozen=True)
class Fp8DeviceArray:
    """An FP8 array on a CUDA device: its bytes (a C-contiguous ``uint8`` cupy.ndarray) and their
    format, one of spec.fp8.FP8_FORMATS."""

    bits: Any
    format: str

    def __post_init__(self):
        if self.format not in FP8_FORMATS:
            raise ValueError(
                f"format={self.format!r}, but should be one of {', '.join(FP8_FORMATS)}"
            )
        if getattr(self.bits, "dtype", None) != np.uint8:
            raise TypeError(
                f"bits of dtype {getattr(self.bits, 'dtype', type(self.bits).__name__)}, but "
                "should be uint8 (one byte per FP8 value)"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bits.shape

    @property
    def ndim(self) -> int:
        return self.bits.ndim

    @property
    def dtype(self) -> str:
        return self.format


class CupyArrays:
    """Conversions for implementations whose native arrays are CuPy arrays on a CUDA device."""

    family = "cupy"
    device = "cuda"

    def version(self) -> str:
        if cupy is None:
            return "cupy not installed"
        if self.unavailable_reason():
            return f"cupy {cupy.__version__}"
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"cupy {cupy.__version__}, {name} (sm_{props['major']}{props['minor']})"

    def unavailable_reason(self) -> str | None:
        if cupy is None:
            return "cupy is not installed (pip install cupy-cuda13x)"
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no driver: CUDARuntimeError
            return f"no CUDA device ({type(exc).__name__}: {exc})"
        if count == 0:
            return "no CUDA device (cupy sees 0 devices)"
        capability = cupy.cuda.Device().compute_capability  # "90" for sm_90
        if int(capability) < 80:
            return f"the kernels need sm_80 or newer (bf16 mma.sync); this is sm_{capability}"
        return None

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        if dtype == "bfloat16":
            return cupy.asarray(bfloat16_bits(array))
        if dtype in FP8_FORMATS:  # the values are exact in the format: the cast only stores them
            stored = np.ascontiguousarray(array, dtype=fp8_numpy_dtype(dtype))
            return Fp8DeviceArray(cupy.asarray(stored.view(np.uint8)), dtype)
        if dtype == "uint8":  # packed FP4 (spec.block_scaled): two e2m1 codes a byte
            return cupy.asarray(np.ascontiguousarray(array, dtype=np.uint8))
        return cupy.asarray(np.ascontiguousarray(array, dtype=numpy_storage(dtype)))

    def broadcast(self, native: Any, shape: tuple[int, ...]) -> Any:
        return cupy.broadcast_to(native, shape)

    @contextlib.contextmanager
    def poisoned_allocations(self):
        """Every block CuPy hands out meanwhile, new or recycled by its pool, is first set to
        0xFF bytes: NaN in float64, float32, float16 and bfloat16 alike."""
        pool = cupy.get_default_memory_pool()

        def filled(size: int):
            memory = pool.malloc(size)
            if size:
                cupy.cuda.runtime.memsetAsync(
                    memory.ptr, 0xFF, size, cupy.cuda.get_current_stream().ptr
                )
            return memory

        cupy.cuda.set_allocator(filled)
        try:
            yield
        finally:
            cupy.cuda.set_allocator(pool.malloc)

    def to_numpy(self, native: Any) -> np.ndarray:
        if isinstance(native, Fp8DeviceArray):
            return cupy.asnumpy(native.bits).view(fp8_numpy_dtype(native.format))
        if not isinstance(native, cupy.ndarray):
            raise ContractViolation(
                f"{self.name} returned {type(native).__module__}.{type(native).__qualname__}, "
                "but should return cupy.ndarray"
            )
        host = cupy.asnumpy(native)
        return bfloat16_values(host) if host.dtype == np.uint16 else host

    def dtype_name(self, native: Any) -> str:
        if isinstance(native, Fp8DeviceArray):
            return native.format
        return "bfloat16" if native.dtype == np.uint16 else str(native.dtype)

    def fp8_bits(self, native: Fp8DeviceArray, label: str):
        """The bytes of FP8 operand ``label``, a uint8 cupy.ndarray, after check_arrays' checks."""
        self.check_arrays(supported=tuple(FP8_FORMATS), **{label: native})
        return native.bits

    def check_arrays(self, supported=None, **arrays) -> str:
        """The common dtype name of ``arrays``, each of a dtype in ``supported`` (the declared
        dtypes unless given); a clear error for anything this cannot launch on."""
        supported = self.capabilities.dtypes if supported is None else supported
        names = set()
        for name_given, native in arrays.items():
            fp8 = isinstance(native, Fp8DeviceArray)
            label, array = (f"{name_given}.bits", native.bits) if fp8 else (name_given, native)
            if not isinstance(array, cupy.ndarray):
                raise TypeError(
                    f"{label} is a {type(array).__module__}.{type(array).__qualname__}, but should "
                    f"be a cupy.ndarray [{self.name}]"
                )
            if array.device.id != cupy.cuda.Device().id:
                raise ValueError(
                    f"{label} is on CUDA device {array.device.id}, but should be on the current "
                    f"device {cupy.cuda.Device().id} [{self.name}]"
                )
            if not array.flags.c_contiguous:
                raise ValueError(
                    f"{label} is not C-contiguous (strides {array.strides}): {self.name} reads "
                    f"(B, H, T, D) rows in place; pass cupy.ascontiguousarray({label})"
                )
            name = self.dtype_name(native)
            if name not in supported:
                raise TypeError(
                    f"{label}.dtype={array.dtype} ({name}), but should be one of "
                    f"{', '.join(supported)} (bfloat16 as uint16 bit patterns, FP8 as "
                    f"Fp8DeviceArray) [{self.name}]"
                )
            names.add(name)
        if len(names) != 1:
            raise TypeError(f"dtypes differ: {sorted(names)} [{self.name}]")
        return names.pop()

    def check_grid(self, batch_heads: int, tq: int) -> None:
        if batch_heads > GRID_Y_LIMIT:
            raise ValueError(
                f"B*H={batch_heads}, but {self.name} launches one grid row per (batch, head) and "
                f"CUDA allows at most {GRID_Y_LIMIT}"
            )
        if self.name == "cupy_naive" and tq > GRID_Y_LIMIT:
            raise ValueError(
                f"Tq={tq}, but cupy_naive launches one grid row per query and CUDA allows at "
                f"most {GRID_Y_LIMIT}"
            )


def scalar_scale(scale: float | None, head_dim: int) -> np.float32:
    return np.float32(resolve_scale(scale, head_dim))
