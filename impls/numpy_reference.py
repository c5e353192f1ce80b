"""``numpy_reference``: the float64 oracle of :mod:`spec.formula`, as an implementation.

The suite judges it like any other: the formula the judge trusts must itself meet every claim.
"""

from __future__ import annotations

import numpy as np

from impls.contract import (
    EVERY_EXTENSION,
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    NumpyArrays,
    validate_inputs,
)
from spec.formula import (
    gathered_pages,
    merge_states,
    reference_attention,
    reference_feature_vjp,
    reference_log_sum_exp,
    reference_weights,
)


class NumpyReference(NumpyArrays, Implementation):
    name = "numpy_reference"
    capabilities = Capabilities(
        dtypes=("float64",),
        autograd=True,  # the float64 backward of spec.formula, derived by hand
        exposes_weights=True,
        conventions=RAISES_ON_ALL,
        **EVERY_EXTENSION,
    )

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, return_lse=False, **variant
    ):
        paging = dict(
            block_table=variant.pop("block_table", None), page_size=variant.pop("page_size", None)
        )
        validate_inputs(
            q, k, v, causal=causal, scale=scale, gqa=True, window=window, **variant, **paging
        )
        if paging["block_table"] is not None:  # the pages gathered into dense keys and values
            k, v = (gathered_pages(x, paging["block_table"], variant.get("key_lengths"))
                    for x in (k, v))  # fmt: skip
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, window=window, return_lse=return_lse, **variant
        )
        if split is not None:
            return split
        options = dict(causal=causal, scale=scale, window=window, **variant)
        with np.errstate(invalid="ignore"):  # 0 / 0 in a row that sees no key: replaced below
            out = reference_attention(q, k, v, **options)
        lse = reference_log_sum_exp(q, k, **options) if return_lse else None
        return self.with_blind_rows(out, lse, tk=k.shape[-2], **options)

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, **variant):
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant)
        grads = reference_feature_vjp(
            q, k, v, grad_out, causal=causal, scale=scale, grad_lse=grad_lse, **variant
        )
        return tuple(grads[name] for name in ("q", "k", "v", "sinks") if name in grads)

    def merge_states(self, outputs, lses):
        return merge_states(outputs, lses)

    def attention_weights(self, q, k, *, causal=True, scale=None):
        validate_inputs(q, k, k, causal=causal, scale=scale)
        return reference_weights(q, k, causal=causal, scale=scale)
