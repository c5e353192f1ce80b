"""``torch_eager``'s block-scaled calls (spec.block_scaled), decoded in PyTorch: e8m0 and e4m3fn
scale bytes viewed as torch's own dtypes, packed e2m1 unpacked by shifts and a table, each scale
repeated over its block along its axis (the keys for mx_attention's v, the head dimension
otherwise), times NVFP4's global scale; a latent cache's tokens read part by part; then the
formula in float32, P kept in float32. The output in bfloat16 under mx_attention, in q's dtype
under the caches' conventions. The entry point's checks
are every family's (impls.block_scaled_calls).
"""

from __future__ import annotations

from impls.block_scaled_calls import checked_block_call
from impls.torch_arrays import repeated_heads, torch, torch_dtype_name
from impls.torch_fp8 import softmax_times_values
from spec.block_scaled import (
    CACHE_LAYOUTS,
    E2M1_VALUES,
    block_format,
    output_dtype,
    scale_axis,
)
from spec.formula import resolve_scale


def block_scaled_attention(capabilities, q, k, v, *, causal, scale, **keywords):
    """The call's output, (B, Hq, Tq, Dv) in its convention's dtype."""
    convention, fmt = checked_block_call(capabilities, q, k, v, causal, scale, keywords,
                                         dtype_name=torch_dtype_name)  # fmt: skip
    spec = block_format(fmt)
    operands = {}
    if convention == "mla_fp8_cache":
        operands["q"] = q.to(torch.float32)
        operands["k"], operands["v"] = latent_operands(k, fmt)
    for name, x in zip("qkv", (q, k, v), strict=True):
        if name in operands:
            continue
        if name == "q" and convention == "fp4_cache":
            operands[name] = x.to(torch.float32)
            continue
        elements = unpacked(x) if spec.packed else x.to(torch.float32)
        scales = scale_values(keywords[f"{name}_block_scales"], spec.scale, x.device)
        along = scale_axis(convention, name)
        values = elements * scales.repeat_interleave(spec.block, dim=along)
        if spec.global_scale:
            values = values * float(keywords[f"{name}_global_scale"])
        operands[name] = values
    keys, values = (repeated_heads(q, operands[name]) for name in "kv")
    scores = (operands["q"] @ keys.transpose(-1, -2)) * resolve_scale(scale, q.shape[-1])
    out = softmax_times_values(scores, values, causal)
    dtype = output_dtype(convention, torch_dtype_name(q), capabilities.block_output)
    return out.to(getattr(torch, dtype))


def latent_operands(cache, fmt: str):
    """(keys, values) of a latent cache's bytes (B, Hkv, Tk, token_bytes), float32: each latent
    element (e4m3fn) times its block's float32 scale, then the bfloat16 rotary part, each part's
    bytes viewed as torch's own dtype (the machine's byte order, little endian where torch runs)."""
    layout = CACHE_LAYOUTS[fmt]
    elements, scales, rope = (cache[..., part].contiguous() for part in layout.parts)
    block = block_format(fmt).block
    latent = elements.view(torch.float8_e4m3fn).to(torch.float32)
    latent = latent * scales.view(torch.float32).repeat_interleave(block, dim=-1)
    rope = rope.view(torch.bfloat16).to(torch.float32)
    return torch.cat([latent, rope], dim=-1), latent


def scale_values(codes, scale_format: str, device):
    """Scale bytes (uint8, any array) as float32 values: e8m0's 2^(code - 127) (0xFF NaN) or
    e4m3fn's, through torch's own dtypes."""
    codes = torch.as_tensor(codes, device=device).to(torch.uint8)
    dtype = torch.float8_e8m0fnu if scale_format == "e8m0" else getattr(torch, scale_format)
    return codes.view(dtype).to(torch.float32)


def unpacked(packed):
    """Packed e2m1 (..., D/2) uint8 as float32 (..., D), the first element in the low nibble."""
    table = torch.as_tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).to(torch.int64)
    sign = torch.where(codes >= 8, -1.0, 1.0).to(device=packed.device)
    return sign * table[codes & 7]
