"""Zoo members in FP8: kernels whose scales' plumbing, format or rounding went wrong as serving
kernels' did (a scale dropped, applied twice, read by query head or without the batch term; the
bytes read in another format; P rounded without its offset; an accumulator in bfloat16), and
correct roads (FlashAttention 3's tiles of 128 keys in base 2; P in e4m3 as it is, declared).

Each member is a plain callable that declares its convention by its scales' keywords and its
arithmetic by attributes (fn.fp8_p, fn.fp8_formats, fn.fp8_output); a call without scales is
plain float attention. The kernel below is written here, tile by tile, not taken from the
suite's baseline.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from impls.contract import resolve_scale
from spec.dtypes import rounded_in_storage
from spec.formula import visible_keys
from spec.fp8 import reinterpreted, round_to_fp8
from spec.mistakes.fp8 import NAN_BYTE_AS_NUMBER
from tests.zoo import correct_variant, mutant

TILE = 128  # keys per tile, FlashAttention 3's
# What a correct member is judged on in the project's tests: its plain calls are float attention,
# which other members own
FP8_CLAIMS = ("FP8-SCALES", "FP8-FORMAT", "FP8-ACCURACY", "FP8-NAN")
LOG2_E = math.log2(math.e)


def per_query_head(table, heads: int, batch: int, bug=None) -> np.ndarray:
    """A scale (a float, (Hkv,) or (B, Hkv)) as query head h applies it: (B, H, 1, 1)."""
    table = np.asarray(table, np.float32)
    kv_heads = table.shape[-1] if table.ndim else 1
    table = np.broadcast_to(table.reshape(-1, kv_heads), (batch, kv_heads))
    if bug == "without-batch":
        table = np.broadcast_to(table[:1], table.shape)
    heads_read = np.arange(heads) % kv_heads if bug == "by-query-head" else (
        np.arange(heads) // (heads // kv_heads)
    )  # fmt: skip
    return table[:, heads_read][:, :, None, None]


def fp8_kernel(q, k, v, *, causal, scale, q_descale=None, k_descale=None, v_descale=None,
               k_scale=None, v_scale=None, p="e4m3_offset8", base_2=False, bug=None):  # fmt: skip
    """Attention over key tiles of 128 with an online softmax, the scales on the scores and the
    output, each tile's P rounded as ``p`` says (e4m3_offset8: times 2^8 into e4m3fn, divided
    out at the end), in float32; ``bug`` one of the mistakes below (None: none)."""
    batch, heads, tq, _ = q.shape
    fmt = str(k.dtype)
    if bug is not None and bug.startswith("read-as-"):
        read = bug.removeprefix("read-as-")
        if q_descale is not None:
            q = reinterpreted(q.astype(np.float64), fmt, read)
        k, v = (reinterpreted(x.astype(np.float64), fmt, read) for x in (k, v))
    if bug == "nan-as-a-number":
        number = NAN_BYTE_AS_NUMBER[fmt]
        if q_descale is not None:
            q = np.nan_to_num(q.astype(np.float64), nan=number)
        k, v = (np.nan_to_num(x.astype(np.float64), nan=number) for x in (k, v))
    work = np.float64 if q.dtype == np.float64 else np.float32  # a plain float64 call's own
    q, k, v = (np.asarray(x, work) for x in (q, k, v))
    k, v = (
        np.repeat(x, heads // x.shape[1], axis=1) for x in (k, v)
    )  # (B, Hkv, T, D) -> (B, H, T, D)
    scale_bug = bug if bug in ("by-query-head", "without-batch") else None
    scales = {
        name: per_query_head(table, heads, batch, scale_bug)
        for name, table in (("q", q_descale), ("k", k_descale if k_scale is None else k_scale),
                            ("v", v_descale if v_scale is None else v_scale))
        if table is not None
    }  # fmt: skip
    if bug == "v-dropped":
        scales.pop("v")
    if bug == "k-twice":
        scales["k"] = scales["k"] * scales["k"]
    one = np.ones((1, 1, 1, 1), work)
    score_scale = (
        work(resolve_scale(scale, q.shape[-1])) * scales.get("q", one) * scales.get("k", one)
    )
    if base_2:
        score_scale = score_scale * work(LOG2_E)
    exp = np.exp2 if base_2 else np.exp
    offset = work(256.0 if p == "e4m3_offset8" else 1.0)
    tk = k.shape[-2]
    seen = visible_keys(tq, tk, causal=causal)  # (1, 1, Tq, Tk)
    top = np.full((batch, heads, tq, 1), -np.inf, work)
    total = np.zeros((batch, heads, tq, 1), work)
    acc = np.zeros((batch, heads, tq, v.shape[-1]), work)
    for start in range(0, tk, TILE):
        keys = slice(start, start + TILE)
        scores = (q @ k[..., keys, :].swapaxes(-1, -2)) * score_scale  # (B, H, Tq, tile)
        scores = np.where(seen[..., keys], scores, work(-np.inf))
        new_top = np.maximum(top, scores.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(new_top), new_top, work(0))
        correction = exp(top - shift)
        weights = exp(scores - shift)
        total = total * correction + weights.sum(axis=-1, keepdims=True)
        if p in ("e4m3", "e4m3_offset8") and bug != "no-offset":
            weights = round_to_fp8(weights * offset, "float8_e4m3fn").astype(np.float32)
        elif bug == "no-offset":
            weights = round_to_fp8(weights, "float8_e4m3fn").astype(np.float32) * offset
        elif p == "bfloat16":
            weights = rounded_in_storage(weights, "bfloat16")
        acc = acc * correction
        if bug == "bf16-accumulator":
            for chunk in range(0, weights.shape[-1], 16):
                part = (
                    weights[..., chunk : chunk + 16] @ v[..., keys, :][..., chunk : chunk + 16, :]
                )
                acc = rounded_in_storage(acc + part, "bfloat16")
        else:
            acc = acc + weights @ v[..., keys, :]
        top = new_top
    with np.errstate(invalid="ignore", divide="ignore"):  # a row that read a NaN stays NaN
        out = np.where(total == 0, work(0), acc / (total * offset))
    return out * scales.get("v", one)


def fp8_member(bug=None, *, p="e4m3_offset8", base_2=False, formats=("float8_e4m3fn",)):
    """Gives the decorated signature (whose keywords declare its convention) its body: an FP8
    call through :func:`fp8_kernel` with ``bug``, a plain one as float attention; and its
    declaration: P rounded as ``p``, ``formats``, a float32 output under the descale
    convention."""

    def make(signature):
        @functools.wraps(signature)
        def attention(q, k, v, *, causal=True, scale=None, enable_gqa=False, **scales):
            scales = {name: value for name, value in scales.items() if value is not None}
            if not scales:
                out = fp8_kernel(q, k, v, causal=causal, scale=scale, p="float32")
                return out.astype(q.dtype)
            out = fp8_kernel(q, k, v, causal=causal, scale=scale, p=p, base_2=base_2, bug=bug,
                             **scales)  # fmt: skip
            return out.astype(q.dtype if "k_scale" in scales else np.float32)

        attention.fp8_p, attention.fp8_formats, attention.fp8_output = p, formats, "float32"
        return attention

    return make


# --- mutants -------------------------------------------------------------------------------------


@mutant("fp8", "FP8-SCALES", mistake="fp8-v-scale-dropped")
@fp8_member("v-dropped")
def v_scale_never_applied(q, k, v, *, causal=True, scale=None, enable_gqa=False, k_scale=None,
                          v_scale=None):  # fmt: skip
    """The key/value cache's v_scale taken and never applied: the output off by the scale, its
    cosine 1 (FlashInfer #4979)."""


@mutant("fp8", "FP8-SCALES", mistake="fp8-k-scale-twice")
@fp8_member("k-twice")
def k_scale_applied_twice(q, k, v, *, causal=True, scale=None, enable_gqa=False, k_scale=None,
                          v_scale=None):  # fmt: skip
    """k_scale applied to the loaded keys and again to the scores (SGLang PR #34765)."""


@mutant("fp8", "FP8-SCALES", mistake="fp8-scale-by-query-head")
@fp8_member("by-query-head")
def descale_read_by_query_head(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """The (B, Hkv) descales read with the query head's index h % Hkv, not its kv head's h // g
    (ROCm CK PR #10474)."""


@mutant("fp8", "FP8-SCALES", mistake="fp8-scale-without-batch")
@fp8_member("without-batch")
def descale_without_batch_term(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """The (B, Hkv) descales indexed by the kv head alone: item 0's for every item."""


@mutant("fp8", "FP8-FORMAT", mistake="fp8-read-as-e5m2")
@fp8_member("read-as-float8_e5m2")
def e4m3_bytes_read_as_e5m2(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                            k_scale=None, v_scale=None):  # fmt: skip
    """e4m3fn bytes read as e5m2: [1, 2, 3.5, 0.25] reads back [0.5, 2, 6, 0.03125] (vLLM PR
    #54341)."""


@mutant("fp8", "FP8-FORMAT", mistake="fp8-read-as-e4m3fnuz")
@fp8_member("read-as-float8_e4m3fnuz", formats=("float8_e4m3fn", "float8_e4m3fnuz"))
def e4m3fn_read_as_fnuz(q, k, v, *, causal=True, scale=None, enable_gqa=False, q_descale=None,
                        k_descale=None, v_descale=None):  # fmt: skip
    """Both e4m3 formats declared, every byte read as e4m3fnuz: OCP e4m3fn values halved (vLLM
    #45562)."""


@mutant("fp8", "FP8-ACCURACY", mistake="fp8-p-without-offset")
@fp8_member("no-offset")
def p_rounded_without_the_offset(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                 q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """P * 2^8 declared, P rounded to e4m3 as it is: the small weights of a long row fall to
    subnormals or 0 (ROCm aiter PR #5642)."""


@mutant("fp8", "FP8-ACCURACY", mistake="fp8-narrow-accumulator")
@fp8_member("bf16-accumulator")
def pv_accumulated_in_bfloat16(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """P v summed in a bfloat16 accumulator, 16 keys at a time (FlashAttention PR #2250)."""


@mutant("fp8", "FP8-NAN", mistake="fp8-nan-as-a-number")
@fp8_member("nan-as-a-number")
def nan_byte_read_as_a_number(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                              q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """A hand-written decoder without e4m3fn's NaN: the byte 0x7F read as 480, so that a NaN in
    the cache becomes a large number and the output a plausible one."""


# --- correct variants ----------------------------------------------------------------------------


@correct_variant(judged_on=FP8_CLAIMS)
@fp8_member(base_2=True, formats=("float8_e4m3fn", "float8_e5m2"))
def fp8_tiles_in_base_2(q, k, v, *, causal=True, scale=None, enable_gqa=False, q_descale=None,
                        k_descale=None, v_descale=None, k_scale=None, v_scale=None):  # fmt: skip
    """FlashAttention 3's FP8 forward: tiles of 128 keys, exp2 of scores times log2(e), P * 2^8
    in e4m3, in both conventions."""


@correct_variant(judged_on=FP8_CLAIMS)
@fp8_member(p="e4m3")
def fp8_p_in_e4m3_as_declared(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                              k_scale=None, v_scale=None):  # fmt: skip
    """P rounded to e4m3 without an offset, and declared so (fp8_p = "e4m3"): held to what that
    rounding costs, not to float32's."""
