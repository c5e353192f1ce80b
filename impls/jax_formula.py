"""``jax_formula``: the formula in ``jax.numpy``, float32 and float64 on the CPU, compiled by
``jax.jit`` as JAX code is run (op by op, each new shape compiles every operation on its own: a
40-step decode took 26 s eager against a few under jit)."""

from __future__ import annotations

import functools

from impls.contract import (
    Implementation,
    causal_mask,
    resolve_scale,
    validate_inputs,
)
from impls.jax_arrays import JaxArrays, _jax


@functools.cache
def _compiled_formula():
    jax = _jax()
    jnp = jax.numpy

    @functools.partial(jax.jit, static_argnames=("causal", "scale"))
    def formula(q, k, v, *, causal: bool, scale: float):
        scores = (q @ jnp.swapaxes(k, -1, -2)) * scale  # (B, H, Tq, Tk)
        if causal:  # shapes are static under jit: the mask is a constant
            scores = jnp.where(causal_mask(*scores.shape[-2:]), scores, -jnp.inf)
        return jax.nn.softmax(scores, axis=-1) @ v  # (B, H, Tq, Dv)

    return formula


class JaxFormula(JaxArrays, Implementation):
    name = "jax_formula"

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        self.check_dtypes(q, k, v)
        return _compiled_formula()(q, k, v, causal=causal, scale=resolve_scale(scale, q.shape[-1]))
