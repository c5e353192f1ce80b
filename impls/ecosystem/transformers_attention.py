"""HuggingFace transformers' attention functions, called as its models call them: the ``sdpa``
path (``transformers.integrations.sdpa_attention.sdpa_attention_forward``) and Llama's eager
path (``transformers.models.llama.modeling_llama.eager_attention_forward``)."""

from __future__ import annotations

import importlib.util

from impls.contract import Capabilities, Implementation, resolve_scale
from impls.torch_arrays import TorchArrays, bottom_right_mask, torch


class TransformersArrays(TorchArrays):
    def version(self) -> str:
        if importlib.util.find_spec("transformers") is None:
            return "transformers not installed"
        import transformers

        return f"transformers {transformers.__version__}, {super().version()}"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed (pip install transformers)"
        return super().unavailable_reason()


class AttentionModule(torch.nn.Module if torch is not None else object):
    """The attributes transformers' attention functions read from the layer that calls them."""

    def __init__(self, is_causal: bool):
        super().__init__()
        self.is_causal = is_causal
        self.num_key_value_groups = 1
        self.eval()


def bottom_right_additive_mask(tq: int, tk: int, like) -> torch.Tensor:
    """(1, 1, Tq, Tk): 0 where query i sees key j <= i + Tk - Tq, the dtype's lowest finite
    value elsewhere, as transformers' mask functions build it for a cache of Tk - Tq keys."""
    hidden = ~bottom_right_mask(tq, tk, like.device)
    mask = torch.zeros(tq, tk, dtype=like.dtype, device=like.device)
    return mask.masked_fill(hidden, torch.finfo(like.dtype).min)[None, None]


class TransformersSdpa(TransformersArrays, Implementation):
    """``sdpa_attention_forward(module, q, k, v, attention_mask, scaling=scale)``, which returns
    (B, T, H, D). The naive adapter passes no mask and lets the layer's ``is_causal`` decide, as a
    model does when it has no padding: right for a decoding step (Tq = 1, no mask needed), top-left
    for a chunk of Tq > 1 queries against a longer cache. The bridged adapter passes the
    bottom-right additive mask transformers' own mask functions build for a cache."""

    capabilities = Capabilities(dtypes=("float64", "float32", "float16", "bfloat16"), autograd=True)

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "transformers_sdpa_bridged" if bridged else "transformers_sdpa_naive"

    def attention(self, q, k, v, *, causal=True, scale=None):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        mask = None
        if causal and self.bridged:
            mask = bottom_right_additive_mask(q.shape[-2], k.shape[-2], q)
        out, _ = sdpa_attention_forward(
            AttentionModule(is_causal=causal), q, k, v, mask, scaling=scale
        )
        return out.transpose(1, 2)  # (B, T, H, Dv) -> (B, H, T, Dv)


class TransformersLlamaEager(TransformersArrays, Implementation):
    """Llama's ``eager_attention_forward(module, q, k, v, attention_mask, scaling)`` with the
    bottom-right additive mask a model passes it (it has no causal flag of its own; without a
    mask it attends to every key). Its softmax is computed in float32 whatever the input dtype."""

    name = "transformers_llama_eager"
    capabilities = Capabilities(dtypes=("float64", "float32", "float16", "bfloat16"), autograd=True)

    def attention(self, q, k, v, *, causal=True, scale=None):
        from transformers.models.llama.modeling_llama import eager_attention_forward

        mask = bottom_right_additive_mask(q.shape[-2], k.shape[-2], q) if causal else None
        out, _ = eager_attention_forward(
            AttentionModule(is_causal=causal),
            q,
            k,
            v,
            mask,
            scaling=resolve_scale(scale, q.shape[-1]),
        )
        return out.transpose(1, 2)  # (B, T, H, Dv) -> (B, H, T, Dv)
