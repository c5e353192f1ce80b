"""``numpy``: attention in NumPy for float32 and float64, computed in the input's dtype.

Unlike the oracle it never widens to float64, so it shows what a same-precision implementation
of the formula achieves. Queries go in blocks of 64 rows; a block's scores are computed only
against the keys its last row may see, so under the causal mask about half of the (Tq, Tk)
products and exponentials are never computed, and only the block's (Tq-block, keys) buffer is
alive at a time. Each row is normalised after the product with V (one division per output
element instead of one per weight).

Grouped-query heads read their key/value head through an index (a copy of k and v per query
head); a window masks the keys behind it and skips the ones no row of a block sees; with key
lengths each batch item is its own call on its first L_b keys, and each packed sequence is its
own call on its slice.

Large calls split the (batch, head) pairs into one group per core and run the groups on a
thread pool, with BLAS held to one thread meanwhile (threadpoolctl): NumPy's elementwise passes
(max, subtract, exp, sum) run on one core, and BLAS's own threads, left free, keep spinning
after each product, holding the cores the other group needs. Which path a call takes
depends only on its shapes, so equal calls give equal bits. Without threadpoolctl every call
runs on the calling thread.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from impls.block_scaled_calls import is_block_scaled_call
from impls.capabilities import SCORE_FEATURES, STATE_FEATURES, every_extension_but
from impls.contract import (
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    NumpyArrays,
    resolve_scale,
    validate_inputs,
)
from impls.fp8_calls import is_fp8_call
from impls.machine import usable_cores
from impls.numpy_block_scaled import block_scaled_attention
from impls.numpy_fp8 import FP8_QUERY_DTYPES, dequantized_attention
from spec.formula import repeat_kv_heads
from spec.masks import LISTED_KEYWORDS, cut_to_item, visible_keys

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # optional: without it, no thread pool (see the module's docstring)
    ThreadpoolController = None

QUERY_BLOCK = 128
# Below this many scores (B*H*Tq*Tk) a call stays on the calling thread: the hand-off to the pool
# and the BLAS thread limit cost about a tenth of a millisecond.
PARALLEL_MIN_SCORES = 1 << 20


@functools.cache
def head_pool() -> tuple[ThreadPoolExecutor, object] | None:
    """(thread pool, BLAS controller), or None where threads cannot help or be controlled."""
    if ThreadpoolController is None or usable_cores() < 2:
        return None
    return ThreadPoolExecutor(usable_cores(), "attnspec-numpy"), ThreadpoolController()


@functools.lru_cache(maxsize=8)
def future_corner(rows: int) -> np.ndarray:
    """(rows, rows) True strictly above the diagonal: a block's future keys."""
    corner = np.triu(np.ones((rows, rows), dtype=bool), 1)
    corner.setflags(write=False)
    return corner


