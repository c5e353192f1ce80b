"""``torch_sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, on the CPU and, as
``torch_sdpa_cuda``, on CUDA.
"""

from __future__ import annotations

from impls.capabilities import every_extension_but
from impls.contract import (
    DTYPES,
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    resolve_scale,
    validate_inputs,
)
from impls.torch_arrays import (
    TorchArrays,
    alibi_bias,
    blind_rows_kept_finite,
    bottom_right_mask,
    padding_zeroed,
    torch,
    visible_mask,
)
from spec.masks import LISTED_KEYWORDS


class TorchSdpa(TorchArrays, Implementation):
    """``scaled_dot_product_attention``, bridged to the bottom-right causal contract.

    This is the suite's own conforming PyTorch implementation (the CPU speed reference, a built-in
    of every run): it checks its inputs with ``validate_inputs`` first, which PyTorch's SDPA does
    not do everywhere. PyTorch itself is judged through the ecosystem's ``torch_sdpa_naive`` and
    ``torch_sdpa_bridged`` (impls/ecosystem), which check nothing.

    PyTorch's ``is_causal`` aligns the mask top-left (query i sees keys j <= i) when Tq != Tk, so
    for Tq < Tk an explicit bottom-right boolean mask is passed instead. The explicit mask is also
    used for a scale of 0 (or below the dtype's smallest normal), where ``is_causal=True`` gives
    NaN on the CPU (the masked -inf scores are multiplied by the zero scale; the README's
    built-ins section names the test that found it).

    Grouped-query heads use PyTorch's own ``enable_gqa``. A window, key lengths and a chunk
    become an explicit boolean mask; ALiBi an additive float mask, its bias with -inf where a
    key is hidden. A softcap and sinks SDPA cannot express: they are not declared.
    The padding's keys and values are zeroed first: PyTorch turns a
    boolean mask into an added -inf, so a NaN or inf key in the padding still makes the item's
    rows NaN (NaN + -inf, inf + -inf; test_padding.py's nonfinite test finds it without this),
    and a weight of 0 times a NaN value is NaN too.
    """

    capabilities = Capabilities(
        dtypes=DTYPES,
        autograd=True,
        conventions=RAISES_ON_ALL,
        **every_extension_but("softcap", "sinks", "lse", "paged"),
    )

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.name = "torch_sdpa" if device == "cpu" else f"torch_sdpa_{device}"

    def attention(
        self,
        q,
        k,
        v,
        *,
        causal=True,
        scale=None,
        window=None,
        key_lengths=None,
        chunk=None,
        alibi_slopes=None,
        **packing,
    ):
        # the masks given as arrays (spec.masks.LISTED_KEYWORDS) go into the boolean mask too
        listed = {name: packing.pop(name) for name in LISTED_KEYWORDS if name in packing}
        variant = dict(window=window, key_lengths=key_lengths, chunk=chunk, **listed)
        if alibi_slopes is not None:
            variant["alibi_slopes"] = alibi_slopes
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant, **packing)
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, **variant, **packing
        )
        if split is not None:
            return split
        tq, tk = q.shape[-2], k.shape[-2]
        scale = resolve_scale(scale, q.shape[-1])
        grouped = dict(enable_gqa=True) if k.shape[-3] != q.shape[-3] else {}
        if any(value is not None for value in variant.values()):
            mask, blind = blind_rows_kept_finite(
                visible_mask(tq, tk, q.device, causal=causal, heads=q.shape[1], **variant)
            )
            if alibi_slopes is not None:  # an additive mask: the bias, -inf where hidden
                bias = alibi_bias(tq, tk, alibi_slopes, q, key_lengths)
                mask = bias.masked_fill(~mask, -torch.inf)
            out = torch.nn.functional.scaled_dot_product_attention(
                q,
                padding_zeroed(k, key_lengths),
                padding_zeroed(v, key_lengths),
                attn_mask=mask,
                scale=scale,
                **grouped,
            )
            return out.masked_fill(blind, 0)  # rows that see no key: zeros, as declared
        # A scale that rounds to 0 in the compute dtype hits the same NaN as scale 0.
        if causal and (tq != tk or abs(scale) < torch.finfo(q.dtype).tiny):
            mask = bottom_right_mask(tq, tk, q.device)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scale, **grouped
            )
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, **grouped
        )
