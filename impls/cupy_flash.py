"""``cupy_flash``: one fused CUDA kernel per (dtype, head dim) (``cupy_flash.cu``), tensor cores
for float16 and bfloat16; grouped-query heads and a left window in the kernel itself.
"""

from __future__ import annotations

import math

import numpy as np

from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.cuda_kernels import FLASH_HEAD_DIMS, flash_entry_point
from impls.cupy_arrays import (
    FLASH_THREADS,
    CupyArrays,
    cupy,
    kernel_module,
    scalar_scale,
)
from impls.numpy_flash import BLOCK_M


class CupyFlash(CupyArrays, Implementation):
    """One fused kernel per (dtype, head dim): tensor cores for float16 and bfloat16, CUDA cores
    for float32; the tiling of :mod:`impls.numpy_flash`."""

    name = "cupy_flash"
    capabilities = Capabilities(
        dtypes=("float32", "float16", "bfloat16"),
        head_dims=FLASH_HEAD_DIMS,
        distinct_value_dim=False,
        conventions=RAISES_ON_ALL,
        gqa=True,
        window=True,
        lse=True,
        softcap=True,
        sinks=True,
    )

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, softcap=None, sinks=None,
        return_lse=False,
    ):  # fmt: skip
        out, lse = self.attention_and_lse(
            q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks
        )
        return (out, lse) if return_lse else out

    def attention_and_lse(
        self, q, k, v, *, causal=True, scale=None, window=None, softcap=None, sinks=None
    ):
        """(out, lse): the output and each row's float32 log-sum-exp (B, H, Tq), natural, of the
        scaled, capped, masked scores, the sink not included."""
        validate_inputs(
            q, k, v, causal=causal, scale=scale, gqa=True, window=window, softcap=softcap,
            sinks=sinks,
        )  # fmt: skip
        dtype = self.check_arrays(q=q, k=k, v=v)
        batch, heads, tq, d = q.shape
        tk, dv = k.shape[-2], v.shape[-1]
        if d not in FLASH_HEAD_DIMS or dv != d:
            raise ValueError(
                f"head dims D={d}, Dv={dv}, but {self.name} is compiled for D = Dv in "
                f"{', '.join(map(str, FLASH_HEAD_DIMS))}"
            )
        self.check_grid(batch * heads, tq)
        kernel = kernel_module("cupy_flash").get_function(
            flash_entry_point(dtype, d, softcap=softcap is not None)
        )
        out = cupy.empty(q.shape, dtype=q.dtype)  # (B, H, Tq, D)
        # Always written (B*H*Tq floats, next to nothing beside the output) so that the kernel is
        # launched the same way whether or not the caller asked for it.
        lse = cupy.empty((batch, heads, tq), dtype=cupy.float32)  # (B, H, Tq)
        sink_logits = None if sinks is None else cupy.asarray(sinks, dtype=cupy.float32)  # (H,)
        kernel(
            (math.ceil(tq / BLOCK_M), batch * heads),
            (FLASH_THREADS,),
            (q, k, v, out, lse, np.int32(tq), np.int32(tk),
             scalar_scale(scale, d), np.int32(causal),
             np.int32(heads // k.shape[1]), np.int32(-1 if window is None else window),
             kernel_softcap(softcap), sink_logits, np.int32(heads)),
        )  # fmt: skip
        return out, lse


def kernel_softcap(softcap: float | None) -> np.float32:
    """The kernel's softcap argument: the cap, or 0 where the kernel without one ignores it."""
    return np.float32(0.0 if softcap is None else softcap)
