"""Keras 3's ``keras.ops.dot_product_attention``, on each backend that runs here (numpy, torch,
jax). Keras picks its backend once per process, from ``KERAS_BACKEND`` at import: each adapter
sets it before importing keras, and runs in a worker process of its own (the suite's default).

Inputs arrive as NumPy arrays and the answer goes back as one, in the dtype Keras returned.
float64 is not declared: Keras computes it in float32 by design (its ``floatx``) and returns
float32.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np

from impls.contract import Capabilities, Implementation, NumpyArrays
from spec.formula import causal_mask


class KerasDotProductAttention(NumpyArrays, Implementation):
    """``keras.ops.dot_product_attention(q, k, v, is_causal=True, scale=scale)`` on (B, T, H, D)
    inputs. Its ``is_causal`` is top-left aligned when Tq < Tk (naive adapter); the bridged one
    passes the bottom-right boolean ``mask`` instead."""

    capabilities = Capabilities(dtypes=("float32", "float16"), distinct_value_dim=False)
    call_timeout = 600.0  # the jax backend compiles each shape

    def __init__(self, backend: str, bridged: bool):
        self.backend = backend
        self.bridged = bridged
        if backend == "jax":
            # Under jax.jit, jax's CPU dot_general refuses float16 with float32 accumulation
            # ("The precision 'F16_F16_F32' is not supported by dot_general on CPU").
            self.capabilities = Capabilities(dtypes=("float32",), distinct_value_dim=False)
        self.name = f"keras_{backend}_{'bridged' if bridged else 'naive'}"

    def _keras(self):
        os.environ["KERAS_BACKEND"] = self.backend
        import keras

        if keras.backend.backend() != self.backend:
            raise RuntimeError(
                f"keras was imported with the {keras.backend.backend()} backend in this process; "
                f"{self.name} needs {self.backend} (run it in a worker of its own)"
            )
        return keras

    def version(self) -> str:
        if importlib.util.find_spec("keras") is None:
            return "keras not installed"
        return f"keras {self._keras().__version__} ({self.backend} backend)"

    def unavailable_reason(self) -> str | None:
        for module in ("keras", self.backend):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install {module})"
        return None

    def attention(self, q, k, v, *, causal=True, scale=None):
        keras = self._keras()
        attend = self._compiled(causal, scale)
        out = attend(
            *(keras.ops.convert_to_tensor(np.swapaxes(x, 1, 2)) for x in (q, k, v))  # (B, T, H, D)
        )
        return np.swapaxes(keras.ops.convert_to_numpy(out), 1, 2)  # (B, H, Tq, D)

    @functools.cache  # noqa: B019 - one function per adapter, causal flag and scale
    def _compiled(self, causal: bool, scale: float | None):
        """The call; on the jax backend under ``jax.jit``, as a Keras model on jax compiles its
        step (``jit_compile``), so each shape compiles once rather than op by op."""
        keras = self._keras()

        def attend(q, k, v):  # (B, T, H, D)
            options = dict(scale=scale)
            if causal and self.bridged:
                options["mask"] = keras.ops.convert_to_tensor(causal_mask(q.shape[1], k.shape[1]))
            elif causal:
                options["is_causal"] = True
            return keras.ops.dot_product_attention(q, k, v, **options)

        if self.backend == "jax":
            import jax

            return jax.jit(attend)
        return attend
