"""tinygrad's ``Tensor.scaled_dot_product_attention`` on its CPU device. Inputs arrive as NumPy
arrays and the answer goes back as one, in the dtype tinygrad returned."""

from __future__ import annotations

import importlib.util
from importlib.metadata import version

import numpy as np

from impls.contract import Capabilities, Implementation, NumpyArrays
from spec.formula import causal_mask


class TinygradAttention(NumpyArrays, Implementation):
    """``q.scaled_dot_product_attention(k, v, is_causal=True)`` on (B, H, T, D): its causal mask
    is top-left aligned when Tq < Tk (naive adapter); the bridged one passes the bottom-right
    boolean ``attn_mask``. It has no scale argument (it divides by sqrt(D) itself)."""

    capabilities = Capabilities(dtypes=("float32",), explicit_scale=False)
    call_timeout = 600.0  # tinygrad compiles a kernel for each shape

    def __init__(self, bridged: bool):
        self.bridged = bridged
        self.name = "tinygrad_bridged" if bridged else "tinygrad_naive"

    def version(self) -> str:
        if importlib.util.find_spec("tinygrad") is None:
            return "tinygrad not installed"
        return f"tinygrad {version('tinygrad')}"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("tinygrad") is None:
            return "tinygrad is not installed (pip install tinygrad)"
        from tinygrad import Device

        try:
            Device.DEFAULT  # noqa: B018 - probing the default device is what raises
        except RuntimeError as exc:  # its CPU device compiles with clang
            return f"tinygrad has no usable device ({exc}; its CPU device needs clang)"
        return None

    def attention(self, q, k, v, *, causal=True, scale=None):
        from tinygrad import Tensor

        q, k, v = (Tensor(np.ascontiguousarray(x)) for x in (q, k, v))
        if causal and self.bridged:
            mask = Tensor(causal_mask(q.shape[-2], k.shape[-2]))
            out = q.scaled_dot_product_attention(k, v, attn_mask=mask)
        else:
            out = q.scaled_dot_product_attention(k, v, is_causal=causal)
        return out.numpy()
