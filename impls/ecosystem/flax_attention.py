"""Flax's ``flax.nnx.dot_product_attention``, with its ``is_causal`` flag (naive) or with the
mask ``flax.nnx.make_attention_mask`` builds from query and key positions (bridged). Inputs arrive
as NumPy arrays and the answer goes back as one, in the dtype Flax returned."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

from impls.contract import Capabilities, Implementation, NumpyArrays


class FlaxDotProductAttention(NumpyArrays, Implementation):
    """``nnx.dot_product_attention(q, k, v, is_causal=True)`` on (B, T, H, D) inputs: its causal
    mask is top-left aligned when Tq < Tk. The bridged adapter passes
    ``make_attention_mask(query_positions + Tk - Tq, key_positions, jnp.greater_equal)`` instead.
    It has no scale argument (it divides q by sqrt(D) itself) and wants values of q's head dim.
    It is called under ``jax.jit``, as a model calls it (``nnx.jit``): once compiled per shape,
    not op by op."""

    capabilities = Capabilities(
        dtypes=("float64", "float32"), explicit_scale=False, distinct_value_dim=False
    )
    call_timeout = 600.0  # jax compiles each shape

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "flax_nnx_bridged" if bridged else "flax_nnx_naive"

    def version(self) -> str:
        if importlib.util.find_spec("flax") is None:
            return "flax not installed"
        import flax
        import jax

        return f"flax {flax.__version__}, jax {jax.__version__}"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("flax") is None:
            return "flax is not installed (pip install flax)"
        return None

    def attention(self, q, k, v, *, causal=True, scale=None):
        import jax

        jax.config.update("jax_enable_x64", True)  # else jax stores float64 inputs as float32
        jnp = jax.numpy
        out = self._compiled(causal)(*(jnp.asarray(np.swapaxes(x, 1, 2)) for x in (q, k, v)))
        return np.swapaxes(np.asarray(out), 1, 2)  # (B, T, H, Dv) -> (B, H, Tq, Dv)

    @functools.cache  # noqa: B019 - one compiled function per adapter and causal flag
    def _compiled(self, causal: bool):
        import jax
        from flax import nnx

        jnp = jax.numpy

        def attend(q, k, v):  # (B, T, H, D)
            tq, tk = q.shape[1], k.shape[1]
            options = {}
            if causal and self.bridged:
                query_positions = jnp.arange(tq)[None] + (tk - tq)  # (1, Tq)
                key_positions = jnp.arange(tk)[None]  # (1, Tk)
                options["mask"] = nnx.make_attention_mask(
                    query_positions, key_positions, jnp.greater_equal, dtype=jnp.bool_
                )  # (1, 1, Tq, Tk)
            elif causal:
                options["is_causal"] = True
            return nnx.dot_product_attention(q, k, v, **options)

        return jax.jit(attend)
