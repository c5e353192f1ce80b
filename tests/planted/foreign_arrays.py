"""An Implementation subclass whose native arrays are not NumPy's and follow no array API (as a
PyTorch kernel's are, written without impls.torch_arrays.TorchArrays): the suite's default view
helpers cannot lay its inputs out, and that is the suite's limit, never the kernel's failure."""

from __future__ import annotations

import numpy as np

from impls.contract import RAISES_ON_ALL, Capabilities, ContractViolation, Implementation
from impls.contract import validate_inputs as validate
from tests.zoo.formula import attend


class Tensor:
    """A boxed array whose transpose takes two axes, as torch.Tensor.transpose(dim0, dim1) does."""

    def __init__(self, values: np.ndarray):
        self.values = values

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        return Tensor(np.swapaxes(self.values, dim0, dim1))

    def __getitem__(self, index) -> Tensor:
        return Tensor(self.values[index])


class BoxedKernel(Implementation):
    """Correct, on every layout it is handed; its conversions are its own."""

    name = "boxed"
    family = "boxed"
    capabilities = Capabilities(
        dtypes=("float64", "float32"), conventions=RAISES_ON_ALL, layouts=("contiguous",)
    )

    def from_numpy(self, array: np.ndarray, dtype: str) -> Tensor:
        return Tensor(np.array(array, dtype=dtype))

    def to_numpy(self, native) -> np.ndarray:
        if not isinstance(native, Tensor):
            raise ContractViolation(f"returned {type(native).__qualname__}, not a Tensor")
        return native.values

    def dtype_name(self, native) -> str:
        return str(native.values.dtype)

    def attention(self, q, k, v, *, causal=True, scale=None):
        q, k, v = (x.values for x in (q, k, v))
        validate(q, k, v, causal=causal, scale=scale)
        return Tensor(attend(q, k, v, causal=causal, scale=scale))


class BoxedKernelWithBrokenPermute(BoxedKernel):
    """Defines permuted() itself, wrongly: its own helper's failure is its own."""

    name = "boxed_broken_permute"

    def permuted(self, native, axes):
        raise RuntimeError("permute is not supported")
