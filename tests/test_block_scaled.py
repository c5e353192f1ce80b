"""spec.block_scaled's formats held to ml_dtypes (and torch where installed) on every code, its
recipes and readings, and the entry point's refusals of malformed block-scaled calls."""

from __future__ import annotations

import numpy as np
import pytest

from impls.block_scaled_calls import checked_block_call
from impls.capabilities import Capabilities
from impls.contract import PlainCallable
from impls.registry import resolve
from impls.validation import AttentionInputError
from spec.block_scaled import (
    BLOCK_FORMATS,
    CACHE_LAYOUTS,
    E8M0_NAN,
    Reading,
    block_format,
    e2m1_codes,
    e2m1_values,
    e8m0_values,
    packed_e2m1,
    quantize_call,
    round_to_e2m1,
    unpacked_e2m1,
    unread_bytes,
)
from spec.formula import page_pool

ml_dtypes = pytest.importorskip("ml_dtypes")


def test_e8m0_reads_every_byte_as_ml_dtypes_does():
    codes = np.arange(256, dtype=np.uint8)
    expected = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    np.testing.assert_array_equal(e8m0_values(codes), expected)
    assert np.isnan(e8m0_values(E8M0_NAN))


def test_e2m1_reads_every_code_and_rounds_as_ml_dtypes_does():
    codes = np.arange(16, dtype=np.uint8)
    expected = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    np.testing.assert_array_equal(e2m1_values(codes), expected)
    np.testing.assert_array_equal(e2m1_codes(expected), codes)
    draws = np.random.default_rng(0).uniform(-8, 8, 10_000)
    draws = np.concatenate([draws, np.arange(-14, 15) / 4])  # every tie between neighbours
    rounded = draws.astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    np.testing.assert_array_equal(round_to_e2m1(draws), rounded)


@pytest.mark.optional_libraries
def test_torch_reads_e8m0_bytes_alike_where_it_has_the_dtype():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e8m0fnu"):
        pytest.skip("this torch has no float8_e8m0fnu")
    codes = torch.arange(256, dtype=torch.uint8)
    expected = codes.view(torch.float8_e8m0fnu).float().double().numpy()
    np.testing.assert_array_equal(e8m0_values(np.arange(256)), expected)


def test_two_e2m1_codes_a_byte_the_first_in_the_low_nibble():
    packed = packed_e2m1(np.array([[1, 15, 7, 0]]))
    np.testing.assert_array_equal(packed, [[0xF1, 0x07]])
    np.testing.assert_array_equal(unpacked_e2m1(packed), [[1, 15, 7, 0]])
    np.testing.assert_array_equal(unpacked_e2m1(packed, low_first=False), [[15, 1, 0, 7]])


@pytest.mark.parametrize("fmt", [f for f in BLOCK_FORMATS if f not in CACHE_LAYOUTS])
def test_the_recipe_keeps_every_block_within_its_format_and_near_its_values(fmt):
    spec = block_format(fmt)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 64, 64)) * 2.0 ** rng.integers(-8, 8, (1, 2, 64, 1))
    x[0, 0, 0, : spec.block] = 0.0  # a block of zeros
    convention = "fp4_cache" if spec.packed else "mx_attention"
    call = quantize_call(x, x, x, convention, fmt, "float32")
    _, k, _ = call.dequantized()
    assert not np.any(k[0, 0, 0, : spec.block])
    # each element within half a spacing of its format at its block's scale: 2^-3 (e4m3),
    # 2^-2 (e5m2), 1/4 of 6's neighbourhood (e2m1), of the block's largest
    blocks = np.abs(x - k).reshape(1, 2, 64, -1, spec.block).max(axis=-1)
    largest = np.abs(x).reshape(1, 2, 64, -1, spec.block).max(axis=-1)
    share = {"float8_e4m3fn": 2.0**-3, "float8_e5m2": 2.0**-2, "e2m1": 1 / 4}[spec.element]
    assert np.all(blocks <= share * largest * 1.01)


def test_a_reading_with_one_field_changed_reads_other_values():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 1, 64, 64)) * 2.0 ** rng.integers(-4, 4, (1, 1, 64, 2)).repeat(
        32, axis=-1
    )
    mx = quantize_call(x, x, x, "mx_attention", "mxfp8_e4m3")
    fp4 = quantize_call(x, x, x, "fp4_cache", "nvfp4", "float32")
    truth = {id(call): call.dequantized() for call in (mx, fp4)}
    for call, reading in (
        (mx, Reading(v_axis=3)),
        (mx, Reading(e8m0_bias=128)),
        (mx, Reading(scale_block_shift=1)),
        (fp4, Reading(low_first=False)),
        (fp4, Reading(block=32)),
        (fp4, Reading(global_scales=False)),
    ):
        misread = call.dequantized(reading)
        assert any(not np.allclose(a, b) for a, b in zip(misread, truth[id(call)], strict=True))


