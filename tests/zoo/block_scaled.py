"""Zoo members in block-scaled formats: kernels whose plumbing of the blocks went wrong as
Blackwell kernels' did (v scaled along D, P at scale 1, the output halved, a block of 16 read as
32 and the reverse, e8m0's bias off by one, nibbles swapped, NVFP4's global scale dropped, the
log-sum-exp at P's scale or before the softmax scale, a page pool's last page read whole) or as
DeepSeek's latent cache can be misread (its rotary part read as e4m3, its scales per 64), and
correct ones that round P at 2^8 over tiles of 128 keys, dense or paged.

Each member is a plain callable that declares its convention by its keywords and its arithmetic
by attributes (fn.block_formats, fn.block_p, fn.block_output). The kernel below decodes the bytes
and runs the tiles itself, written here, not taken from the suite's reading of the formats.
"""

from __future__ import annotations

import functools

import numpy as np

from impls.contract import resolve_scale
from spec.formula import visible_keys
from spec.fp8 import round_to_fp8
from tests.zoo import correct_variant, mutant

TILE = 128  # keys per tile
CLAIMS = ("BLOCK-SCALES", "BLOCK-MAGNITUDE", "BLOCK-NAN", "BLOCK-ACCURACY")
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
E4M3_BYTES = np.array([
    (-1) ** (c >> 7) * (2.0 ** ((c >> 3 & 15) - 7) * (1 + (c & 7) / 8) if c >> 3 & 15
                        else 2.0**-6 * (c & 7) / 8)
    for c in range(256)
])  # fmt: skip
E4M3_BYTES[[0x7F, 0xFF]] = np.nan


def scale_values(codes, nvfp4: bool, bug) -> np.ndarray:
    codes = np.asarray(codes).astype(np.int64)
    if nvfp4:
        return E4M3_BYTES[codes]
    bias = 128 if bug == "e8m0-bias-128" else 127
    return np.where(codes == 255, np.nan, np.ldexp(1.0, codes - bias))


def decoded(elements, codes, *, along_keys: bool, block: int, nvfp4: bool, bug):
    """Elements (B, heads, T, D) times their scales read from the flat per-head buffer."""
    scales = scale_values(codes, nvfp4, bug).reshape(*codes.shape[:2], -1)
    tokens, width = elements.shape[2:]
    t, d = np.arange(tokens)[:, None], np.arange(width)[None, :]
    if bug == "block-16-on-32" or bug == "block-32-on-16":
        block = 16 if bug == "block-16-on-32" else 32
    index = (t // block) * width + d if along_keys else (t * width + d) // block
    return elements * scales[..., np.minimum(index, scales.shape[-1] - 1)]


def unpacked(packed, bug) -> np.ndarray:
    low, high = packed & 15, packed >> 4
    if bug == "nibbles-swapped":
        low, high = high, low
    return FP4[np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)]


