"""``jax``: ``jax.nn.dot_product_attention``, float32 and float64 on the CPU."""

from __future__ import annotations

from impls.contract import (
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    causal_mask,
    resolve_scale,
    validate_inputs,
)
from impls.jax_arrays import JaxArrays, _jax


class JaxDotProductAttention(JaxArrays, Implementation):
    name = "jax"
    # float32 only: jax.nn.dot_product_attention computes float64 inputs at float32 precision
    # (the README's built-ins section gives the measurement); jax_formula covers float64. Its API
    # wants Dv = D.
    capabilities = Capabilities(
        dtypes=("float32",), distinct_value_dim=False, conventions=RAISES_ON_ALL
    )

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        self.check_dtypes(q, k, v)
        jnp = _jax().numpy
        scale = resolve_scale(scale, q.shape[-1])
        # jax.nn wants (B, T, N, H); its is_causal is top-left aligned when Tq < Tk, so the
        # bottom-right mask is passed explicitly, (Tq, Tk) broadcast over (B, N).
        mask = jnp.asarray(causal_mask(q.shape[-2], k.shape[-2])) if causal else None
        out = _jax().nn.dot_product_attention(
            *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)),  # (B, T, H, D)
            mask=mask,
            scale=scale,
        )
        return jnp.swapaxes(out, 1, 2)  # (B, H, Tq, Dv)
