"""MLX's ``mlx.core.fast.scaled_dot_product_attention`` on its CPU device. Inputs arrive as NumPy
arrays and the answer goes back as one, in the dtype MLX returned."""

from __future__ import annotations

import importlib.util

import numpy as np

from impls.contract import Capabilities, Implementation, NumpyArrays, resolve_scale


class MlxFastAttention(NumpyArrays, Implementation):
    """``mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")`` on
    (B, H, T, D): MLX's causal mask is bottom-right aligned, as the contract's, so one adapter
    serves. float64 is not declared: MLX documents its softmax as computed in float32 whatever
    the input precision. The scale is a required argument: None becomes 1/sqrt(D)."""

    name = "mlx_fast"
    capabilities = Capabilities(dtypes=("float32", "float16"))

    def version(self) -> str:
        if importlib.util.find_spec("mlx") is None:
            return "mlx not installed"
        import mlx.core as mx

        return f"mlx {mx.__version__}"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("mlx") is None:
            return "mlx is not installed (pip install mlx[cpu])"
        return None

    def attention(self, q, k, v, *, causal=True, scale=None):
        import mlx.core as mx

        with mx.stream(mx.cpu):
            out = mx.fast.scaled_dot_product_attention(
                *(mx.array(x) for x in (q, k, v)),
                scale=resolve_scale(scale, q.shape[-1]),
                mask="causal" if causal else None,
            )
            return np.array(out)
