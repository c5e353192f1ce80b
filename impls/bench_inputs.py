"""The inputs of one timed call, drawn from a seed the judge sends with the call.

The judge's clock cannot see inside a worker, so what the timed implementation may not do is
ruled out by what it is given: each timed call draws new inputs from a seed the judge chose
(``secrets``) and sent only with that call, so no answer computed before the call, or cached
from an earlier one, is the answer to it. The judge draws the same inputs from the same seed to
check the answer. Shared by the worker (impls/worker_process.py) and the judge
(conformance/bench): the same function, the same bits.
"""

from __future__ import annotations

import numpy as np

from spec.dtypes import rounded_in_storage
from spec.fp8 import quantize_call

HALF_WIDTH = 3**0.5  # uniform on [-sqrt(3), sqrt(3)): mean 0, variance 1, as randn's


def fresh_inputs(
    seed: int, dims: tuple[int, int, int, int, int, int], dtype: str, grad_out: bool = False
) -> tuple[np.ndarray, ...]:
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) for ``dims`` = (B, H, Hkv, Tq, Tk, D), drawn
    uniformly with variance 1, exact in ``dtype`` and held in spec.dtypes.numpy_storage(dtype);
    with ``grad_out``, a fourth, the backward's dO (B, H, Tq, D).

    Uniform, not normal: the draw is part of every request's cost, which the judge measures and
    subtracts from its clock, so the cheaper and steadier the better (ANDREA's three arrays:
    5 ms uniform against 23 ms normal, in float32 on a 2-core machine)."""
    batch, heads, kv_heads, tq, tk, head_dim = dims
    rng = np.random.default_rng(seed)
    draw_dtype = np.float64 if dtype == "float64" else np.float32
    shapes = ((batch, heads, tq, head_dim), (batch, kv_heads, tk, head_dim), None)
    if grad_out:
        shapes += (shapes[0],)
    drawn = []
    for shape in shapes:
        x = rng.random(shape or shapes[1], dtype=draw_dtype)  # [0, 1)
        x -= 0.5
        x *= 2 * HALF_WIDTH
        drawn.append(rounded_in_storage(x, dtype))
    return tuple(drawn)


def fresh_fp8_inputs(
    seed: int, dims: tuple[int, int, int, int, int, int], fmt: str, query_dtype: str | None = None
):
    """An FP8 call's inputs for ``dims``: drawn as :func:`fresh_inputs` draws float32 ones, then
    quantized to ``fmt`` as callers quantize them (spec.fp8.quantize_call): q, k and v with
    per (b, h_kv) descales, FlashAttention 3's convention; with ``query_dtype``, the key/value
    cache's: q in it, k and v with a scale per kv head. Returns q, k, v (float64, exact in their
    dtypes) and their Fp8Scales."""
    q, k, v = fresh_inputs(seed, dims, "float32")
    convention = "descale" if query_dtype is None else "kv_scale"
    return quantize_call(q, k, v, fmt, convention, "kv_head", query_dtype)
