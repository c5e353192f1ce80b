"""JAX implementations: ``jax`` (``jax.nn.dot_product_attention``) and ``jax_formula`` (the formula
in ``jax.numpy``), float32 and float64 on the CPU.

jax is optional: without it these implementations report why they cannot run. float64 needs JAX's
x64 mode, which is switched on for the process when the first of them is created.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np

from impls.contract import (
    RAISES_ON_ALL,
    Capabilities,
    ContractViolation,
    Implementation,
    causal_mask,
    resolve_scale,
    validate_inputs,
)


@functools.cache
def _jax():
    import jax

    jax.config.update("jax_enable_x64", True)
    return jax


class JaxArrays:
    """Conversions for implementations whose native arrays are JAX arrays on the CPU."""

    family = "jax"
    device = "cpu"
    capabilities = Capabilities(dtypes=("float64", "float32"), conventions=RAISES_ON_ALL)

    def version(self) -> str:
        if importlib.util.find_spec("jax") is None:
            return "jax not installed"
        return f"jax {_jax().__version__}"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("jax") is None:
            return "jax is not installed (pip install jax)"
        return None

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        return _jax().numpy.asarray(np.asarray(array, dtype=np.float64).astype(dtype))

    def to_numpy(self, native: Any) -> np.ndarray:
        if not isinstance(native, _jax().Array):
            raise ContractViolation(
                f"{self.name} returned {type(native).__qualname__}, but should return jax.Array"
            )
        return np.asarray(native)

    def dtype_name(self, native: Any) -> str:
        return str(native.dtype)

    def device_of(self, native: Any) -> str:
        return next(iter(native.devices())).platform

    def check_dtypes(self, q, k, v) -> None:
        for label, array in (("q", q), ("k", k), ("v", v)):
            if str(array.dtype) not in self.capabilities.dtypes:
                raise TypeError(
                    f"{label}.dtype={array.dtype}, but should be one of "
                    f"{self.capabilities.dtypes} [{self.name}]"
                )
            if array.dtype != q.dtype:
                raise TypeError(f"{label}.dtype={array.dtype}, but should equal q.dtype={q.dtype}")


class JaxDotProductAttention(JaxArrays, Implementation):
    name = "jax"
    # float32 only: jax.nn.dot_product_attention (jax 0.10.2, CPU) computes float64 inputs at
    # float32 precision (test_formula_at_length[jax-float64-3-full]: error 1.5e-7, relative
    # 7.6e-8, 2.1e6 times the float64 budget); jax_formula covers float64. Its API wants Dv = D.
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
