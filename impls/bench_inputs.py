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

from spec.dtypes import round_to


def fresh_inputs(
    seed: int, dims: tuple[int, int, int, int, int, int], dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal q (B, H, Tq, D), k and v (B, Hkv, Tk, D) as float64 exact in ``dtype``,
    for ``dims`` = (B, H, Hkv, Tq, Tk, D)."""
    batch, heads, kv_heads, tq, tk, head_dim = dims
    rng = np.random.default_rng(seed)
    # float32 draws for every dtype but float64: half the time of float64 draws at large shapes
    draw_dtype = np.float64 if dtype == "float64" else np.float32
    shapes = ((batch, heads, tq, head_dim), (batch, kv_heads, tk, head_dim))
    q = rng.standard_normal(shapes[0], dtype=draw_dtype)
    k, v = (rng.standard_normal(shapes[1], dtype=draw_dtype) for _ in range(2))
    return tuple(round_to(x.astype(np.float64), dtype) for x in (q, k, v))