def latent_call(tokens: int = 8):
    """A latent cache's call: q (1, 2, tokens, 576); k's last 64 values its rotary part, v its
    latent, each block of 128 at its own magnitude, key 0's second block zeros."""
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, tokens, 576))
    magnitudes = 2.0 ** rng.integers(-8, 8, (1, 1, tokens, 4))
    latent = rng.standard_normal((1, 1, tokens, 512)) * magnitudes.repeat(128, axis=-1)
    latent[0, 0, 0, 128:256] = 0.0
    keys = rng.standard_normal((1, 1, tokens, 576))
    return quantize_call(q, keys, latent, "mla_fp8_cache", "deepseek_v32", "bfloat16")


def test_a_latent_cache_token_reads_as_its_parts_in_ml_dtypes():
    """656 bytes a token: 512 e4m3fn latent values, 4 little-endian float32 scales, one per 128,
    64 little-endian bfloat16 rotary values; keys the latent and the rotary part, values the
    latent."""
    call = latent_call()
    cache = call.k
    assert (cache.shape, cache.dtype) == ((1, 1, 8, 656), np.uint8)
    assert call.v is cache
    elements = cache[..., :512].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    scales = np.frombuffer(cache[..., 512:528].tobytes(), "<f4").reshape(1, 1, 8, 4)
    rope = np.frombuffer(cache[..., 528:].tobytes(), "<u2").reshape(1, 1, 8, 64)
    rope = rope.view(ml_dtypes.bfloat16).astype(np.float64)
    _, keys, values = call.dequantized()
    latent = elements * scales.repeat(128, axis=-1)
    np.testing.assert_array_equal(values, latent)
    np.testing.assert_array_equal(keys, np.concatenate([latent, rope], axis=-1))
    assert np.all(np.log2(scales) == np.round(np.log2(scales)))  # powers of two


def test_the_latent_recipe_keeps_each_block_within_e4m3_of_its_values():
    rng = np.random.default_rng(5)
    latent = rng.standard_normal((1, 1, 16, 512)) * 2.0 ** rng.integers(
        -8, 8, (1, 1, 16, 4)
    ).repeat(128, axis=-1)
    rope = rng.standard_normal((1, 1, 16, 64))
    q = np.zeros((1, 1, 16, 576))  # not read here
    call = quantize_call(q, np.concatenate([latent, rope], -1), latent, "mla_fp8_cache",
                         "deepseek_v32", "bfloat16")  # fmt: skip
    _, keys, values = call.dequantized()
    blocks = np.abs(values - latent).reshape(1, 1, 16, 4, 128).max(axis=-1)
    largest = np.abs(latent).reshape(1, 1, 16, 4, 128).max(axis=-1)
    assert np.all(blocks <= 2.0**-3 * largest * 1.01)
    assert np.all(np.abs(keys[..., 512:] - rope) <= 2.0**-8 * np.abs(rope))  # bfloat16's


def mx_call():
    x = np.random.default_rng(3).standard_normal((1, 2, 64, 64))
    return quantize_call(x, x, x, "mx_attention", "mxfp8_e4m3")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (dict(q_block_scales=np.zeros((1, 2, 64, 4), np.uint8)), "q_block_scales of shape"),
        (dict(k_block_scales=np.zeros((1, 2, 64, 2), np.float32)), "dtype float32"),
        (dict(v_block_scales=None), "missing ['v_block_scales']"),
        (dict(k_global_scale=np.float32(1)), "unexpected ['k_global_scale']"),
    ],
)
def test_a_malformed_block_scaled_call_is_refused_naming_what_is_wrong(change, named):
    impl = resolve("numpy")
    call = mx_call()
    keywords = {n: v for n, v in (call.keywords | change).items() if v is not None}
    natives = [impl.from_numpy(x, "float8_e4m3fn") for x in (call.q, call.k, call.v)]
    with pytest.raises(AttentionInputError, match=named.replace("[", r"\[").replace("]", r"\]")):
        impl.attention(*natives, causal=True, **keywords)


def test_a_block_that_does_not_divide_its_axis_is_refused_naming_the_axis():
    impl = resolve("numpy")
    q = np.zeros((1, 1, 48, 64))
    keywords = {
        "q_block_scales": np.zeros((1, 1, 48, 2), np.uint8),
        "k_block_scales": np.zeros((1, 1, 48, 2), np.uint8),
        "v_block_scales": np.zeros((1, 1, 1, 64), np.uint8),
    }
    with pytest.raises(
        AttentionInputError, match=r"v's keys \(48\) is not a multiple of the block"
    ):
        checked_block_call(impl.capabilities, q, q, q, True, None, keywords,
                           dtype_name=lambda x: "float8_e4m3fn")  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (dict(k=np.zeros((1, 1, 8, 640), np.uint8)), "should be the deepseek_v32 cache's bytes"),
        (dict(k=np.zeros((1, 1, 8, 656), np.int8)), "dtype int8"),
        (dict(v=np.zeros((1, 1, 4, 656), np.uint8)), "are the same cache"),
        (dict(q=np.zeros((1, 2, 8, 512))), "q's head dimension is 512"),
        (dict(kv_cache_layout="deepseek_v4"), "kv_cache_layout='deepseek_v4', but should be"),
        (dict(k_global_scale=np.float32(1)), "unexpected ['k_global_scale']"),
    ],
)
def test_a_malformed_latent_cache_call_is_refused_naming_what_is_wrong(change, named):
    impl = resolve("numpy")
    call = latent_call()
    operands = {"q": impl.from_numpy(call.q, "bfloat16"), "k": call.k, "v": call.v}
    operands |= {name: value for name, value in change.items() if name in "qkv"}
    keywords = call.keywords | {n: v for n, v in change.items() if n not in "qkv"}
    if "q" in change:
        operands["q"] = impl.from_numpy(change["q"], "bfloat16")
    with pytest.raises(AttentionInputError, match=named.replace("[", r"\[").replace("]", r"\]")):
        impl.attention(operands["q"], operands["k"], operands["v"], causal=True, **keywords)


