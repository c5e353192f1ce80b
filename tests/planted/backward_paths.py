"""A training kernel whose backward is wrong on one path only: its self-attention path (Tq = Tk,
all it declares) forgets the softmax scale in dq, which no zero-gradient check sees
(tests/test_backward_coverage.py)."""

from __future__ import annotations

from dataclasses import replace

from impls.numpy_flash import NumpyFlash
from spec.formula import resolve_scale


class SelfAttentionDqUnscaled(NumpyFlash):
    name = "self-attention-dq-unscaled"
    capabilities = replace(NumpyFlash.capabilities, cross_length=False, fp8=False)

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, **variant):
        grads = super().vjp(
            q, k, v, grad_out, causal=causal, scale=scale, grad_lse=grad_lse, **variant
        )
        if q.shape[-2] != k.shape[-2]:
            return grads
        return (grads[0] / resolve_scale(scale, q.shape[-1]), *grads[1:])
