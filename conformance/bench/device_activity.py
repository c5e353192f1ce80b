"""What the side not being timed ran on a GPU during the other side's timed call.

Freezing a worker (conformance/bench/fairness.py) stops its threads, not kernels it queued
before: a candidate can leave a long kernel running on the device after its own call returns,
and the baseline timed next shares the GPU with it. The device's side of the fair bench is
therefore a measurement: NVML's per-process utilisation samples
(``nvmlDeviceGetProcessUtilization``, through the driver's ``libnvidia-ml.so.1`` with ctypes: the
GPU runners have no pynvml), read after each timed call for the samples taken since it began;
any sample of a process of the other side's worker with SM utilisation above 0 refuses the
round, as CPU run there does.

What it cannot see: the driver samples every few tens of milliseconds, so a kernel shorter than
that between two samples may leave none. NVML reports process ids as the machine numbers them,
and so does the judge's ``/proc``, where it reads the workers' trees (a worker's own PID
namespace numbers its processes otherwise only inside).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Iterable

NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_NOT_FOUND = 0, 7, 6

# (pid, timestamp in microseconds, SM utilisation in percent) of each sample since a timestamp
Sampler = Callable[[int], list[tuple[int, int, int]]]


class _ProcessSample(ctypes.Structure):
    _fields_ = (
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    )


def nvml_sampler() -> Sampler | None:
    """NVML's process samples of every GPU of the machine, or None where there is no NVML."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != NVML_SUCCESS:
            return None
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
            return None
    except (OSError, AttributeError):
        return None
    handles = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == NVML_SUCCESS:
            handles.append(handle)

    def samples(since_us: int) -> list[tuple[int, int, int]]:
        found = []
        for handle in handles:
            size = ctypes.c_uint(0)
            status = nvml.nvmlDeviceGetProcessUtilization(
                handle, None, ctypes.byref(size), ctypes.c_ulonglong(since_us)
            )
            if status not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE) or not size.value:
                continue  # NOT_FOUND: no sample since then
            buffer = (_ProcessSample * size.value)()
            status = nvml.nvmlDeviceGetProcessUtilization(
                handle, buffer, ctypes.byref(size), ctypes.c_ulonglong(since_us)
            )
            if status == NVML_SUCCESS:
                found += [(s.pid, s.timeStamp, s.smUtil) for s in buffer[: size.value]]
        return found

    return samples


class DeviceActivity:
    """Reads, for one timed call, how busy the other sides' processes kept the GPU."""

    def __init__(self, sampler: Sampler | None):
        self.sampler = sampler

    @classmethod
    def of_machine(cls) -> DeviceActivity:
        return cls(nvml_sampler())

    @property
    def watched(self) -> bool:
        return self.sampler is not None

    def start(self) -> None:
        self.since_us = int(time.time() * 1e6)

    def busiest(self, pids: Iterable[int]) -> int:
        """The highest SM utilisation (percent) a sample since :meth:`start` gave any of
        ``pids``; 0 where none was busy, or nothing is watched."""
        if self.sampler is None:
            return 0
        mine = set(pids)
        with contextlib.suppress(OSError):
            return max(
                (util for pid, stamp, util in self.sampler(self.since_us)
                 if pid in mine and stamp >= self.since_us),
                default=0,
            )  # fmt: skip
        return 0
