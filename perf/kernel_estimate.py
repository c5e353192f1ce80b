"""cupy_flash's speed on an H200, estimated where no GPU is at hand: ESTIMATES, not measurements.

``python -m perf.kernel_estimate`` compiles impls/cupy_flash.cu with NVRTC for sm_90, as CuPy
does, disassembles the cubin with ``cuobjdump -sass`` (the PyPI packages nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm, in the ``nvrtc`` extra) and prints, per tensor-core kernel:

- the instruction mix of its key-tile loops (one key tile per trip), the one over tiles every row
  sees whole and the one over tiles it must mask: tensor-core instructions against shared-memory
  loads, conversions, exponentials and the rest;
- the issue ceiling each mix puts on the tensor cores: an SM issues at most one instruction per
  clock on each of its 4 schedulers, and retires at most one m16n8k16 mma per clock at the
  datasheet's dense peak, so a loop of N instructions holding h mmas keeps the tensor cores busy
  at most 4h / N of the time, whatever the latencies;
- the roofline at the GPU gate's shape (perf/gates.toml): the FLOPs of perf/timing.py's formula
  against the H200's peak, the bytes of Q, K, V and O against its HBM bandwidth, and the time the
  issue ceilings imply, weighted by the whole and masked tiles the shape visits.

The numbers below are the datasheet's; what the kernel reaches on a real H200 is for ``tox -e gpu``
to measure.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from conformance.bench.gates import load_gates
from conformance.bench.timing import attention_flops
from conformance.report.tables import text_table
from impls.cuda_kernels import FLASH_HEAD_DIMS, compile_to_cubin
from impls.numpy_flash import BLOCK_M, BLOCK_N, key_tiles

# NVIDIA H200 SXM datasheet: BF16/FP16 tensor throughput 1,979 TFLOPS with 2:4 sparsity, so 989.5
# dense; HBM3e 4.8 TB/s; 132 SMs.
H200_DENSE_TFLOPS = 989.5
H200_HBM_TBPS = 4.8
SCHEDULERS_PER_SM = 4
ARCH = "sm_90"

# SASS opcode -> the column the estimate counts it in; anything else is "other".
CLASSES = {
    "HMMA": "HMMA",  # tensor core
    **dict.fromkeys(("LDS", "LDSM"), "LDS"),  # shared-memory loads
    "STS": "STS",
    **dict.fromkeys(("LDG", "LDGSTS"), "LDG"),  # global loads (LDGSTS: cp.async)
    "STG": "STG",
    "MUFU": "MUFU",  # exponentials, reciprocals
    **dict.fromkeys(("F2FP", "F2F"), "convert"),
    "SHFL": "SHFL",
    "BAR": "BAR",
    **dict.fromkeys(("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FCHK"), "float32"),
    **dict.fromkeys(
        ("IMAD", "ISETP", "IADD3", "VIADD", "LEA", "LOP3", "SHF", "IMNMX", "SEL", "PRMT"),
        "integer",
    ),
}
COLUMNS = ("HMMA", "LDS", "STS", "LDG", "STG", "MUFU", "convert", "SHFL", "BAR", "float32")
COLUMNS += ("integer", "other")
INSTRUCTION = re.compile(r"/\*(?P<address>[0-9a-f]{4,})\*/\s+(?P<text>[^;]*);")
PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x(?P<target>[0-9a-f]+)")


class ToolMissing(RuntimeError):
    """cuobjdump or nvdisasm is not installed."""


@dataclass(frozen=True)
class LoopMix:
    kernel: str
    opcodes: Counter  # opcode (before the first dot) -> count, in the main loop

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    @property
    def mmas(self) -> int:
        return self.opcodes["HMMA"]

    @property
    def issue_ceiling(self) -> float:
        """The most of the dense tensor peak this loop can keep busy, from issue slots alone."""
        return min(1.0, SCHEDULERS_PER_SM * self.mmas / self.instructions)

    def classes(self) -> Counter:
        counts = Counter()
        for opcode, n in self.opcodes.items():
            counts[CLASSES.get(opcode, "other")] += n
        return counts


def sass_tool() -> tuple[str, dict[str, str]]:
    """cuobjdump's path and an environment whose PATH holds nvdisasm (which it runs)."""
    directories = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        directories += [str(path) for path in sorted(Path(root).glob("cu*/bin"))]
    search = os.pathsep.join(directories)
    cuobjdump = shutil.which("cuobjdump", path=search)
    if cuobjdump is None or shutil.which("nvdisasm", path=search) is None:
        raise ToolMissing(
            "cuobjdump and nvdisasm are needed: pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm (both in attnspec's nvrtc extra)"
        )
    return cuobjdump, dict(os.environ, PATH=search)


def disassemble(cubin: bytes, kernel: str) -> str:
    cuobjdump, environ = sass_tool()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "kernels.cubin"
        path.write_bytes(cubin)
        done = subprocess.run(
            [cuobjdump, "-sass", "-fun", kernel, str(path)],
            capture_output=True, text=True, env=environ, check=False,
        )  # fmt: skip
    if done.returncode != 0 or ("HMMA" not in done.stdout and "FFMA" not in done.stdout):
        raise RuntimeError(f"cuobjdump -sass -fun {kernel} failed:\n{done.stderr or done.stdout}")
    return done.stdout


