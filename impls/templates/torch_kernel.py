# mykernel.py: an attnspec Implementation on PyTorch tensors. Judge it with
#   attnspec run --impl mykernel:MyKernel
import torch

from impls.contract import DTYPES, RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.torch_arrays import TorchArrays  # conversions, views, autograd for torch tensors


class MyKernel(TorchArrays, Implementation):
    name = "mykernel"
    device = "cpu"  # or "cuda"
    capabilities = Capabilities(dtypes=DTYPES, autograd=True, conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)  # a clear error on bad inputs
        # Your kernel goes here: q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) in q's dtype,
        # returning (B, H, Tq, Dv). PyTorch's SDPA, for a start, with an explicit mask: its
        # is_causal aligns top-left when Tq != Tk, and gives NaN for a scale of 0.
        tq, tk = q.shape[-2], k.shape[-2]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)  # (Tq, Tk)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask if causal else None, scale=scale
        )
