"""An implementation whose scale is fixed at 1/sqrt(D) and that says so
(``Capabilities.explicit_scale=False``): the suite must not judge it on a scale it cannot take."""

from __future__ import annotations

from impls.contract import Capabilities, Implementation, NumpyArrays, validate_inputs
from tests.zoo.formula import attend


class FixedScale(NumpyArrays, Implementation):
    name = "fixed_scale"
    capabilities = Capabilities(dtypes=("float64", "float32"), explicit_scale=False)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=None)
        return attend(q, k, v, causal=causal, scale=None)  # any scale given is ignored