def key_tile_loops(sass: str, kernel: str) -> list[LoopMix]:
    """The loops that hold tensor-core instructions, in address order: each runs from the target
    of a backward branch to the branch. The kernel has three, one per kind of key tile (a
    window's edge, tiles every row sees whole, the diagonal and the tile past Tk)."""
    program = [
        (int(m["address"], 16), PREDICATE.sub("", m["text"].strip()))
        for m in INSTRUCTION.finditer(sass)
    ]
    loops = []
    for address, text in program:
        branch = BRANCH_TARGET.search(text)
        if branch is None or int(branch["target"], 16) >= address:
            continue
        body = [t for a, t in program if int(branch["target"], 16) <= a <= address]
        if any(t.startswith("HMMA") for t in body):
            loops.append(LoopMix(kernel, Counter(t.split()[0].split(".")[0] for t in body)))
    if not loops:
        raise RuntimeError(f"{kernel}: no loop with tensor-core instructions in its SASS")
    return loops


@dataclass(frozen=True)
class KernelLoops:
    """A kernel's loop over whole tiles (no mask computed) and its loop over masked tiles."""

    whole: LoopMix
    masked: LoopMix

    @classmethod
    def from_sass(cls, sass: str, kernel: str) -> KernelLoops:
        loops = key_tile_loops(sass, kernel)
        # A masked tile does what a whole one does and computes the mask besides.
        by_length = sorted(loops, key=lambda loop: loop.instructions)
        return cls(whole=by_length[0], masked=by_length[-1])

    def issue_ceiling(self, whole_tiles: int, masked_tiles: int) -> float:
        """The issue ceiling of a run that visits so many tiles of each kind."""
        instructions = (
            whole_tiles * self.whole.instructions + masked_tiles * self.masked.instructions
        )
        mmas = (whole_tiles + masked_tiles) * self.whole.mmas
        return min(1.0, SCHEDULERS_PER_SM * mmas / instructions)


def tile_kinds(t: int, causal: bool) -> tuple[int, int]:
    """(whole, masked) key tiles visited at Tq = Tk = t without a window, summed over the query
    blocks: a tile is masked where impls/cupy_flash.cu's seen_in_part() holds."""
    whole = masked = 0
    for block_start in range(0, t, BLOCK_M):
        for start, stop in key_tiles(block_start, min(block_start + BLOCK_M, t), t, 0, causal):
            partial = stop - start < BLOCK_N or (causal and start + BLOCK_N - 1 > block_start)
            masked += partial
            whole += not partial
    return whole, masked


def expected_mmas(head_dim: int) -> int:
    """m16n8k16 instructions per warp per key tile: S = Q K^T is (D / 16) x (BLOCK_N / 8) of them,
    P V is (BLOCK_N / 16) x (D / 8)."""
    return (head_dim // 16) * (BLOCK_N // 8) + (BLOCK_N // 16) * (head_dim // 8)


def roofline_lines(kernels: dict[str, KernelLoops]) -> list[str]:
    lines = []
    for gate in load_gates():
        if gate.subject != "cupy_flash":
            continue
        b, h, t, d = gate.batch, gate.heads, gate.t, gate.head_dim
        flops = attention_flops(b, h, t, t, d, gate.causal)
        moved = 4 * b * h * t * d * 2  # Q, K, V read and O written once, 2 bytes each
        compute_us = flops / (H200_DENSE_TFLOPS * 1e12) * 1e6
        memory_us = moved / (H200_HBM_TBPS * 1e12) * 1e6
        kernel = f"flash_{'bf16' if gate.dtype == 'bfloat16' else 'f16'}_d{d}"
        whole, masked = tile_kinds(t, gate.causal)
        ceiling = kernels[kernel].issue_ceiling(whole, masked)
        lines.append(
            f"{gate.id} (B={b}, H={h}, T={t}, D={d}, {gate.dtype}, causal): {flops / 1e9:.1f} "
            f"GFLOP, {moved / 1e6:.1f} MB; at the dense peak {compute_us:.1f} us, at HBM "
            f"bandwidth {memory_us:.1f} us (intensity {flops / moved:.0f} FLOP/B against a ridge "
            f"of {H200_DENSE_TFLOPS / H200_HBM_TBPS:.0f}: compute-bound); {whole} whole and "
            f"{masked} masked key tiles per head: at {kernel}'s issue ceiling ({ceiling:.0%} of "
            f"peak) no faster than {compute_us / ceiling:.1f} us, "
            f"{H200_DENSE_TFLOPS * ceiling:.0f} TFLOPS"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.kernel_estimate", description=__doc__)
    parser.parse_args(argv)
    try:
        _, cubin = compile_to_cubin("cupy_flash", ARCH)
        names = [f"flash_{f}_d{d}" for f in ("bf16", "f16") for d in FLASH_HEAD_DIMS]
        kernels = {k: KernelLoops.from_sass(disassemble(cubin, k), k) for k in names}
    except (ToolMissing, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"ESTIMATES for {ARCH} (H200), BLOCK_M={BLOCK_M}, BLOCK_N={BLOCK_N}: key-tile loops, "
        "per warp and tile"
    )
    rows = [("kernel", "tiles", "instructions", *COLUMNS, "issue ceiling")]
    for name, loops in kernels.items():
        for kind, mix in (("whole", loops.whole), ("masked", loops.masked)):
            counts = mix.classes()
            rows.append(
                (name, kind, str(mix.instructions), *(str(counts[c]) for c in COLUMNS),
                 f"{mix.issue_ceiling:.0%}")
            )  # fmt: skip
    print("\n".join(text_table(rows, right=range(2, len(rows[0])))))
    print("\n".join(roofline_lines(kernels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
