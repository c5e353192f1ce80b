"""Timing for the performance gates: interleaved medians, FLOPs by formula, CUDA events.

Every gate compares two implementations measured in the same run, alternating call by call, so
that drift on a shared machine (frequency, other jobs) hits both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


def attention_flops(batch: int, heads: int, tq: int, tk: int, head_dim: int, causal: bool) -> float:
    """FlashAttention's convention: 2 matmuls of 2·Tq·Tk·D FLOPs per head, halved when causal."""
    flops = 4.0 * batch * heads * tq * tk * head_dim
    return flops / 2 if causal else flops


@dataclass(frozen=True)
class Timing:
    name: str
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def interleaved(
    calls: dict[str, Callable[[], object]],
    *,
    repeats: int = 21,
    warmup: int = 3,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> dict[str, Timing]:
    """Median-ready timings of each call, taken round-robin: A B A B ..."""
    timer = timer or wall_time
    for _ in range(warmup):
        for call in calls.values():
            call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            seconds[name].append(timer(call))
    return {name: Timing(name, values) for name, values in seconds.items()}


# OpenBLAS's worker threads keep spinning for a while after a NumPy matrix product, holding the
# cores, and a PyTorch call started in that window runs slower. Each timed call therefore starts
# after a pause in which the other library's threads go idle.
SETTLE_SECONDS = 0.25


def wall_time(call: Callable[[], object], settle_seconds: float = SETTLE_SECONDS) -> float:
    """Wall-clock seconds of one call, started after ``settle_seconds`` of quiet."""
    time.sleep(settle_seconds)
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class CudaEventTimer:
    """Times one call with CUDA events, after flushing the L2 cache with a 256 MiB write so that
    no repeat starts with the previous one's inputs cached."""

    def __init__(self, torch):
        self.torch = torch
        self.flush_buffer = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def __call__(self, call: Callable[[], object]) -> float:
        torch = self.torch
        self.flush_buffer.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000.0
