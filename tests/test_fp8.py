"""spec/fp8.py against ml_dtypes (the formats' rounding, bytes and misreadings), its recipes, and
the FP8 declarations and entry checks an implementation meets before the suite judges it."""

from __future__ import annotations

import numpy as np
import pytest

from impls.capabilities import Capabilities
from impls.contract import PlainCallable
from impls.numpy_vectorised import NumpyVectorised
from impls.validation import AttentionInputError
from spec.fp8 import (
    FP8_FORMATS,
    fp8_format,
    quantize_per_kv_head,
    quantize_per_tensor,
    reinterpreted,
    round_to_fp8,
    values_of_bytes,
)

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes, the formats' other definition")


def same(a, b) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("name", list(FP8_FORMATS))
def test_rounding_to_each_format_is_ml_dtypes_on_every_value_midpoint_and_overflow(name):
    values = values_of_bytes(name)
    finite = np.unique(values[np.isfinite(values)])
    midpoints = (finite[1:] + finite[:-1]) / 2  # ties: to even
    rng = np.random.default_rng(0)
    largest = fp8_format(name).largest_finite
    x = np.concatenate([
        values, midpoints, np.nextafter(midpoints, np.inf), np.nextafter(midpoints, -np.inf),
        rng.standard_normal(20000) * 2.0 ** rng.uniform(-25, 20, 20000),
        [np.inf, -np.inf, np.nan, largest * 1.03, largest * 1.1, -largest * 1.1, 1e30],
    ])  # fmt: skip
    theirs = x.astype(getattr(ml_dtypes, name)).astype(np.float64)
    mismatched = ~same(round_to_fp8(x, name), theirs)
    assert not mismatched.any(), f"{name}: {x[mismatched][:5]} round otherwise than ml_dtypes"


@pytest.mark.parametrize("written", list(FP8_FORMATS))
def test_bytes_and_their_misreadings_are_ml_dtypes_views(written):
    codes = np.arange(256, dtype=np.uint8)
    assert same(
        values_of_bytes(written), codes.view(getattr(ml_dtypes, written)).astype(float)
    ).all()
    stored = values_of_bytes(written)
    stored = stored[~np.isnan(stored)]
    for read in FP8_FORMATS:
        as_bytes = stored.astype(getattr(ml_dtypes, written)).view(np.uint8)
        theirs = as_bytes.view(getattr(ml_dtypes, read)).astype(np.float64)
        assert same(reinterpreted(stored, written, read), theirs).all(), (written, read)
    # vLLM PR #54341's example: e4m3 bytes of [1, 2, 3.5, 0.25] read as e5m2
    assert list(reinterpreted([1, 2, 3.5, 0.25], "float8_e4m3fn", "float8_e5m2")) == [
        0.5, 2, 6, 0.03125,
    ]  # fmt: skip


def test_the_recipes_fill_the_format_and_dequantize_within_its_rounding():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 40, 16)) * np.array([0.5, 2.0, 9.0])[None, :, None, None]
    stored, scale = quantize_per_tensor(x, "float8_e4m3fn")
    assert np.abs(stored).max() == 448
    assert scale == np.float32(scale)
    assert np.abs(stored * scale - x).max() <= 2.0**-4 * np.abs(x).max()
    for per_batch, shape in ((False, (3,)), (True, (2, 3))):
        stored, scales = quantize_per_kv_head(x, "float8_e5m2", per_batch=per_batch)
        assert scales.shape == shape
        assert scales.dtype == np.float32
        axes = (2, 3) if per_batch else (0, 2, 3)
        assert (np.abs(stored).max(axis=axes) == 57344).all()


