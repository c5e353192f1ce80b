"""The worker's clock for one timed call of ``attnspec bench``: perf_counter on the CPU, CUDA
events (torch's or CuPy's, by the implementation's family) on a GPU.

What a GPU kernel can do to look faster than it is, and what this clock does about each (the
judge's clock over the whole request, conformance/bench/measure.py, bounds whatever is left):

- work on a stream the events do not cover, or still queued from before: the whole device is
  synchronised before the first event and after the last, so that work of any stream, the
  implementation's own or another's, lands inside the judge's view of the request, and none of
  it is in flight when the next call is timed;
- an answer still being written after the call returned (kernels on another stream, a copy not
  waited for): the answer is read once the last event has completed and read again once the
  whole device is idle, and two readings that differ are "still being written", a broken
  contract (gpu-mode/reference-kernels' defence);
- an L2 cache that keeps the inputs across calls: a write of more than any L2 before each call,
  after the L2's persisting carve-out is set to 0 (a persisting window survives a flush);
- the time read outside the window: the copy to the host comes after the last event.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import time
from collections.abc import Callable

import numpy as np

CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # cudaLimitPersistingL2CacheSize


class AnswerStillWritten(Exception):
    """The answer changed between the end of the call's window and an idle device."""


def fingerprint(array) -> str:
    return hashlib.sha1(np.ascontiguousarray(np.asarray(array)).tobytes()).hexdigest()


def _cudart_set_limit() -> Callable[[int, int], int] | None:
    """cudaDeviceSetLimit of the CUDA runtime already loaded in this process (torch's), or None
    where none is."""
    with open("/proc/self/maps") as maps:
        loaded = {line.split()[-1] for line in maps if "libcudart" in line and "/" in line}
    for path in sorted(loaded):
        with contextlib.suppress(OSError, AttributeError):
            function = ctypes.CDLL(path).cudaDeviceSetLimit
            function.argtypes = (ctypes.c_int, ctypes.c_size_t)
            return function
    return None


class DeviceClock:
    """See the module docstring. The callables are the device's: ``make_event`` and
    ``seconds_between`` its events, ``flush`` the L2 write, ``synchronize`` the whole device,
    ``release_l2`` the persisting carve-out set to 0 (None where the runtime offers no way)."""

    FLUSH_BYTES = 256 * 2**20
    _flushes: dict[str, Callable[[], object]] = {}  # noqa: RUF012  # per library, made once

    def __init__(
        self, make_event=None, seconds_between=None, flush=None, synchronize=None, release_l2=None
    ):
        self.make_event, self.seconds_between, self.flush = make_event, seconds_between, flush
        self.synchronize = synchronize or (lambda: None)
        self.release_l2 = release_l2

    @classmethod
    def of(cls, impl, flush_cache: bool) -> DeviceClock:
        if impl.device != "cuda":
            return cls()
        if impl.family == "cupy":
            import cupy

            if "cupy" not in cls._flushes:
                buffer = cupy.empty(cls.FLUSH_BYTES, dtype=cupy.int8)
                cls._flushes["cupy"] = lambda: buffer.fill(0)
            return cls(
                cupy.cuda.Event,
                lambda first, last: cupy.cuda.get_elapsed_time(first, last) / 1e3,
                cls._flushes["cupy"] if flush_cache else None,
                lambda: cupy.cuda.Device().synchronize(),
                lambda: cupy.cuda.runtime.deviceSetLimit(CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE, 0),
            )
        import torch

        if "torch" not in cls._flushes:
            buffer = torch.empty(cls.FLUSH_BYTES, dtype=torch.int8, device="cuda")
            cls._flushes["torch"] = buffer.zero_
        set_limit = _cudart_set_limit()
        return cls(
            lambda: torch.cuda.Event(enable_timing=True),
            lambda first, last: first.elapsed_time(last) / 1e3,
            cls._flushes["torch"] if flush_cache else None,
            torch.cuda.synchronize,
            (lambda: set_limit(CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)) if set_limit else None,
        )

    def start(self) -> None:
        if self.make_event is None:
            self.started = time.perf_counter()
            return
        self.synchronize()  # nothing of any stream still running when the window opens
        if self.flush is not None:
            if self.release_l2 is not None:
                self.release_l2()
            self.flush()
        self.first, self.last = self.make_event(), self.make_event()
        self.first.record()

    def stop(self, read: Callable[[], object]) -> float:
        """Seconds since start(); ``read()`` makes the answer readable: inside the window on the
        CPU, after the last event on a GPU (a copy to the host is not the kernel's time), and
        again once the whole device is idle. Raises AnswerStillWritten where the two differ."""
        if self.make_event is None:
            read()
            return time.perf_counter() - self.started
        self.last.record()
        self.last.synchronize()
        seconds = self.seconds_between(self.first, self.last)
        at_return = fingerprint(read())
        self.synchronize()
        if fingerprint(read()) != at_return:
            raise AnswerStillWritten(
                "its answer was still being written after its call returned: it changed "
                "between the last event of the call and an idle device (work on a stream the "
                "call did not wait for)"
            )
        return seconds
