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

from spec.block_scaled import BlockCall, convention_of, quantize_call
from spec.dtypes import rounded_in_storage
from spec.fp8 import Fp8Scales, fp8_format, numpy_dtype

HALF_WIDTH = 3**0.5  # uniform on [-sqrt(3), sqrt(3)): mean 0, variance 1, as randn's


def fresh_inputs(
    seed: int, dims: tuple[int, int, int, int, int, int], dtype: str, grad_out: bool = False,
    value_dim: int | None = None,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) for ``dims`` = (B, H, Hkv, Tq, Tk, D), drawn
    uniformly with variance 1, exact in ``dtype`` and held in spec.dtypes.numpy_storage(dtype);
    with ``grad_out``, a fourth, the backward's dO (B, H, Tq, Dv). With ``value_dim``, v is k's
    first Dv columns (a view), MLA's absorbed form.

    Uniform, not normal: the draw is part of every request's cost, which the judge measures and
    subtracts from its clock, so the cheaper and steadier the better (ANDREA's three arrays:
    5 ms uniform against 23 ms normal, in float32 on a 2-core machine)."""
    batch, heads, kv_heads, tq, tk, head_dim = dims
    rng = np.random.default_rng(seed)
    draw_dtype = np.float64 if dtype == "float64" else np.float32
    shapes = ((batch, heads, tq, head_dim), (batch, kv_heads, tk, head_dim), None)
    if grad_out:
        shapes += ((batch, heads, tq, value_dim or head_dim),)
    drawn = []
    for index, shape in enumerate(shapes):
        if index == 2 and value_dim is not None:
            drawn.append(drawn[1][..., :value_dim])
            continue
        x = rng.random(shape or shapes[1], dtype=draw_dtype)  # [0, 1)
        x -= 0.5
        x *= 2 * HALF_WIDTH
        drawn.append(rounded_in_storage(x, dtype))
    return tuple(drawn)


def fresh_fp8_inputs(
    seed: int, dims: tuple[int, int, int, int, int, int], fmt: str, query_dtype: str | None = None
):
    """An FP8 call's inputs for ``dims``: drawn as :func:`fresh_inputs` draws float32 ones, each
    (b, kv head) given a scale of its own from the same seed, and x / scale rounded to ``fmt`` in
    float32, as a caller quantizes: q, k and v with their descales (B, Hkv), FlashAttention 3's
    convention; with ``query_dtype``, the key/value cache's: q in it, k and v with a scale per kv
    head (Hkv,). Returns q, k, v (float32, exact in their dtypes) and their Fp8Scales.

    The scales map the draw's largest magnitude, below HALF_WIDTH, to between half the format's
    largest value and all of it, as amax / largest would, without a pass over the arrays to find
    amax: the draw is part of every request's cost (llama3-8b-decode's k and v through the
    recipes of spec.fp8: 52 s)."""
    q, k, v = fresh_inputs(seed, dims, "float32")
    batch, _, kv_heads = dims[:3]
    rng = np.random.default_rng([seed, 8])  # the scales' own stream, the same for the judge
    unit = np.float32(HALF_WIDTH / fp8_format(fmt).largest_finite)
    fp8 = numpy_dtype(fmt)

    def scales(shape) -> np.ndarray:
        return rng.uniform(1.0, 2.0, shape).astype(np.float32) * unit

    def stored(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """x / scale rounded to the format, in x's place: a large array's first touch is the
        slow part of the draw on a machine whose memory is handed back when freed."""
        x /= scale  # scale broadcasts against x
        np.copyto(x, x.astype(fp8), casting="unsafe")  # exact: the FP8 values in float32
        return x

    if query_dtype is None:
        q_descale, k_descale, v_descale = (scales((batch, kv_heads)) for _ in range(3))
        grouped = q.reshape(batch, kv_heads, -1, q.shape[-1])  # (B, Hq, Tq, D) -> (B, Hkv, g Tq, D)
        stored_q = stored(grouped, q_descale[:, :, None, None]).reshape(q.shape)
        keywords = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        return (stored_q, stored(k, k_descale[:, :, None, None]),
                stored(v, v_descale[:, :, None, None]), Fp8Scales("descale", keywords))  # fmt: skip
    k_scale, v_scale = (scales(kv_heads) for _ in range(2))
    return (rounded_in_storage(q, query_dtype), stored(k, k_scale[None, :, None, None]),
            stored(v, v_scale[None, :, None, None]),
            Fp8Scales("kv_scale", dict(k_scale=k_scale, v_scale=v_scale)))  # fmt: skip


BLOCK_QUERY_DTYPE = "bfloat16"  # an FP4 key/value cache's q: the 16 bits its kernels take


def fresh_block_call(
    seed: int, dims: tuple[int, int, int, int, int, int], fmt: str, query_dtype: str | None = None,
    value_dim: int | None = None,
) -> BlockCall:  # fmt: skip
    """A block-scaled call's inputs for ``dims``: drawn as :func:`fresh_inputs` draws float32
    ones, then quantized by the format's recipe (spec.block_scaled.quantize_call) in its
    convention: MXFP8 attention's, or an FP4 key/value cache's with q in ``query_dtype``
    (BLOCK_QUERY_DTYPE where None), or a latent cache's of k's rotary part and v (``value_dim``
    wide: k's first columns, MLA's) with q in ``query_dtype``."""
    q, k, v = fresh_inputs(seed, dims, "float32", value_dim=value_dim)
    return quantize_call(q, k, v, convention_of(fmt), fmt, query_dtype or BLOCK_QUERY_DTYPE)
