"""``triton_flash``: a fused causal attention kernel in Triton (see ``triton_flash_kernel.py``).

On a CUDA device it runs compiled, in float32, float16 and bfloat16. Without one, with
``TRITON_INTERPRET=1`` set before the process starts, Triton's interpreter runs the same kernel
on the CPU with torch CPU tensors, in float32: a GPU kernel the suite validates on every CPU run.
triton and torch are optional: without them this implementation reports why it cannot run.
"""

from __future__ import annotations

import importlib.util
import os

from impls.contract import (
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    resolve_scale,
    validate_inputs,
)
from impls.torch_arrays import TorchArrays, torch

INTERPRETER_DTYPES = ("float32",)
GPU_DTYPES = ("float32", "float16", "bfloat16")


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class TritonFlash(TorchArrays, Implementation):
    name = "triton_flash"
    call_timeout = 900.0  # seconds: the interpreter runs a 1024-token call for minutes

    def __init__(self):
        on_gpu = torch is not None and not interpreted() and torch.cuda.is_available()
        self.device = "cuda" if on_gpu else "cpu"
        self.capabilities = Capabilities(
            dtypes=GPU_DTYPES if on_gpu else INTERPRETER_DTYPES,
            autograd=True,  # its own backward kernels (vjp), not torch's autograd
            conventions=RAISES_ON_ALL,
        )

    def version(self) -> str:
        if importlib.util.find_spec("triton") is None:
            return "triton not installed"
        import triton

        mode = "compiled" if self.device == "cuda" else "interpreter"
        return f"triton {triton.__version__} ({mode}), {super().version()}"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (pip install triton)"
        reason = super().unavailable_reason()
        if reason:
            return reason
        if self.device == "cpu" and not interpreted():
            return "no CUDA device, and TRITON_INTERPRET=1 was not set to run Triton's interpreter"
        return None

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        for label, tensor in (("q", q), ("k", k), ("v", v)):
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in self.capabilities.dtypes:
                raise TypeError(
                    f"{label}.dtype={dtype}, but should be one of {self.capabilities.dtypes} "
                    f"[{self.name} on {self.device}]"
                )
            if tensor.dtype != q.dtype:
                raise TypeError(f"{label}.dtype={dtype}, but should equal q.dtype={q.dtype}")
            if tensor.device.type != self.device:
                raise ValueError(
                    f"{label} is on {tensor.device}, but should be on {self.device} [{self.name}]"
                )
        return self.forward(q, k, v, causal=causal, scale=scale)[0]

    def forward(self, q, k, v, *, causal, scale):
        """(out, lse), lse (B, H, Tq) float32, from the kernel on contiguous copies."""
        from impls.triton_flash_kernel import launch  # triton is imported here, not before

        q, k, v = (x.contiguous() for x in (q, k, v))
        out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        launch(q, k, v, out, lse, scale=resolve_scale(scale, q.shape[-1]), causal=causal)
        return out, lse

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None):
        """FlashAttention 2's backward in two Triton kernels (triton_flash_kernel.py), from the
        forward's output and lse: its features are the forward's, the plain formula."""
        from impls.triton_flash_kernel import launch_backward

        out, lse = self.forward(q, k, v, causal=causal, scale=scale)
        q, k, v, grad_out = (x.contiguous() for x in (q, k, v, grad_out))
        delta = (grad_out.float() * out.float()).sum(-1)  # rowsum(dO * O), (B, H, Tq)
        grads = [torch.empty_like(x) for x in (q, k, v)]
        launch_backward(q, k, v, grad_out, lse, delta, grads,
                        scale=resolve_scale(scale, q.shape[-1]), causal=causal)  # fmt: skip
        return tuple(grads)
