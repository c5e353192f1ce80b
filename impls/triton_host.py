"""The GPU a Triton kernel's host code asks about, when Triton's interpreter runs the kernel on
the CPU (``TRITON_INTERPRET=1``).

Kernels pick their code path on the host from the device: its compute capability, its number of
SMs (a split-KV path for A100's 108), its shared memory. Under the interpreter there is no such
device: ``torch.cuda.get_device_capability()`` raises, and ``triton.runtime.driver.active`` finds
no driver. :func:`install_stand_in` answers those questions as a named GPU would, inside the
worker that runs the kernel (nothing of it reaches the judge), so that the paths that GPU takes
are the ones judged; :func:`device_properties` is the same answer for host code written against
this module. Either way the implementation should say which GPU it stood in for, in its
``version()`` (``StandIn.describe()``): it decides what was judged. On a CUDA device, compiled,
nothing stands in and the real device answers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace


@dataclass(frozen=True)
class StandIn:
    """What a GPU answers to a kernel's host code."""

    name: str
    capability: tuple[int, int]
    sm_count: int
    shared_memory: int  # bytes a block may opt in to
    total_memory: int = 80 << 30
    registers: int = 65536
    warp_size: int = 32

    def describe(self) -> str:
        major, minor = self.capability
        return (
            f"the interpreter standing in for an {self.name} (sm_{major}{minor}, {self.sm_count} "
            "SMs)"
        )


STAND_INS = {
    "L4": StandIn("NVIDIA L4", (8, 9), 58, 101376, total_memory=24 << 30),
    "A100": StandIn("NVIDIA A100-SXM4-80GB", (8, 0), 108, 166912),
    "H100": StandIn("NVIDIA H100 80GB HBM3", (9, 0), 132, 232448),
    "B200": StandIn("NVIDIA B200", (10, 0), 148, 232448, total_memory=180 << 30),
}
DEFAULT_STAND_IN = "A100"


def interpreted() -> bool:
    """Whether Triton's interpreter runs kernels in this process (set before it started)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def stand_in_named(name: str) -> StandIn:
    if name not in STAND_INS:
        raise ValueError(f"no stand-in GPU {name!r}; there are {', '.join(STAND_INS)}")
    return STAND_INS[name]


def device_properties(stand_in: str = DEFAULT_STAND_IN) -> StandIn:
    """The device a kernel runs on: the real CUDA device's properties where there is one and
    the interpreter is off, else the stand-in ``stand_in`` names."""
    if not interpreted():
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            return StandIn(
                props.name,
                (props.major, props.minor),
                props.multi_processor_count,
                getattr(props, "shared_memory_per_block_optin", 49152),
                props.total_memory,
            )
    return stand_in_named(stand_in)


def install_stand_in(stand_in: str = DEFAULT_STAND_IN) -> StandIn | None:
    """Under the interpreter, make torch.cuda's device queries and Triton's active driver answer
    as ``stand_in`` would, for host code that asks them directly; returns the stand-in (None
    where the interpreter is off: the real device answers). Call it once, in the
    implementation's constructor: it changes the worker's process, which is the kernel's own."""
    if not interpreted():
        return None
    device = stand_in_named(stand_in)
    import torch

    properties = SimpleNamespace(
        name=device.name, major=device.capability[0], minor=device.capability[1],
        multi_processor_count=device.sm_count, total_memory=device.total_memory,
        shared_memory_per_block_optin=device.shared_memory,
        regs_per_multiprocessor=device.registers, warp_size=device.warp_size,
    )  # fmt: skip
    torch.cuda.get_device_capability = lambda device=None: properties_capability(properties)
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.cuda.get_device_name = lambda device=None: properties.name
    torch.cuda.current_device = lambda: 0
    try:
        from triton.runtime import driver
    except ImportError:
        return device
    driver.set_active(StandInDriver(device))
    return device


def properties_capability(properties) -> tuple[int, int]:
    return properties.major, properties.minor


class StandInDriver:
    """The part of a Triton driver that host code reads: the target and the device's
    properties (``triton.runtime.driver.active``)."""

    def __init__(self, device: StandIn):
        self.device = device
        self.utils = SimpleNamespace(get_device_properties=self.get_device_properties)

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        major, minor = self.device.capability
        return GPUTarget("cuda", major * 10 + minor, self.device.warp_size)

    def get_current_device(self) -> int:
        return 0

    def get_device_properties(self, device: int = 0) -> dict:
        return {
            "multiprocessor_count": self.device.sm_count,
            "max_shared_mem": self.device.shared_memory,
            "max_num_regs": self.device.registers,
            "warpSize": self.device.warp_size,
        }
