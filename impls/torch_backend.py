"""PyTorch implementations: ``torch_eager`` (the formula in torch ops) and ``torch_sdpa``
(``torch.nn.functional.scaled_dot_product_attention``), on the CPU and, as ``*_cuda``, on CUDA.

torch is optional: without it these implementations exist, declare what they would support, and
report "torch is not installed" as the reason they cannot run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from impls.contract import (
    DTYPES,
    RAISES_ON_ALL,
    Capabilities,
    ContractViolation,
    Implementation,
    resolve_scale,
    validate_inputs,
)

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # optional dependency: reported through unavailable_reason()
    torch = None


class TorchArrays:
    """Conversions and gradients for implementations whose native arrays are torch tensors."""

    family = "torch"
    device = "cpu"

    def version(self) -> str:
        if torch is None:
            return "torch not installed"
        if self.device == "cuda" and torch.cuda.is_available():
            return f"torch {torch.__version__}, {torch.cuda.get_device_name()}"
        return f"torch {torch.__version__}"

    def unavailable_reason(self) -> str | None:
        if torch is None:
            return "torch is not installed (pip install torch==2.13.0, the version this suite pins)"
        if self.device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        return None

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64)).to(
            device=self.device, dtype=getattr(torch, dtype)
        )

    def to_numpy(self, native: Any) -> np.ndarray:
        if not isinstance(native, torch.Tensor):
            raise ContractViolation(
                f"{self.name} returned {type(native).__qualname__}, but should return torch.Tensor"
            )
        native = native.detach().cpu()
        if native.dtype == torch.bfloat16:  # NumPy has no bfloat16; float32 holds it exactly
            native = native.float()
        return native.numpy()

    def dtype_name(self, native: Any) -> str:
        return str(native.dtype).removeprefix("torch.")

    def device_of(self, native: Any) -> str:
        return native.device.type

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None):
        q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        with torch.enable_grad():
            out = self.attention(q, k, v, causal=causal, scale=scale)
            return torch.autograd.grad(out, (q, k, v), grad_out)


def _bottom_right_mask(tq: int, tk: int, device) -> Any:
    """(Tq, Tk) boolean mask, True where query i may see key j <= i + Tk - Tq."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(diagonal=tk - tq)


class TorchEager(TorchArrays, Implementation):
    """The formula in torch ops, in the input's dtype; autograd-capable and exposes its weights."""

    capabilities = Capabilities(
        dtypes=DTYPES, autograd=True, exposes_weights=True, conventions=RAISES_ON_ALL
    )

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.name = "torch_eager" if device == "cpu" else f"torch_eager_{device}"

    def attention_weights(self, q, k, *, causal=True, scale=None):
        validate_inputs(q, k, k, causal=causal, scale=scale)
        scores = (q @ k.transpose(-1, -2)) * resolve_scale(scale, q.shape[-1])  # (B, H, Tq, Tk)
        if causal:
            tq, tk = scores.shape[-2:]
            scores = scores.masked_fill(~_bottom_right_mask(tq, tk, scores.device), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        return self.attention_weights(q, k, causal=causal, scale=scale) @ v  # (B, H, Tq, Dv)


class TorchSdpa(TorchArrays, Implementation):
    """``scaled_dot_product_attention``, bridged to the bottom-right causal contract.

    PyTorch's ``is_causal`` aligns the mask top-left (query i sees keys j <= i) when Tq != Tk, so
    for Tq < Tk an explicit bottom-right boolean mask is passed instead. The explicit mask is also
    used for a scale of 0 (or below the dtype's smallest normal), where ``is_causal=True`` gives
    NaN on the CPU (the masked -inf scores are multiplied by the zero scale; the README's
    built-ins section names the test that found it).
    """

    capabilities = Capabilities(dtypes=DTYPES, autograd=True, conventions=RAISES_ON_ALL)

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.name = "torch_sdpa" if device == "cpu" else f"torch_sdpa_{device}"

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        tq, tk = q.shape[-2], k.shape[-2]
        scale = resolve_scale(scale, q.shape[-1])
        # A scale that rounds to 0 in the compute dtype hits the same NaN as scale 0.
        if causal and (tq != tk or abs(scale) < torch.finfo(q.dtype).tiny):
            mask = _bottom_right_mask(tq, tk, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
