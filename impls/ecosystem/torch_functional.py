"""PyTorch's own attention entry points: ``F.scaled_dot_product_attention`` with ``is_causal``,
``torch.nn.MultiheadAttention`` and ``flex_attention``."""

from __future__ import annotations

from dataclasses import replace

from impls.contract import Capabilities, Implementation
from impls.torch_arrays import TorchArrays, bottom_right_mask, torch, visible_mask
from spec.masks import LISTED_KEYWORDS

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
    backward on CPU" (its own error).

    The features flex_attention is documented with: grouped heads (``enable_gqa``), a sliding
    window and chunks as further terms of the mask_mod, a softcap and ALiBi as a ``score_mod``
    (softcap first, as its examples' order), and ``return_lse``. Each distance is measured from
    the query's position as the adapter's causal mask aligns it: top-left in the naive one. A
    custom mask, a draft tree or the keys each row lists (spec.masks' listed kinds) become one
    more term of the mask_mod, a lookup in the boolean (B, H, Tq, Tk) they make, with the block
    mask built per item and head."""

    capabilities = Capabilities(
        dtypes=("float64", "float32"),
        gqa=True,
        window=True,
        chunked=True,
        softcap=True,
        alibi=True,
        lse=True,
    )

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "torch_flex_bridged" if bridged else "torch_flex_naive"
        if bridged:  # the listed masks as a mask_mod term: the bridge's own work, not the docs'
            self.capabilities = replace(
                self.capabilities,
                custom_mask=True,
                tree_mask=True,
                packed_mask=True,
                sparse=True,
                topk_length=True,
            )

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, chunk=None, softcap=None,
        alibi_slopes=None, return_lse=False, **listed,
    ):  # fmt: skip
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        tq, tk = q.shape[-2], k.shape[-2]
        shift = tk - tq if self.bridged else 0
        unknown = sorted(set(listed) - set(LISTED_KEYWORDS))
        if unknown:
            raise TypeError(f"attention() got unexpected keyword(s) {', '.join(unknown)}")
        listed = {name: value for name, value in listed.items() if value is not None}
        # (B, H, Tq, Tk) where the listed kinds let a query see a key: a lookup in the mask_mod
        table = (visible_mask(tq, tk, q.device, causal=False, heads=q.shape[1], **listed)
                 .expand(q.shape[0], q.shape[1], tq, tk) if listed else None)  # fmt: skip

        def mask_mod(b, h, q_idx, kv_idx):
            position = q_idx + shift
            visible = position >= kv_idx if causal else kv_idx >= 0
            if table is not None:
                visible = visible & table[b, h, q_idx, kv_idx]
            if window is not None:
                visible = visible & (position - kv_idx <= window)
            if chunk is not None:
                visible = visible & (position // chunk == kv_idx // chunk)
            return visible

        slopes = (
            None
            if alibi_slopes is None
            else torch.tensor(alibi_slopes, dtype=q.dtype, device=q.device)  # (H,)
        )

        def score_mod(score, b, h, q_idx, kv_idx):
            if softcap is not None:
                score = softcap * torch.tanh(score / softcap)
            if slopes is not None:
                score = score - slopes[h] * (q_idx + shift - kv_idx).abs()
            return score

        per_item = (q.shape[0], q.shape[1]) if table is not None else (None, None)
        block_mask = (
            create_block_mask(mask_mod, *per_item, tq, tk, device=str(q.device))
            if causal or table is not None
            else None
        )
        modified = softcap is not None or alibi_slopes is not None
        return flex_attention(
            q,
            k,
            v,
            score_mod=score_mod if modified else None,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=k.shape[-3] != q.shape[-3],
            return_lse=return_lse,
        )