def nvfp4_cache_call():
    """A decoding batch of two over an NVFP4 cache of 40 keys, dense."""
    rng = np.random.default_rng(5)
    q, kv = rng.standard_normal((2, 2, 1, 32)), rng.standard_normal((2, 1, 40, 32))
    return quantize_call(q, kv, kv, "fp4_cache", "nvfp4", "float32")


def paged_fp4_call(too_short: bool = False, lengths=(40, 17)):
    """numpy_flash's arguments for an NVFP4 cache as page pools of 16 (impls.worker_process
    lays them out so); ``too_short``: each pool cut before the last page its table points at."""
    call = nvfp4_cache_call()
    unread = unread_bytes("fp4_cache", "nvfp4")

    def pool_of(name, array):
        pool, table = page_pool(np.asarray(array), lengths, 16, np.random.default_rng(0),
                                unowned=unread[name], past=unread[name])  # fmt: skip
        return (pool[: table.max()] if too_short else pool), table

    (k, table), (v, _) = pool_of("k", call.k), pool_of("v", call.v)
    keywords = call.keywords | {name: pool_of(name, call.keywords[name])[0]
                                for name in ("k_block_scales", "v_block_scales")}  # fmt: skip
    keywords |= {"block_table": table, "key_lengths": lengths}
    return call.q.astype(np.float32), k, v, keywords


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (dict(too_short=True), r"block_table holds pages 0\.\.\d+, but the pool has \d+"),
        (dict(lengths=(40, 70)), r"key_lengths=\[40, 70\] goes past the block table's capacity"),
        (dict(scales_of_keys=True), r"k_block_scales of shape \(\d+, 16, 1, 1\)"),
        (dict(no_table=True), r"\['key_lengths'\] without block_table"),
    ],
)
def test_a_malformed_page_pool_of_a_cache_is_refused_naming_what_is_wrong(change, named):
    impl = resolve("numpy_flash")
    q, k, v, keywords = paged_fp4_call(change.get("too_short", False))
    if "lengths" in change:
        keywords["key_lengths"] = change["lengths"]
    if "scales_of_keys" in change:  # one scale a token, as if the blocks ran along the keys
        keywords["k_block_scales"] = keywords["k_block_scales"][..., :1]
    if "no_table" in change:  # a dense cache with key lengths, which the call would not honour
        call = nvfp4_cache_call()
        q, k, v = call.q.astype(np.float32), call.k, call.v
        keywords = call.keywords | {"key_lengths": (40, 17)}
    with pytest.raises(AttentionInputError, match=named):
        impl.attention(q, k, v, causal=True, **keywords)


def test_page_pools_are_refused_where_the_convention_is_not_a_caches():
    impl = resolve("numpy_flash")
    call = mx_call()
    natives = [impl.from_numpy(x, "float8_e4m3fn") for x in (call.q, call.k, call.v)]
    paging = {"block_table": np.zeros((1, 4), np.int32), "key_lengths": (64,)}
    with pytest.raises(AttentionInputError, match=r"page pools are a cache's"):
        impl.attention(*natives, causal=True, **call.keywords, **paging)


def test_where_p_is_rounded_in_a_cache_is_declared_apart_and_checked():
    """A kernel that decodes a cache for its 16-bit path rounds P to q's 16 bits, where its MXFP8
    path rounds it to e4m3: block_cache_p, as a plain callable's attribute too."""

    def kernel(q, k, v, *, causal=True, scale=None, k_block_scales=None, v_block_scales=None,
               q_block_scales=None):  # fmt: skip
        raise NotImplementedError

    kernel.block_p, kernel.block_cache_p = "e4m3_offset8", "bfloat16"
    caps = PlainCallable(kernel, "kernel").capabilities
    assert caps.block_p_of("mx_attention") == "e4m3_offset8"
    assert caps.block_p_of("fp4_cache") == caps.block_p_of("mla_fp8_cache") == "bfloat16"
    plain = Capabilities(dtypes=("float32",), block_scaled=True, block_p="e4m3_offset8")
    assert plain.block_p_of("fp4_cache") == "e4m3_offset8"
    with pytest.raises(ValueError, match="block_cache_p='e5m2', but should name one of float32"):
        Capabilities(dtypes=("float32",), block_scaled=True, block_cache_p="e5m2")
