"""``torch_eager``'s FP8 calls (spec.fp8), in PyTorch's FP8 dtypes, P kept in float32:

* FlashAttention 3's convention: each head's scores are ``torch._scaled_mm`` of its stored q and
  k with their descales, summed in float32 (it multiplies 2-D matrices, so one call per (b, h));
  the softmax in float32; P times v's stored values in float32, times v's descale; the output
  rounded to bfloat16, as FlashAttention 3 returns it;
* the key/value cache's: k and v dequantized, stored value times its scale in float32, and the
  formula in float32 with q widened to it; the output in q's dtype.

The entry point's checks are every family's (impls.fp8_calls).
"""

from __future__ import annotations

from impls.fp8_calls import checked_scales, declared_output, is_fp8_call
from impls.torch_arrays import repeated_heads, torch, torch_dtype_name, visible_mask
from spec.formula import resolve_scale
from spec.fp8 import Fp8Scales


def is_torch_fp8_call(q, k, v, keywords: dict) -> bool:
    return is_fp8_call(q, k, v, keywords, dtype_name=torch_dtype_name)


def fp8_attention(capabilities, q, k, v, *, causal, scale, **keywords):
    """The FP8 call's output, (B, Hq, Tq, Dv) in the convention's dtype (see the docstring)."""
    scales = checked_scales(capabilities, q, k, v, causal, scale, keywords,
                            dtype_name=torch_dtype_name)  # fmt: skip
    softmax_scale = resolve_scale(scale, q.shape[-1])
    if scales.convention == "descale":
        scores = scaled_scores(q, k, scales) * softmax_scale  # (B, Hq, Tq, Tk) float32
        values = dequantized(v, scales, "v", q, k)  # (B, Hq, Tk, Dv) float32
    else:
        q32, k32, values = (
            dequantized(x, scales, name, q, k) for name, x in zip("qkv", (q, k, v), strict=True)
        )
        scores = (q32 @ k32.transpose(-1, -2)) * softmax_scale  # (B, Hq, Tq, Tk)
    out = softmax_times_values(scores, values, causal)
    return out.to(getattr(torch, declared_output(capabilities, torch_dtype_name(q), scales)))


def softmax_times_values(scores, values, causal: bool):
    """softmax(scores) v in float32, future keys masked where ``causal``: (B, Hq, Tq, Dv)."""
    if causal:
        tq, tk = scores.shape[-2:]
        scores = scores.masked_fill(~visible_mask(tq, tk, scores.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ values


def dequantized(x, scales: Fp8Scales, name: str, q, k):
    """Operand ``name`` in float32 at q's heads (B, Hq, T, D), times its scale (1 for a q in its
    own dtype), query head h taking kv head h // g's."""
    widened = repeated_heads(q, x.to(torch.float32))
    applied = scales.applied(name, q, k)  # NumPy float32, (B, Hq, 1, 1)
    return widened * torch.as_tensor(applied, device=q.device)


def scaled_scores(q, k, scales: Fp8Scales):
    """q k^T of the stored FP8 values times q's and k's descales, (B, Hq, Tq, Tk) float32."""
    batch, heads, tq, _ = q.shape
    group = heads // k.shape[1]
    q_descale, k_descale = (
        torch.as_tensor(scales.keywords[name], dtype=torch.float32)
        for name in ("q_descale", "k_descale")
    )  # (B, Hkv)
    scores = torch.empty((batch, heads, tq, k.shape[2]), dtype=torch.float32, device=q.device)
    for b in range(batch):
        for h in range(heads):
            scores[b, h] = torch._scaled_mm(
                q[b, h], k[b, h // group].t(),  # (Tq, D) @ (D, Tk), k column-major as it asks
                scale_a=q_descale[b, h // group], scale_b=k_descale[b, h // group],
                out_dtype=torch.float32,
            )  # fmt: skip
    return scores
