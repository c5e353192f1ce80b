# mykernel.py: an attnspec Implementation on CuPy arrays (a CUDA device). Judge it with
#   attnspec run --impl mykernel:MyKernel
import cupy

from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.cupy_arrays import CupyArrays  # conversions and views for CuPy arrays, bfloat16 too


class MyKernel(CupyArrays, Implementation):
    name = "mykernel"
    capabilities = Capabilities(dtypes=("float64", "float32"), conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)  # a clear error on bad inputs
        # Your kernel goes here (a cupy.RawKernel, say): q (B, H, Tq, D), k (B, H, Tk, D),
        # v (B, H, Tk, Dv) in q's dtype, returning (B, H, Tq, Dv). The formula, for a start:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = q @ cupy.swapaxes(k, -1, -2) * scale  # (B, H, Tq, Tk)
        if causal:  # bottom-right aligned: query i sees keys j <= i + Tk - Tq
            s = cupy.where(cupy.tri(*s.shape[-2:], s.shape[-1] - s.shape[-2], bool), s, -cupy.inf)
        p = cupy.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)  # (B, H, Tq, Dv)
