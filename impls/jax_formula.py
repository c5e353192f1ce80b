"""``jax_formula``: the formula in ``jax.numpy``, float32 and float64 on the CPU."""

from __future__ import annotations

from impls.contract import (
    Implementation,
    causal_mask,
    resolve_scale,
    validate_inputs,
)
from impls.jax_arrays import JaxArrays, _jax


class JaxFormula(JaxArrays, Implementation):
    name = "jax_formula"

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        self.check_dtypes(q, k, v)
        jax = _jax()
        scores = (q @ jax.numpy.swapaxes(k, -1, -2)) * resolve_scale(scale, q.shape[-1])
        if causal:
            scores = jax.numpy.where(causal_mask(*scores.shape[-2:]), scores, -jax.numpy.inf)
        return jax.nn.softmax(scores, axis=-1) @ v  # (B, H, Tq, Dv)