class NumpyVectorised(NumpyArrays, Implementation):
    name = "numpy"
    capabilities = Capabilities(
        dtypes=("float64", "float32"),
        conventions=RAISES_ON_ALL,
        # every layout: reshape copies what is not contiguous
        **every_extension_but(*SCORE_FEATURES, *STATE_FEATURES),
        # FP8 dequantized first: the reference's arithmetic in float32 (impls.numpy_fp8)
        fp8=True,
        fp8_formats=("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"),
        fp8_p="float32",
        fp8_output="float32",
        fp8_query_dtypes=FP8_QUERY_DTYPES,
        # block-scaled: dequantized first, the same float32 path (impls.numpy_block_scaled)
        block_scaled=True,
        block_p="float32",
        block_output="float32",
    )

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, key_lengths=None, **packing
    ):
        extras = {"window": window, "key_lengths": key_lengths}
        extras = {name: value for name, value in extras.items() if value is not None}
        if is_block_scaled_call(packing):
            return block_scaled_attention(
                self.attention,
                self.capabilities,
                q,
                k,
                v,
                causal=causal,
                scale=scale,
                **extras,
                **packing,
            )
        if is_fp8_call(q, k, v, packing):
            return dequantized_attention(self, q, k, v, causal=causal, scale=scale,
                                         **extras, **packing)  # fmt: skip
        # the masks given as arrays: a custom mask, a tree, the keys each row lists
        listed = {name: packing.pop(name) for name in LISTED_KEYWORDS if name in packing}
        variant = dict(window=window, key_lengths=key_lengths, **listed)
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=True, **variant, **packing)
        self.check_float_dtype(q)
        split = self.each_item_or_sequence(
            q, k, v, causal=causal, scale=scale, **variant, **packing
        )
        if split is not None:
            return split
        if key_lengths is not None:
            return np.concatenate(
                [
                    self.attention(
                        q[b : b + 1],
                        k[b : b + 1, :, :length],
                        v[b : b + 1, :, :length],
                        causal=causal,
                        scale=scale,
                        window=window,
                        **cut_to_item(listed, b, slice(None), slice(0, length)),
                    )
                    if length
                    else self.empty_rows(q[b : b + 1], v[b : b + 1])  # no key (EMPTY-KV)
                    for b, length in enumerate(key_lengths)
                ]
            )
        k, v = repeat_kv_heads(q, k), repeat_kv_heads(q, v)  # (B, Hkv, T, D) -> (B, Hq, T, D)
        scale = q.dtype.type(resolve_scale(scale, q.shape[-1]))
        (tq, d), (tk, dv) = q.shape[-2:], v.shape[-2:]
        out = np.empty((*q.shape[:-1], dv), dtype=q.dtype)  # (B, H, Tq, Dv)
        # (B*H, T, D): one row per (batch, head); a copy only where the input is not contiguous.
        q3, k3, v3 = q.reshape(-1, tq, d), k.reshape(-1, tk, d), v.reshape(-1, tk, dv)
        out3 = out.reshape(-1, tq, dv)  # a view: writes land in out
        pairs = q3.shape[0]
        pool = head_pool()
        workers = min(usable_cores(), pairs) if pool else 1
        hidden3 = None
        if any(value is not None for value in listed.values()):
            # (B*H, Tq, Tk): True where the mask hides a key
            seen = visible_keys(tq, tk, causal=False, heads=q.shape[1], **listed)
            hidden3 = ~np.broadcast_to(seen, (*q.shape[:2], tq, tk)).reshape(-1, tq, tk)
        if workers == 1 or pairs * tq * tk < PARALLEL_MIN_SCORES:
            attend(q3, k3, v3, out3, scale=scale, causal=causal, window=window, hidden=hidden3)
            return self.with_blind_rows(out, causal=causal, tk=tk, **variant)
        executor, blas = pool
        bounds = np.linspace(0, pairs, workers + 1).astype(int)
        groups = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        with blas.limit(limits=1, user_api="blas"):
            for done in [
                executor.submit(
                    attend,
                    q3[g],
                    k3[g],
                    v3[g],
                    out3[g],
                    scale=scale,
                    causal=causal,
                    window=window,
                    hidden=None if hidden3 is None else hidden3[g],
                )
                for g in groups
            ]:
                done.result()  # re-raises a worker's exception here
        return self.with_blind_rows(out, causal=causal, tk=tk, **variant)


def attend(q, k, v, out, *, scale, causal: bool, window: int | None = None, hidden=None) -> None:
    """Attention of (N, Tq, D), (N, Tk, D), (N, Tk, Dv) into ``out`` (N, Tq, Dv), block by block;
    a left ``window`` w keeps row i's keys from its position - w on; ``hidden`` (N, Tq, Tk), where
    given, hides the keys a custom mask hides."""
    with np.errstate(invalid="ignore"):  # a row the mask leaves no key: 0 / 0, replaced after
        attend_blocks(q, k, v, out, scale=scale, causal=causal, window=window, hidden=hidden)


def attend_blocks(q, k, v, out, *, scale, causal: bool, window, hidden) -> None:
    tq, tk = q.shape[-2], k.shape[-2]
    offset = tk - tq  # bottom-right alignment: query row i sits at absolute position i + offset
    keys_t = k.swapaxes(-1, -2)  # (N, D, Tk)
    for start in range(0, tq, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, tq)
        # Keys the block's last row may see; for a causal block, only the last (stop - start)
        # of them can lie in some row's future, in a strict upper triangle.
        keys = stop + offset if causal else tk
        # With a window, keys before the block's first row's window are seen by no row in it.
        first = 0 if window is None else max(start + offset - window, 0)
        scores = q[:, start:stop, :] @ keys_t[..., first:keys]  # (N, bq, keys - first)
        scores *= scale
        if causal:
            # Overwritten, not added to: a NaN or inf future score must not survive.
            np.copyto(
                scores[..., keys - first - (stop - start) :],
                -np.inf,
                where=future_corner(stop - start),
            )
        if window is not None:
            positions = np.arange(start, stop)[:, None] + offset  # (bq, 1)
            behind = np.arange(first, keys)[None, :] < positions - window  # (bq, keys - first)
            np.copyto(scores, -np.inf, where=behind)
        if hidden is not None:
            np.copyto(scores, -np.inf, where=hidden[:, start:stop, first:keys])
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        row_sums = scores.sum(axis=-1, keepdims=True)  # (N, bq, 1)
        np.divide(scores @ v[:, first:keys, :], row_sums, out=out[:, start:stop, :])
