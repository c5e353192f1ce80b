"""PyTorch's own attention entry points: ``F.scaled_dot_product_attention`` with ``is_causal``,
``torch.nn.MultiheadAttention`` and ``flex_attention``."""

from __future__ import annotations

from impls.contract import Capabilities, Implementation
from impls.torch_arrays import TorchArrays, bottom_right_mask, torch

TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16")


class TorchSdpa(TorchArrays, Implementation):
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)``, as its
    documentation shows it (naive): its causal mask is top-left aligned (query i sees keys
    j <= i), so a chunk of Tq < Tk queries against a cache does not see the cache's last Tk - Tq
    keys. The bridged adapter passes ``attn_mask``, the bottom-right boolean mask, instead of
    ``is_causal``. Neither checks its inputs: what PyTorch accepts is PyTorch's (the built-in
    ``torch_sdpa`` is the suite's own conforming wrapper, which does)."""

    capabilities = Capabilities(dtypes=TORCH_DTYPES, autograd=True)

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "torch_sdpa_bridged" if bridged else "torch_sdpa_naive"

    def attention(self, q, k, v, *, causal=True, scale=None):
        if causal and self.bridged:
            mask = bottom_right_mask(q.shape[-2], k.shape[-2], q.device)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scale
            )
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale
        )


class MultiheadAttention(TorchArrays, Implementation):
    """``torch.nn.MultiheadAttention`` with identity projections (``in_proj`` and ``out_proj``
    set to I, no bias), so the module computes attention alone on (B, T, H * D) inputs, and the
    causal mask it is documented with: ``attn_mask`` True above the diagonal,
    ``torch.triu(ones(Tq, Tk), diagonal=1)``: top-left aligned. The bridged adapter shifts the
    diagonal by Tk - Tq. The module's scale is fixed at 1/sqrt(D), and its value dim is q's."""

    capabilities = Capabilities(
        dtypes=("float64", "float32"),
        autograd=True,
        explicit_scale=False,
        distinct_value_dim=False,
    )

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "torch_mha_bridged" if bridged else "torch_mha_naive"

    def attention(self, q, k, v, *, causal=True, scale=None):
        batch, heads, tq, head_dim = q.shape
        tk = k.shape[-2]
        width = heads * head_dim
        module = torch.nn.MultiheadAttention(width, heads, bias=False, batch_first=True)
        module = module.to(dtype=q.dtype, device=q.device).eval()
        with torch.no_grad():
            module.in_proj_weight.copy_(torch.eye(width).repeat(3, 1))
            module.out_proj.weight.copy_(torch.eye(width))

        def tokens(x):  # (B, H, T, D) -> (B, T, H * D)
            return x.transpose(1, 2).reshape(batch, x.shape[2], width)

        mask = None
        if causal:
            shift = tk - tq if self.bridged else 0
            mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(1 + shift)
        out, _ = module(tokens(q), tokens(k), tokens(v), attn_mask=mask, need_weights=False)
        return out.reshape(batch, tq, heads, head_dim).transpose(1, 2)  # (B, H, Tq, D)


class FlexAttention(TorchArrays, Implementation):
    """``torch.nn.attention.flex_attention.flex_attention`` with a ``create_block_mask`` of the
    documented causal ``mask_mod``, ``q_idx >= kv_idx``: top-left aligned. The bridged adapter's
    mask_mod is ``q_idx + Tk - Tq >= kv_idx``. Called eagerly (no ``torch.compile``), as on a
    CPU without a compiler toolchain set up. No autograd: "FlexAttention does not support
    backward on CPU" (its own error)."""

    capabilities = Capabilities(dtypes=("float64", "float32"))

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "torch_flex_bridged" if bridged else "torch_flex_naive"

    def attention(self, q, k, v, *, causal=True, scale=None):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        tq, tk = q.shape[-2], k.shape[-2]
        shift = tk - tq if self.bridged else 0

        def causal_mod(b, h, q_idx, kv_idx):
            return q_idx + shift >= kv_idx

        block_mask = (
            create_block_mask(causal_mod, None, None, tq, tk, device=str(q.device))
            if causal
            else None
        )
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
