"""``jax``: ``jax.nn.dot_product_attention``, float32 on the CPU.

Grouped-query heads use its own grouping (k and v with fewer heads: query head h reads head
h // g). A window, key lengths and packed sequences go into the explicit boolean mask, bottom-right
aligned as the contract is (its ``local_window_size`` and ``key_value_seq_lengths`` count from
the query's index); the padding's keys and values are zeroed first, since a weight of 0 times a
NaN value is NaN."""

from __future__ import annotations

import numpy as np

from impls.contract import (
    EVERY_EXTENSION,
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    causal_mask,
    resolve_scale,
    validate_inputs,
)
from impls.jax_arrays import JaxArrays, _jax
from spec.formula import visible_keys


class JaxDotProductAttention(JaxArrays, Implementation):
    name = "jax"
    # float32 only: jax.nn.dot_product_attention computes float64 inputs at float32 precision
    # (the README's built-ins section gives the measurement); jax_formula covers float64. Its API
    # wants Dv = D.
    capabilities = Capabilities(
        dtypes=("float32",),
        distinct_value_dim=False,
        conventions=RAISES_ON_ALL,
        **EVERY_EXTENSION,
    )

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, key_lengths=None, **packing
    ):
        variant = dict(window=window, key_lengths=key_lengths)
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant, **packing)
        self.check_dtypes(q, k, v)
        jnp = _jax().numpy
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, **variant, **packing
        )
        if split is not None:
            return split
        scale = resolve_scale(scale, q.shape[-1])
        tq, tk = q.shape[-2], k.shape[-2]
        # jax.nn wants (B, T, N, H); its is_causal is top-left aligned when Tq < Tk, so the
        # bottom-right mask is passed explicitly, (Tq, Tk) broadcast over (B, N).
        mask = jnp.asarray(causal_mask(tq, tk)) if causal else None
        if window is not None or key_lengths is not None:
            mask = jnp.asarray(visible_keys(tq, tk, causal=causal, **variant))  # (B|1, 1, Tq, Tk)
        if key_lengths is not None:
            padding = np.arange(tk)[None, :] >= np.asarray(key_lengths)[:, None]  # (B, Tk)
            k, v = (jnp.where(padding[:, None, :, None], 0, x) for x in (k, v))
        out = _jax().nn.dot_product_attention(
            *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)),  # (B, T, H, D)
            mask=mask,
            scale=scale,
        )
        return jnp.swapaxes(out, 1, 2)  # (B, H, Tq, Dv)