def test_a_plain_callable_declares_fp8_by_its_scales_keywords_and_attributes():
    def fa3(q, k, v, *, causal=True, scale=None, q_descale=None, k_descale=None, v_descale=None):
        return q

    fa3.fp8_p, fa3.fp8_formats = "e4m3_offset8", ["float8_e4m3fn", "float8_e5m2"]
    caps = PlainCallable(fa3, "fa3").capabilities
    assert (caps.fp8, caps.fp8_conventions, caps.fp8_p, caps.fp8_formats, caps.fp8_nan) == (
        True, ("descale",), "e4m3_offset8", ("float8_e4m3fn", "float8_e5m2"), "propagate",
    )  # fmt: skip
    fa3.fp8_nan = "unspecified"
    assert PlainCallable(fa3, "fa3").capabilities.fp8_nan == "unspecified"
    with pytest.raises(ValueError, match="fp8_nan='zero', but should name one of propagate"):
        Capabilities(dtypes=("float32",), fp8=True, fp8_nan="zero")

    def half(q, k, v, *, causal=True, scale=None, k_scale=None):  # v_scale missing: not declared
        return q

    assert not PlainCallable(half, "half").capabilities.fp8

    def cache(q, k, v, *, causal=True, scale=None, k_scale=None, v_scale=None):
        return q

    assert PlainCallable(cache, "cache").capabilities.fp8_queries == ("float64", "float32")
    cache.fp8_query_dtypes = ["bfloat16"]  # q's dtypes under the cache's convention alone
    caps = PlainCallable(cache, "cache").capabilities
    assert (caps.fp8_queries, caps.dtypes) == (("bfloat16",), ("float64", "float32"))
    with pytest.raises(ValueError, match="int4"):
        Capabilities(dtypes=("float32",), fp8=True, fp8_query_dtypes=("int4",))
    with pytest.raises(ValueError, match="fp8_p='e4m3_offset9', but should name one of"):
        Capabilities(dtypes=("float32",), fp8=True, fp8_p="e4m3_offset9")


def kv_cache_call(**changes):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, 8, 16)).astype(np.float32)
    k, v = (
        rng.standard_normal((1, 2, 8, 16)).astype(ml_dtypes.float8_e4m3fn) for _ in range(2)
    )  # fmt: skip
    call = dict(q=q, k=k, v=v, k_scale=0.5, v_scale=np.array([0.25, 2.0], np.float32))
    return call | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"v_scale": None}, r"missing \['v_scale'\]"),
        ({"q_descale": np.ones((1, 2), np.float32)}, "the scales of one convention"),
        ({"k": np.zeros((1, 2, 8, 16), np.float32)}, "k.dtype=float32, but should be one of"),
        ({"k_scale": np.ones((1, 2), np.float32)}, r"k_scale of shape \(1, 2\)"),
        ({"v_scale": np.array([0.25, -2.0], np.float32)}, "scales are finite and > 0"),
        ({"window": 3}, r"unexpected \['window'\]"),
        ({"q": np.zeros((1, 4, 8, 16), np.int8)}, "q.dtype=int8, but should be one of"),
    ],
    ids=[
        "a-scale-missing",
        "two-conventions",
        "k-not-fp8",
        "k-scale-per-batch",
        "negative",
        "with-a-window",
        "q-of-int8",
    ],
)
@pytest.mark.optional_libraries
@pytest.mark.parametrize("family", ["numpy", "torch"])
def test_a_bad_fp8_call_is_refused_in_words(changes, message, family):
    """The same refusals, in the same words, from each family's built-in (impls.fp8_calls)."""
    call = {name: value for name, value in kv_cache_call(**changes).items() if value is not None}
    q, k, v = call.pop("q"), call.pop("k"), call.pop("v")
    impl = NumpyVectorised()
    if family == "torch":
        torch = pytest.importorskip("torch")
        from impls.torch_eager import TorchEager

        impl = TorchEager()
        q, k, v = (
            torch.from_numpy(x.astype(np.float32)).to(getattr(torch, str(x.dtype)))
            for x in (q, k, v)
        )
    with pytest.raises(AttentionInputError, match=message):
        impl.attention(q, k, v, **call)
