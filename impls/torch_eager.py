"""``torch_eager``: the formula in torch ops, on the CPU and, as ``torch_eager_cuda``, on CUDA."""

from __future__ import annotations

from impls.contract import (
    DTYPES,
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    resolve_scale,
    validate_inputs,
)
from impls.torch_arrays import TorchArrays, bottom_right_mask, torch


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
            scores = scores.masked_fill(~bottom_right_mask(tq, tk, scores.device), float("-inf"))
        return torch.softmax(scores, dim=-1)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        return self.attention_weights(q, k, causal=causal, scale=scale) @ v  # (B, H, Tq, Dv)
