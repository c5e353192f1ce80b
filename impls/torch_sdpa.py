"""``torch_sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, on the CPU and, as
``torch_sdpa_cuda``, on CUDA.
"""

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
            mask = bottom_right_mask(tq, tk, q.device)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scale
            )
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale
        )
