"""What the JAX built-ins share: JAX arrays on the CPU as native arrays and their conversions. jax
is optional: without it the implementations report why they cannot run. float64 needs JAX's x64
mode, which is switched on for the process when the first of them is created.
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

    def broadcast(self, native: Any, shape: tuple[int, ...]) -> Any:
        return _jax().numpy.broadcast_to(native, shape)

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
