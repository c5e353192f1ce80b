# mykernel.py: an attnspec Implementation on NumPy arrays. Judge it with
#   attnspec run --impl mykernel:MyKernel
import numpy as np

from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, NumpyArrays, validate_inputs


class MyKernel(NumpyArrays, Implementation):
    name = "mykernel"
    capabilities = Capabilities(dtypes=("float64", "float32"), conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)  # a clear error on bad inputs
        # Your kernel goes here: q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) in q's dtype,
        # returning (B, H, Tq, Dv). This is the formula, for a start:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = q @ np.swapaxes(k, -1, -2) * scale  # (B, H, Tq, Tk)
        if causal:  # bottom-right aligned: query i sees keys j <= i + Tk - Tq
            s = np.where(np.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool), s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)  # (B, H, Tq, Dv)