def latent_cache(cache, bug):
    """(keys, values) of DeepSeek V3.2's 656-byte tokens: 512 e4m3fn latent bytes, 4 little-endian
    float32 scales (one per 128), 64 little-endian bfloat16 rotary values."""
    latent = E4M3_BYTES[np.asarray(cache[..., :512], np.int64)]
    scales = np.ascontiguousarray(cache[..., 512:528]).view("<f4").astype(np.float64)
    per = 64 if bug == "scales-per-64" else 128
    latent = latent * scales[..., np.minimum(np.arange(512) // per, 3)]
    if bug == "rope-as-e4m3":
        rope = E4M3_BYTES[np.asarray(cache[..., 528:592], np.int64)]
    else:
        bits = np.ascontiguousarray(cache[..., 528:656]).view("<u2").astype(np.uint32) << 16
        rope = bits.view(np.float32).astype(np.float64)
    return np.concatenate([latent, rope], axis=-1), latent


def gathered(pool, table, lengths, page_size: int) -> np.ndarray:
    """(B, Hkv, max L_b, X) of a pool (pages, page_size, Hkv, X): item b's first L_b tokens read
    through its table's pages, zeros past them."""
    pool = np.asarray(pool)
    dense = np.zeros((len(lengths), pool.shape[2], max(lengths), pool.shape[3]), pool.dtype)
    for b, length in enumerate(lengths):
        pages = np.asarray(table)[b, : -(-length // page_size)]
        dense[b, :, :length] = pool[pages].reshape(-1, *pool.shape[2:])[:length].swapaxes(0, 1)
    return dense


def block_kernel(q, k, v, *, causal, scale, p, bug, with_lse=False, block_table=None,
                 key_lengths=None, q_block_scales=None, k_block_scales=None, v_block_scales=None,
                 k_global_scale=None, v_global_scale=None, kv_cache_layout=None):  # fmt: skip
    """Attention over tiles of 128 keys with an online softmax on the decoded blocks, each tile's
    P rounded as ``p`` says (e4m3_offset8: times 2^8 into e4m3fn, divided out at the end); a
    cache's pools (k, v and their scales) read through the block table first."""
    if block_table is not None:
        page_size = k.shape[1]
        lengths = [int(n) for n in key_lengths]
        if bug == "last-page-whole":  # its slots past the item's length read as keys
            lengths = [-(-n // page_size) * page_size for n in lengths]
        k, v = (gathered(x, block_table, lengths, page_size) for x in (k, v))
        if k_block_scales is not None:
            k_block_scales = gathered(k_block_scales, block_table, lengths, page_size)
            v_block_scales = gathered(v_block_scales, block_table, lengths, page_size)
        key_lengths = lengths
    extent = {"key_lengths": key_lengths, "with_lse": with_lse}  # what the tiles run over
    if kv_cache_layout is not None:  # k and v: one latent cache
        work = np.float32
        k, v = (x.astype(work) for x in latent_cache(k, bug))
        return tiles(np.asarray(q, work), k, v, causal=causal, scale=scale, p=p, bug=bug,
                     work=work, **extent)  # fmt: skip
    mx = q_block_scales is not None
    nvfp4 = k_global_scale is not None
    block = 32 if mx or not nvfp4 else 16
    work = np.float64 if q.dtype == np.float64 else np.float32  # a plain float64 call's own
    operands = {}
    for name, x, codes, global_scale in (("q", q, q_block_scales, None),
                                         ("k", k, k_block_scales, k_global_scale),
                                         ("v", v, v_block_scales, v_global_scale)):  # fmt: skip
        if codes is None:  # a plain call's operand, or fp4_cache's q, in its own dtype
            operands[name] = np.asarray(x, work)
            continue
        elements = x.astype(np.float64) if mx else unpacked(x, bug)
        along_keys = mx and name == "v" and bug != "v-along-d"
        values = decoded(elements, codes, along_keys=along_keys, block=block, nvfp4=nvfp4,
                         bug=bug)  # fmt: skip
        if global_scale is not None and bug != "global-scale-dropped":
            values = values * float(global_scale)
        operands[name] = values.astype(work)
    return tiles(*(operands[name] for name in "qkv"), causal=causal, scale=scale, p=p, bug=bug,
                 work=work, **extent)  # fmt: skip


def tiles(q, k, v, *, causal, scale, p, bug, work, key_lengths=None, with_lse=False):
    """The online softmax over tiles of 128 keys on decoded operands, in ``work``; with
    ``with_lse``, (out, the natural log-sum-exp of each row's scores)."""
    heads = q.shape[1]
    k, v = (np.repeat(x, heads // x.shape[1], axis=1) for x in (k, v))
    tq, tk = q.shape[-2], k.shape[-2]
    if key_lengths is not None:  # an item's keys past its length are never loaded
        loaded = (np.arange(tk) < np.asarray(key_lengths)[:, None])[:, None, :, None]
        k, v = (np.where(loaded, x, work(0)) for x in (k, v))
    seen = visible_keys(tq, tk, causal=causal, key_lengths=key_lengths)
    offset = work(256.0 if p == "e4m3_offset8" else 1.0)
    score_scale = work(resolve_scale(scale, q.shape[-1]))
    top = np.full((*q.shape[:-1], 1), -np.inf, work)
    total = np.zeros_like(top)
    acc = np.zeros((*q.shape[:-1], v.shape[-1]), work)
    for start in range(0, tk, TILE):
        keys = slice(start, start + TILE)
        scores = (q @ k[..., keys, :].swapaxes(-1, -2)) * score_scale
        scores = np.where(seen[..., keys], scores, work(-np.inf))
        new_top = np.maximum(top, scores.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(new_top), new_top, work(0))
        correction, weights = np.exp(top - shift), np.exp(scores - shift)
        total = total * correction + weights.sum(axis=-1, keepdims=True)
        if p == "e4m3_offset8":
            scaled = offset if bug != "p-at-scale-1" else np.float32(1.0)
            weights = round_to_fp8(weights * scaled, "float8_e4m3fn").astype(np.float32)
            weights = weights * (offset / scaled)
        acc = acc * correction + weights @ v[..., keys, :]
        top = new_top
    if bug == "output-halved":
        total = total * 2
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total == 0, work(0), acc / (total * offset))
        if not with_lse:
            return out
        # P's sum as the tiles kept it: at P's e4m3 scale where that was never divided out
        kept = total * offset if bug == "lse-keeps-p-offset" else total
        if bug == "lse-unscaled":  # the row's max and sum exported of q k^T before the scale
            raw = np.where(seen, q @ k.swapaxes(-1, -2), work(-np.inf))
            top = raw.max(axis=-1, keepdims=True)
            kept = np.exp(raw - np.where(np.isfinite(top), top, work(0))).sum(-1, keepdims=True)
        return out, (top + np.log(kept))[..., 0]


def block_member(bug=None, *, formats=("mxfp8_e4m3", "mxfp8_e5m2", "nvfp4", "mxfp4")):
    """Gives the decorated signature (whose keywords declare its conventions) its body: a
    block-scaled call through :func:`block_kernel` with ``bug``, a plain one as float attention;
    and its declaration: P * 2^8 in e4m3, ``formats``, a float32 output under mx_attention."""

    def make(signature):
        @functools.wraps(signature)
        def attention(q, k, v, *, causal=True, scale=None, enable_gqa=False, return_lse=False,
                      page_size=None, **scales):  # fmt: skip
            scales = {name: value for name, value in scales.items() if value is not None}
            if not set(scales) - {"block_table", "key_lengths"}:
                answer = block_kernel(q, k, v, causal=causal, scale=scale, p="float32", bug=None,
                                      with_lse=return_lse, **scales)  # fmt: skip
                dtype = q.dtype
            else:
                answer = block_kernel(q, k, v, causal=causal, scale=scale, p="e4m3_offset8",
                                      bug=bug, with_lse=return_lse, **scales)  # fmt: skip
                dtype = np.float32 if "q_block_scales" in scales else q.dtype
            if return_lse:  # the log-sum-exp in the dtype the tiles ran in
                return answer[0].astype(dtype), answer[1]
            return answer.astype(dtype)

        attention.block_formats, attention.block_p = formats, "e4m3_offset8"
        attention.block_output = "float32"
        return attention

    return make


# --- mutants -------------------------------------------------------------------------------------


@mutant("block scaled", "BLOCK-SCALES", mistake="block-v-scaled-along-d")
@block_member("v-along-d", formats=("mxfp8_e4m3",))
def mx_v_scaled_along_d(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                        q_block_scales=None, k_block_scales=None, v_block_scales=None):  # fmt: skip
    """v's MX scales read as if they ran along the head dimension, as q's and k's do, where
    mx_attention lays them along the keys (TransformerEngine PR #3379)."""


@mutant("block scaled", "BLOCK-ACCURACY", mistake="block-p-at-scale-1")
@block_member("p-at-scale-1", formats=("mxfp8_e4m3",))
def mx_p_at_scale_1(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                    q_block_scales=None, k_block_scales=None, v_block_scales=None):  # fmt: skip
    """P rounded to e4m3 at a scale of 1 where 2^8 is declared (cudnn-frontend PR #904)."""


@mutant("block scaled", "BLOCK-MAGNITUDE", mistake="block-output-halved")
@block_member("output-halved", formats=("nvfp4",))
def nvfp4_output_halved(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                        k_block_scales=None, v_block_scales=None, k_global_scale=None,
                        v_global_scale=None):  # fmt: skip
    """The row sum reduced twice over the threads sharing a row: every output halved
    (FlashInfer PR #3838's NVFP4 kernel)."""


@mutant("block scaled", "BLOCK-SCALES", mistake="block-size-misread")
@block_member("block-16-on-32", formats=("mxfp4",))
def mxfp4_scales_per_16(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                        k_block_scales=None, v_block_scales=None):  # fmt: skip
    """MXFP4's scales, one per 32, applied to blocks of 16 as NVFP4's are."""


@mutant("block scaled", "BLOCK-SCALES", mistake="block-size-misread")
@block_member("block-32-on-16", formats=("nvfp4",))
def nvfp4_scales_per_32(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                        k_block_scales=None, v_block_scales=None, k_global_scale=None,
                        v_global_scale=None):  # fmt: skip
    """NVFP4's scales, one per 16, applied to blocks of 32 as MX's are."""


@mutant(
    "block scaled", "BLOCK-SCALES", mistake="block-e8m0-bias-128", alike=("block-output-halved",)
)
@block_member("e8m0-bias-128", formats=("mxfp8_e4m3",))
def e8m0_decoded_with_bias_128(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               q_block_scales=None, k_block_scales=None,
                               v_block_scales=None):  # fmt: skip
    """e8m0 scales decoded as 2^(code - 128): every scale halved."""


@mutant("block scaled", "BLOCK-SCALES", mistake="block-nibbles-swapped")
@block_member("nibbles-swapped", formats=("mxfp4",))
def fp4_nibbles_swapped(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                        k_block_scales=None, v_block_scales=None):  # fmt: skip
    """Packed e2m1 read with the first element in the high nibble."""


@mutant("block scaled", "BLOCK-SCALES", mistake="block-global-scale-dropped")
@block_member("global-scale-dropped", formats=("nvfp4",))
def nvfp4_global_scale_dropped(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               k_block_scales=None, v_block_scales=None, k_global_scale=None,
                               v_global_scale=None):  # fmt: skip
    """NVFP4's float32 global scales taken and never applied."""


@mutant("block scaled", "BLOCK-SCALES", mistake="block-rope-read-as-e4m3")
@block_member("rope-as-e4m3", formats=("deepseek_v32",))
def mla_rope_read_as_e4m3(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                          kv_cache_layout=None):  # fmt: skip
    """DeepSeek's latent cache with its rotary part read as e4m3fn bytes, as if all 576 values of
    a key were FP8."""


@mutant("block scaled", "BLOCK-SCALES", mistake="block-size-misread")
@block_member("scales-per-64", formats=("deepseek_v32",))
def mla_scales_per_64(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                      kv_cache_layout=None):  # fmt: skip
    """V3.2's latent scales, one per 128, applied to blocks of 64 as V4's cache lays them."""


@mutant("block scaled", "BLOCK-MAGNITUDE", mistake="lse-keeps-p-offset")
@block_member("lse-keeps-p-offset", formats=("mxfp8_e4m3",))
def mx_lse_keeps_p_offset(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                          return_lse=False, q_block_scales=None, k_block_scales=None,
                          v_block_scales=None):  # fmt: skip
    """The log-sum-exp taken of P's sum at P's e4m3 scale of 2^8, which the output divides out:
    every row's ln 2^8 too large, the output right."""


@mutant("block scaled", "BLOCK-SCALES", mistake="lse-unscaled")
@block_member("lse-unscaled", formats=("mxfp8_e4m3",))
def mx_lse_unscaled(q, k, v, *, causal=True, scale=None, enable_gqa=False, return_lse=False,
                    q_block_scales=None, k_block_scales=None, v_block_scales=None):  # fmt: skip
    """The log-sum-exp of the decoded q k^T before the softmax scale, the output right: at q = k
    = 0 every score is 0 either way, so only blocks of other magnitudes show it."""


@mutant("block scaled", "BLOCK-PAGED", mistake="block-last-page-read-whole")
@block_member("last-page-whole", formats=("nvfp4",))
def nvfp4_last_page_read_whole(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                               block_table=None, key_lengths=None, k_block_scales=None,
                               v_block_scales=None, k_global_scale=None,
                               v_global_scale=None):  # fmt: skip
    """An NVFP4 page pool read with each item's last page whole: the slots past its length taken
    as keys."""


# --- correct variants ----------------------------------------------------------------------------


@correct_variant(judged_on=CLAIMS)
@block_member()
def blocks_over_tiles_of_128(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                             return_lse=False, block_table=None, key_lengths=None,
                             q_block_scales=None, k_block_scales=None, v_block_scales=None,
                             k_global_scale=None, v_global_scale=None):  # fmt: skip
    """Every format in both conventions: the blocks decoded from their bytes, tiles of 128 keys,
    P * 2^8 in e4m3."""


@correct_variant(judged_on=CLAIMS)
@block_member(formats=("deepseek_v32",))
def latent_cache_over_tiles_of_128(q, k, v, *, causal=True, scale=None, enable_gqa=False,
                                   return_lse=False, block_table=None, key_lengths=None,
                                   kv_cache_layout=None):  # fmt: skip
    """DeepSeek's latent cache decoded from its bytes, tiles of 128 keys, P * 2^8 in e4m3."""
