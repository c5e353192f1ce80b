"""``jax``: ``jax.nn.dot_product_attention``, float32 on the CPU.

Grouped-query heads use its own grouping (k and v with fewer heads: query head h reads head
h // g). A window, key lengths and packed sequences go into the explicit boolean mask, bottom-right
aligned as the contract is (its ``local_window_size`` and ``key_value_seq_lengths`` count from
the query's index); the padding's keys and values are zeroed first, since a weight of 0 times a
NaN value is NaN."""

from __future__ import annotations

import functools

import numpy as np

from impls.capabilities import (
    LISTED_FEATURES,
    SCORE_FEATURES,
    STATE_FEATURES,
    every_extension_but,
)
from impls.contract import (
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
        # jax.nn's mask leaves a row that sees nothing undefined: no listed masks
        **every_extension_but(*SCORE_FEATURES, *STATE_FEATURES, *LISTED_FEATURES),
    )

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, key_lengths=None, **packing
    ):
        variant = dict(window=window, key_lengths=key_lengths)
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant, **packing)
        self.check_dtypes(q, k, v)
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, **variant, **packing
        )
        if split is not None:
            return split
        tq, tk = q.shape[-2], k.shape[-2]
        # jax.nn's is_causal is top-left aligned when Tq < Tk, so the bottom-right mask is passed
        # explicitly, (Tq, Tk) broadcast over (B, N).
        mask = causal_mask(tq, tk) if causal else None
        if window is not None or key_lengths is not None:
            mask = visible_keys(tq, tk, causal=causal, **variant)  # (B|1, 1, Tq, Tk)
        padding = None
        if key_lengths is not None:
            padding = np.arange(tk)[None, :] >= np.asarray(key_lengths)[:, None]  # (B, Tk)
        return _compiled_attention()(
            q, k, v, mask, padding, scale=resolve_scale(scale, q.shape[-1])
        )  # (B, H, Tq, Dv)


@functools.cache
def _compiled_attention():
    """The call under ``jax.jit``, as JAX code is run: op by op, every new shape compiles each
    operation on its own (a 40-step decode took 30 s eager against a few under jit)."""
    jax = _jax()
    jnp = jax.numpy

    @functools.partial(jax.jit, static_argnames=("scale",))
    def attend(q, k, v, mask, padding, *, scale: float):
        if padding is not None:  # a weight of 0 times a NaN value is NaN: zero the padding first
            k, v = (jnp.where(padding[:, None, :, None], 0, x) for x in (k, v))
        out = jax.nn.dot_product_attention(
            *(jnp.swapaxes(x, 1, 2) for x in (q, k, v)),  # jax.nn wants (B, T, N, H)
            mask=mask,
            scale=scale,
        )
        return jnp.swapaxes(out, 1, 2)  # (B, H, Tq, Dv)

    return attend
