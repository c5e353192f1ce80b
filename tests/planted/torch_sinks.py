"""A correct torch kernel with attention sinks that checks its inputs as the README says, with
``validate_inputs`` as its first line: on the vjp path its sinks come as a tensor that requires
grad, which the check must read without refusing (tests/test_validation.py)."""

from __future__ import annotations

import torch

from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.torch_arrays import TorchArrays


class SinksKernel(TorchArrays, Implementation):
    name = "torch-sinks-readme"
    device = "cpu"
    capabilities = Capabilities(
        dtypes=("float32", "float64"), autograd=True, sinks=True, conventions=RAISES_ON_ALL
    )

    def attention(self, q, k, v, *, causal=True, scale=None, sinks=None):
        validate_inputs(q, k, v, causal=causal, scale=scale, sinks=sinks)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
        tq, tk = scores.shape[-2:]
        if causal:
            visible = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
            scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is None:
            return torch.softmax(scores, dim=-1) @ v
        sink = torch.as_tensor(sinks, device=q.device).to(scores.dtype)[:, None, None]
        top = torch.maximum(scores.amax(dim=-1, keepdim=True), sink.expand(*scores.shape[:-1], 1))
        weights = torch.exp(scores - top)
        total = weights.sum(dim=-1, keepdim=True) + torch.exp(sink - top)
        return (weights / total) @ v
