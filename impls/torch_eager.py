"""``torch_eager``: the formula in torch ops, on the CPU and, as ``torch_eager_cuda``, on CUDA."""

from __future__ import annotations

from dataclasses import replace

from impls.block_scaled_calls import is_block_scaled_call
from impls.capabilities import SCORE_FEATURES, STATE_FEATURES, every_extension_but
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
    padding_zeroed,
    query_positions,
    repeated_heads,
    torch,
    visible_mask,
)
from impls.torch_block_scaled import block_scaled_attention
from impls.torch_fp8 import fp8_attention, is_torch_fp8_call
from spec.masks import LISTED_KEYWORDS


class TorchEager(TorchArrays, Implementation):
    """The formula in torch ops, in the input's dtype; autograd-capable and exposes its weights.
    Grouped-query heads repeat k and v along heads (``repeat_interleave``); a window and key
    lengths go into the boolean mask, and the padding's values are zeroed before the product."""

    capabilities = Capabilities(
        dtypes=DTYPES,
        autograd=True,
        exposes_weights=True,
        conventions=RAISES_ON_ALL,
        **every_extension_but(*SCORE_FEATURES, *STATE_FEATURES),
        empty_rows="nan",  # the formula's 0 / 0 for an item with no key
        # FP8 in PyTorch's dtypes, the scores by torch._scaled_mm (impls.torch_fp8)
        fp8=True,
        fp8_formats=("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"),
        fp8_p="float32",
        fp8_output="bfloat16",
        # block-scaled decoded in PyTorch's dtypes, then float32 (impls.torch_block_scaled)
        block_scaled=True,
        block_p="float32",
        block_output="bfloat16",
    )

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.name = "torch_eager" if device == "cpu" else f"torch_eager_{device}"
        if device != "cpu":  # torch._scaled_mm on CUDA wants dims in multiples of 16: unmet
            self.capabilities = replace(self.capabilities, fp8=False)

    def attention_weights(
        self, q, k, *, causal=True, scale=None, window=None, key_lengths=None, **listed
    ):
        variant = dict(window=window, key_lengths=key_lengths, **listed)
        validate_inputs(q, k, k, causal=causal, scale=scale, gqa=True, **variant)
        k = repeated_heads(q, k)
        scores = (q @ k.transpose(-1, -2)) * resolve_scale(scale, q.shape[-1])  # (B, H, Tq, Tk)
        if causal or any(value is not None for value in variant.values()):
            tq, tk = scores.shape[-2:]
            mask = visible_mask(tq, tk, scores.device, causal=causal, heads=q.shape[1], **variant)
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1)

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, key_lengths=None, **packing
    ):
        if is_block_scaled_call(packing):
            extras = {"window": window, "key_lengths": key_lengths}
            extras = {name: value for name, value in extras.items() if value is not None}
            return block_scaled_attention(self.capabilities, q, k, v, causal=causal, scale=scale,
                                          **extras, **packing)  # fmt: skip
        if is_torch_fp8_call(q, k, v, packing):
            extras = {"window": window, "key_lengths": key_lengths}
            extras = {name: value for name, value in extras.items() if value is not None}
            return fp8_attention(self.capabilities, q, k, v, causal=causal, scale=scale,
                                 **extras, **packing)  # fmt: skip
        # the masks given as arrays (spec.masks.LISTED_KEYWORDS) go into the boolean mask too
        listed = {name: packing.pop(name) for name in LISTED_KEYWORDS if name in packing}
        variant = dict(window=window, key_lengths=key_lengths, **listed)
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant, **packing)
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, **variant, **packing
        )
        if split is not None:
            return split
        gathered_kinds = {"kv_indices", "topk_length", "kv_block_size"}
        if variant.get("kv_indices") is not None and set(listed) <= gathered_kinds:
            return gathered_attention(q, k, v, causal=causal, scale=scale, **variant)
        weights = self.attention_weights(q, k, causal=causal, scale=scale, **variant)
        return weights @ padding_zeroed(repeated_heads(q, v), key_lengths)  # (B, H, Tq, Dv)


def gathered_attention(q, k, v, *, causal, scale, kv_indices, topk_length=None,
                       kv_block_size=None, window=None, key_lengths=None):  # fmt: skip
    """Index-sparse attention as a sparse kernel computes it: each row's listed keys and values
    gathered (B, Hkv, Tq, K, D), the scores of those alone, K per row instead of Tk. A key
    listed twice counts once (its later slots are emptied), an empty slot (-1), a future key, a
    key past the item's length or outside its window none; a row left nothing is NaN (0 / 0,
    as empty_rows declares). Autograd flows through the gather."""
    batch, heads, tq, dim = q.shape
    kv_heads, tk = k.shape[1], k.shape[2]
    slots = kv_indices.shape[-1]
    given = kv_indices if isinstance(kv_indices, torch.Tensor) else torch.as_tensor(kv_indices)
    indices = given.to(q.device).long()  # (B, Hkv, Tq, K)
    if topk_length is not None:  # the slots past it emptied
        counted = torch.tensor([int(n) for n in topk_length], device=q.device)
        past = torch.arange(slots, device=q.device) >= counted[:, None, None, None]
        indices = indices.masked_fill(past, -1)
    if kv_block_size is not None:  # block j as its keys, those past Tk as empty slots
        keys = indices[..., None] * kv_block_size + torch.arange(kv_block_size, device=q.device)
        keys = keys.masked_fill((indices[..., None] < 0) | (keys >= tk), -1)
        indices = keys.flatten(-2)
        slots = indices.shape[-1]
    ordered, _ = indices.sort(dim=-1)
    repeated = torch.zeros_like(ordered, dtype=torch.bool)
    repeated[..., 1:] = ordered[..., 1:] == ordered[..., :-1]
    keys = ordered.masked_fill(repeated, -1)  # each listed key once
    positions = query_positions(tq, tk, q.device, key_lengths)[:, None]  # (B or 1, 1, Tq, 1)
    read = keys >= 0
    if causal:
        read &= keys <= positions
    if window is not None:
        read &= keys >= positions - window
    if key_lengths is not None:
        lengths = torch.tensor([int(n) for n in key_lengths], device=q.device)
        read &= keys < lengths[:, None, None, None]
    where = keys.clamp(min=0).reshape(batch, kv_heads, tq * slots, 1)
    k_rows, v_rows = (
        torch.gather(x, 2, where.expand(-1, -1, -1, x.shape[-1])).reshape(
            batch, kv_heads, tq, slots, x.shape[-1]
        )
        for x in (k, v)
    )  # (B, Hkv, Tq, K, D) and (.., Dv)
    v_rows = v_rows.masked_fill(~read[..., None], 0)  # 0 x NaN is NaN: nothing unread reaches
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, tq, dim)  # (B, Hkv, g, Tq, D)
    scores = torch.einsum("bngqd,bnqkd->bngqk", grouped, k_rows) * resolve_scale(scale, dim)
    scores = scores.masked_fill(~read[:, :, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = torch.einsum("bngqk,bnqkd->bngqd", weights, v_rows)
    return out.reshape(batch, heads, tq, v.shape[-1])
