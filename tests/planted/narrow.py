"""A kernel that declares narrow limits, as real Triton kernels must: head dims 16 to 128,
sequence lengths that are multiples of 128 (it loads whole blocks of rows unmasked), and a
log-sum-exp returned for merging whose gradient it does not take; rows that see no key are zero
(FlashAttention's convention). Within them it computes right (NumpyFlash); outside them it
refuses, as a kernel compiled for its blocks does, and given an lse gradient it answers NaN.
Judged, it must conform with no failure: any failure is a call the suite made outside the
declaration (tests/test_declared_limits.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from impls.capabilities import RAISES_ON_ALL
from impls.numpy_flash import NumpyFlash

BLOCK = 128
HEAD_DIMS = (16, 32, 64, 128)


class NarrowKernel(NumpyFlash):
    name = "narrow-limits"
    capabilities = replace(
        NumpyFlash.capabilities,
        head_dims=HEAD_DIMS,
        length_multiple=BLOCK,
        lse_backward=False,
        fp8=False,
        conventions=tuple(
            (name, "zeros" if name == "unseen_rows" else value) for name, value in RAISES_ON_ALL
        ),
    )

    def refuse_outside_the_declaration(self, q, k, variant) -> None:
        paged = variant.get("block_table") is not None
        lengths = (q.shape[-2],) if paged else (q.shape[-2], k.shape[-2])
        if q.shape[-1] not in HEAD_DIMS or any(n % BLOCK for n in lengths):
            raise ValueError(
                f"{self.name} takes head dims 16 to 128 and lengths that are multiples of "
                f"{BLOCK}, not q {tuple(q.shape)} and k {tuple(k.shape)}"
            )

    def attention(self, q, k, v, *, causal=True, scale=None, **variant):
        self.refuse_outside_the_declaration(q, k, variant)
        unseen = q.shape[-2] - k.shape[-2]
        if causal and unseen > 0 and q.ndim == k.ndim == 4 and not variant:
            out = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)  # rows that see no key
            out[..., unseen:, :] = super().attention(q[..., unseen:, :], k, v, scale=scale)
            return out
        return super().attention(q, k, v, causal=causal, scale=scale, **variant)

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, **variant):
        self.refuse_outside_the_declaration(q, k, variant)
        grads = super().vjp(q, k, v, grad_out, causal=causal, scale=scale, **variant)
        if grad_lse is not None:  # a gradient it never declared it takes
            return tuple(np.full_like(grad, np.nan) for grad in grads)
        return grads


class NarrowKernelDeclaredWide(NarrowKernel):
    """The same kernel declaring no limits: the suite's calls outside them must fail it."""

    name = "narrow-limits-declared-wide"
    capabilities = replace(
        NarrowKernel.capabilities, head_dims=None, length_multiple=1, lse_backward=True
    )
