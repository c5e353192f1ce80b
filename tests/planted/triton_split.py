"""A Triton kernel whose host code picks its path from the device, as FlagAttention's does: on
a GPU with more than 100 SMs (an A100's 108) it splits the keys in two and merges the halves, and
its merge returns NaN for a row that sees no key of a half. Judged through the interpreter, the
path judged is the stand-in's (tests/test_triton_host.py)."""

from __future__ import annotations

import torch

from impls.templates.triton_kernel import MyKernel
from impls.triton_host import install_stand_in


class SplitOnManySMs(MyKernel):
    name = "triton-split-on-many-sms"
    stand_in = "A100"

    def __init__(self):
        super().__init__()
        self.device_judged = install_stand_in(self.stand_in)

    def version(self) -> str:
        judged = self.device_judged.describe() if self.device_judged else "a CUDA device"
        return f"{self.name} on {judged}"

    def attention(self, q, k, v, *, causal=True, scale=None):
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        tq, tk = q.shape[-2], k.shape[-2]
        if sms <= 100 or tk < 2 or causal is False:
            return super().attention(q, k, v, causal=causal, scale=scale)
        # split-KV: the second half's rows that see none of its keys get 0/0
        half = tk // 2
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        s = s.masked_fill(~torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq), float("-inf"))
        parts = []
        for keys in (slice(0, half), slice(half, tk)):
            part = s[..., keys]
            m = part.amax(-1, keepdim=True)
            p = torch.exp(part - m)  # NaN where the whole half is masked: -inf - -inf
            parts.append((m, p.sum(-1, keepdim=True), p @ v[..., keys, :].float()))
        (m1, l1, o1), (m2, l2, o2) = parts
        m = torch.maximum(m1, m2)
        w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
        return ((o1 * w1 + o2 * w2) / (l1 * w1 + l2 * w2)).to(q.dtype)


class SplitOnManySMsAsL4(SplitOnManySMs):
    name = "triton-split-on-many-sms-l4"
    stand_in = "L4"
