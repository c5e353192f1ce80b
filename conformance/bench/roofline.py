"""What the machine can do at best: a roofline from a call's FLOPs and bytes.

A call cannot take less than its FLOPs at the machine's peak rate, nor less than its bytes at the
memory's peak bandwidth; a time below the larger of the two is not a fast kernel but a wrong
clock. On the CPU both peaks are measured once per run, in the judge (a matrix product, the best
of several, in the dtype where a library has it; a copy of a buffer larger than any cache), and
again before a time is called impossible: a busy machine measures its peaks low, never high, so
the better of the measurements stands. On a GPU they are the device's rated figures, named with
their source.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from conformance.bench.timing import attention_flops
from spec.block_scaled import BLOCK_FORMATS, CACHE_LAYOUTS
from spec.dtypes import ITEM_SIZE
from spec.fp8 import FP8_FORMATS


@dataclass(frozen=True)
class Machine:
    kind: str  # "cpu" or the GPU's name
    flops_per_second: float  # the peak matrix-product rate in the bench's dtype
    bytes_per_second: float  # the peak memory bandwidth
    source: str  # how the peaks were found
    # how to measure the peaks again, where they were measured (None: rated, or a test's)
    measure_again: Callable[[], Machine] | None = field(default=None, compare=False, repr=False)

    def bound_seconds(self, flops: float, bytes_moved: float) -> float:
        return max(flops / self.flops_per_second, bytes_moved / self.bytes_per_second)

    def at_best(self) -> Machine:
        """The machine with each peak the better of its own and a new measurement's, where its
        peaks were measured: load only lowers a measured peak, so a time below the bound is
        judged against the best the machine was seen to do. Rated peaks stand as they are."""
        if self.measure_again is None:
            return self
        again = self.measure_again()
        flops = max(self.flops_per_second, again.flops_per_second)
        bandwidth = max(self.bytes_per_second, again.bytes_per_second)
        if (flops, bandwidth) == (self.flops_per_second, self.bytes_per_second):
            return self
        return Machine(
            self.kind,
            flops,
            bandwidth,
            f"{self.source}; measured again before calling a time impossible, the better of "
            f"each kept: {flops / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.1f} GB/s",
            self.measure_again,
        )


# FlashAttention's convention for the backward: 5 matmuls to the forward's 2, 2.5x its FLOPs; a
# forward and backward together (one vjp call, which recomputes the forward) 3.5x.
FORWARD_AND_BACKWARD_FLOPS = 3.5


def call_flops(shape, causal: bool, backward: bool = False) -> float:
    """The call's FLOPs: the forward's, or with ``backward`` the forward and backward's. Over the
    keys each row reads (K of them under kv_indices, however many the cache holds, with no
    causal halving: a row's K are its own), QK^T's D and PV's Dv counted each."""
    listed = "kv_indices" in shape.keywords
    mean_dim = (shape.head_dim + shape.out_dim) / 2
    flops = attention_flops(shape.batch, shape.heads, shape.tq, shape.keys_read, mean_dim,
                            causal and not listed)  # fmt: skip
    return flops * FORWARD_AND_BACKWARD_FLOPS if backward else flops


def call_bytes(shape, dtype: str, backward: bool = False) -> float:
    """q, k, v read once and the output written once: the least any kernel moves; with
    ``backward``, q, k, v and dO read and dq, dk, dv written. Under kv_indices only the keys the
    rows list (at most all of them); v as k's first columns (MLA's) is read with k."""
    keys = min(shape.tk, shape.tq * shape.keys_read)
    query_rows, key_rows = shape.heads * shape.tq, shape.kv_heads * keys
    if shape.value_dim is not None:  # q and dq of D, the output and dO of Dv, one k holds v
        per_query = shape.head_dim + shape.value_dim
        elements = (2 if backward else 1) * (per_query * query_rows + shape.head_dim * key_rows)
        return float(shape.batch * elements * item_size(dtype))
    rows = 3 * query_rows + 4 * key_rows if backward else 2 * query_rows + 2 * key_rows
    return float(shape.batch * shape.head_dim * rows * item_size(dtype))


def item_size(dtype: str) -> float:
    """Bytes per element; an FP8 call's counted at 1 for every array, the least it moves (q
    and the output may be wider); a block-scaled call's at its element's bytes and its share of
    a scale's byte (MXFP8 1 + 1/32, NVFP4 1/2 + 1/16), for every array alike; a latent cache's
    at its token's bytes over its key's values (656 / 576)."""
    if dtype in CACHE_LAYOUTS:
        layout = CACHE_LAYOUTS[dtype]
        return layout.token_bytes / (layout.latent + layout.rope)
    if dtype in BLOCK_FORMATS:
        fmt = BLOCK_FORMATS[dtype]
        return (0.5 if fmt.packed else 1.0) + 1.0 / fmt.block
    return 1 if dtype in FP8_FORMATS else ITEM_SIZE[dtype]


GEMM_SIZE = 1024
COPY_BYTES = 256 * 2**20
ROUNDS = 5


def _best_seconds(call, rounds: int = ROUNDS) -> float:
    call()
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _gemm_rates(dtype: str) -> dict[str, float]:
    """FLOP/s of a GEMM_SIZE^3 matrix product, best of ROUNDS, by each library at hand that has
    the dtype (NumPy's BLAS in float32 and float64; torch in every dtype, FP8 by
    torch._scaled_mm). A dtype narrower than float32 has float32's rates too: a CPU kernel may
    widen its values to compute (torch's bfloat16 SDPA does, at many times its bfloat16 GEMM's
    rate on a CPU without bfloat16 instructions), and the roofline is the least time of any."""
    n = GEMM_SIZE
    rates = {}
    if dtype in BLOCK_FORMATS:  # no CPU library multiplies them: kernels widen to float32
        return {f"{name} float32": rate for name, rate in _gemm_rates("float32").items()}
    if dtype in ("float32", "float64"):
        a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
        rates["numpy"] = 2.0 * n**3 / _best_seconds(lambda: a @ a)
    else:
        rates = {f"{name} float32": rate for name, rate in _gemm_rates("float32").items()}
    try:
        import torch
    except ImportError:
        return rates
    if dtype in FP8_FORMATS:
        t, one = torch.randn(n, n).to(getattr(torch, dtype)), torch.tensor(1.0)
        product = functools.partial(
            torch._scaled_mm, t, t.t(), scale_a=one, scale_b=one, out_dtype=torch.float32
        )
        rates["torch._scaled_mm"] = 2.0 * n**3 / _best_seconds(product)
        return rates
    t = torch.randn(n, n, dtype=getattr(torch, dtype))
    rates["torch"] = 2.0 * n**3 / _best_seconds(lambda: t @ t)
    return rates


def measure_cpu(dtype: str) -> Machine:
    rates = _gemm_rates(dtype)
    if not rates:  # float16 or bfloat16 without torch: no library multiplies them here
        rates = {f"numpy float32 (no {dtype} product here)": _gemm_rates("float32")["numpy"]}
    best = max(rates, key=rates.get)
    source = np.empty(COPY_BYTES, np.uint8)
    target = np.empty_like(source)
    source.fill(1)
    bandwidth = 2.0 * COPY_BYTES / _best_seconds(lambda: np.copyto(target, source))
    return Machine(
        "cpu",
        rates[best],
        bandwidth,
        f"measured now: a {GEMM_SIZE}^3 {dtype} matrix product by {best}, "
        f"{rates[best] / 1e9:.0f} GFLOP/s, and a {COPY_BYTES >> 20} MiB copy, "
        f"{bandwidth / 1e9:.1f} GB/s (best of {ROUNDS})",
        lambda: measure_cpu(dtype),
    )


# Rated dense peaks (the vendors' data sheets, SXM parts; FLOP/s without sparsity) and memory
# bandwidth. float32 is the CUDA cores' rate: a kernel on TF32 tensor cores would beat it, and
# TF32 is not float32 arithmetic.
HOPPER = {
    "float8_e4m3fn": 1979e12, "float8_e5m2": 1979e12,  # FP8 tensor cores: twice bfloat16's
    "bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "float64": 34e12,
}  # fmt: skip
# Blackwell's block-scaled tensor cores: NVFP4 and MXFP4 at twice MXFP8's and FP8's rate, four
# times bfloat16's (HGX B200's data sheet, its sparse figures halved).
BLACKWELL = {
    "nvfp4": 9e15, "mxfp4": 9e15, "mxfp8_e4m3": 4.5e15, "mxfp8_e5m2": 4.5e15,
    "float8_e4m3fn": 4.5e15, "float8_e5m2": 4.5e15, "bfloat16": 2.25e15, "float16": 2.25e15,
}  # fmt: skip
RATED_GPUS = {
    "B200": (BLACKWELL, 8e12),
    "H200": (HOPPER, 4.8e12),
    "H100": (HOPPER, 3.35e12),
    "A100": ({"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12, "float64": 9.7e12}, 2e12),
}


def rated_gpu(device_name: str, dtype: str) -> Machine | None:
    """The rated roofline of the GPU whose name contains a known model, in ``dtype`` where it
    has a rate for it (the A100 has no FP8), or None."""
    for model, (rates, bandwidth) in RATED_GPUS.items():
        if model in device_name and dtype in rates:
            return Machine(
                device_name,
                rates[dtype],
                bandwidth,
                f"{model}'s rated figures: {rates[dtype] / 1e12:.0f} TFLOP/s {dtype} dense, "
                f"{bandwidth / 1e12:.2f} TB/s (its data sheet)",
            )
    return None
