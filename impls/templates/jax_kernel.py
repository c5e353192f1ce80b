# mykernel.py: an attnspec Implementation on JAX arrays (CPU). Judge it with
#   attnspec run --impl mykernel:MyKernel
import functools

import jax
import jax.numpy as jnp

from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.jax_arrays import JaxArrays  # conversions and views for JAX arrays, float64 enabled


@functools.partial(jax.jit, static_argnames=("causal", "scale"))
def formula(q, k, v, *, causal, scale):
    s = q @ jnp.swapaxes(k, -1, -2) * scale  # (B, H, Tq, Tk)
    if causal:  # bottom-right aligned: query i sees keys j <= i + Tk - Tq
        s = jnp.where(jnp.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool), s, -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ v  # (B, H, Tq, Dv)


class MyKernel(JaxArrays, Implementation):
    name = "mykernel"
    capabilities = Capabilities(dtypes=("float64", "float32"), conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)  # a clear error on bad inputs
        # Your kernel goes here: q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) in q's dtype,
        # returning (B, H, Tq, Dv). The formula, compiled once per shape, for a start:
        scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
        return formula(q, k, v, causal=causal, scale=scale)
