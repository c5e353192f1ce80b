"""FP8 calls as the tests draw them and tools redraw them: the conventions and formats a call
takes, how each claim's call is built from a subject (FP8-SCALES', FP8-FORMAT's, FP8-ACCURACY's),
and every call by name (``python -m conformance.survey --fp8``). Here, not in a test module, so
that a tool draws what the tests draw without importing a test."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.fp8 import Fp8Inputs, quantized
from conformance.judge.harness import Case, Subject
from spec.dtypes import round_to
from spec.fp8 import FP8_FORMATS, Fp8Scales, fp8_format, round_to_fp8

# The convention of an FP8 call; under the key/value cache's, how fine its scales are, and
# whether its cache is a page pool (of 16 keys a page, vLLM's)
SCALINGS = [
    ("descale", None, None), ("kv_scale", "tensor", None), ("kv_scale", "kv_head", None),
    ("kv_scale", "kv_head", 16),
]  # fmt: skip

SCALING_IDS = ["descale", "kv_scale-per-tensor", "kv_scale-per-kv-head", "kv_scale-paged"]

# q's dtype under the key/value cache's convention: the narrowest the implementation declares
QUERY_DTYPES = ("bfloat16", "float16", "float32")


def fp8_case(subject: Subject, convention: str, kv_scale: str | None, fmt: str, **shape) -> Case:
    """A case of ``shape`` in an FP8 convention: grouped heads where the implementation declares
    them (so that a scale read by query head shows), q's dtype the format under descale."""
    caps = subject.client.capabilities
    if convention == "descale":
        dtype = fmt
    else:
        dtype = next((d for d in QUERY_DTYPES if d in caps.fp8_queries), QUERY_DTYPES[-1])
    case = Case(dtype=dtype, fp8_format=fmt, fp8_convention=convention, fp8_kv_scale=kv_scale,
                **shape)  # fmt: skip
    if caps.gqa and case.kv_heads is None:
        case = case.with_(kv_heads=case.heads // 2)
    return subject.fit(case)


def first_declared(subject: Subject) -> tuple[str, str | None, str]:
    """(convention, kv scale granularity, format): the first the implementation declares."""
    caps = subject.client.capabilities
    if not caps.fp8:
        pytest.skip(f"{subject.name} does not declare fp8 (FP8 operands with scales)")
    convention = caps.fp8_conventions[0]
    return (
        convention,
        caps.fp8_kv_scales[0] if convention == "kv_scale" else None,
        caps.fp8_formats[0],
    )


def per_head_amplitudes(subject: Subject, case: Case, *shapes) -> list[np.ndarray]:
    """Standard normal arrays of ``shapes`` (B, heads, T, D), each (b, kv head) times an
    amplitude of its own in [0.5, 4]: quantized, every scale differs from every other, and none
    is 1."""
    amplitude = subject.rng.uniform(0.5, 4.0, (case.batch, case.key_value_heads))  # (B, Hkv)
    arrays = []
    for shape in shapes:
        groups = shape[1] // case.key_value_heads
        per_head = np.repeat(amplitude, groups, axis=1)[:, :, None, None]  # (B, heads, 1, 1)
        arrays.append(per_head * subject.rng.standard_normal(shape))
    return arrays


def scales_call(subject: Subject, convention: str, kv_scale: str | None, page_size=None):
    """FP8-SCALES' call: two items, grouped heads, every (b, kv head) at its own amplitude, so
    that every scale differs from every other and from 1; with ``page_size``, k and v in page
    pools, as vLLM keeps its FP8 cache."""
    _, _, fmt = first_declared(subject)
    case = fp8_case(subject, convention, kv_scale, fmt, batch=2, heads=4, tq=80, head_dim=64,
                    page_size=page_size)  # fmt: skip
    q, k, v = per_head_amplitudes(subject, case, case.q_shape, case.k_shape, case.v_shape)
    return case, quantized(case, q, k, v)


def whole_range(subject: Subject, fmt: str, shape) -> np.ndarray:
    """Values of ``fmt`` across its whole range, log-uniform from its smallest subnormal to its
    largest finite value with random signs, the extremes planted at the start of the last axis."""
    spec = fp8_format(fmt)
    exponents = subject.rng.uniform(
        np.log2(spec.smallest_subnormal), np.log2(spec.largest_finite), shape
    )
    values = np.where(subject.rng.random(shape) < 0.5, -1.0, 1.0) * 2.0**exponents
    extremes = [spec.largest_finite, spec.smallest_normal, spec.smallest_subnormal]
    extremes = np.array([sign * x for x in extremes for sign in (1, -1)])  # (6,)
    values = np.clip(round_to_fp8(values, fmt), -spec.largest_finite, spec.largest_finite)
    values[..., : extremes.size] = extremes
    return values


def unit_scaled(case: Case, q, k, v) -> Fp8Inputs:
    """Stored values with every scale 1, in the case's convention and granularity."""
    kv_heads = case.key_value_heads
    if case.fp8_convention == "descale":
        ones = np.ones((case.batch, kv_heads), np.float32)
        keywords = dict(q_descale=ones, k_descale=ones, v_descale=ones)
    else:
        one = np.float32(1) if case.fp8_kv_scale == "tensor" else np.ones(kv_heads, np.float32)
        keywords = dict(k_scale=one, v_scale=one)
    return Fp8Inputs(q, k, v, Fp8Scales(case.fp8_convention, keywords))


def format_call(subject: Subject, fmt: str):
    """FP8-FORMAT's call: unit scales; q and k near 1, their smallest values subnormal, one key
    holding the extremes; v over the whole range."""
    convention, kv_scale, _ = first_declared(subject)
    case = fp8_case(subject, convention, kv_scale, fmt, batch=1, heads=2, tq=48, head_dim=32)
    q = subject.rng.standard_normal(case.q_shape)
    q = round_to_fp8(q, fmt) if convention == "descale" else round_to(q, case.dtype)
    k = round_to_fp8(subject.rng.standard_normal(case.k_shape), fmt)
    k[..., 3, :6] = whole_range(subject, fmt, (6,))  # the six extremes
    v = whole_range(subject, fmt, case.v_shape)
    return case, unit_scaled(case, q, k, v)


def dominant_key(subject: Subject, case: Case, gap: float, spread: float = 0.5):
    """q along one direction u, |u|^2 = D, and the first key along it with a score ``gap`` above
    the others, as an attention sink's first token: every other key's weight near exp(-gap), a
    row's many small weights, in every tile a kernel reads after the first. ``spread``: the
    other keys' size, and with it how far their scores spread around 0."""
    u = subject.rng.standard_normal(case.head_dim)
    u *= np.sqrt(case.head_dim) / np.linalg.norm(u)
    q = u + 0.5 * subject.rng.standard_normal(case.q_shape)
    k = spread * subject.rng.standard_normal(case.k_shape)
    k[..., 0, :] = gap / np.sqrt(case.head_dim) * u  # its score about gap
    v = subject.rng.standard_normal(case.v_shape)
    return q, k, v


def accuracy_call(subject: Subject, shape: dict, draw: str):
    """FP8-ACCURACY's call of ``shape``: a dominant first key; a dominant first key over a flat
    tail (every other weight about exp(-7.5), 2^-10.8, which e4m3 without P's offset rounds to
    0, their sum about half the row's, and values with a common part of 1, so that what the tail
    adds does not average away); near-uniform keys (scores near 0: every weight near the row's
    largest); or standard normal inputs."""
    convention, kv_scale, fmt = first_declared(subject)
    case = fp8_case(subject, convention, kv_scale, fmt, batch=1, heads=4, head_dim=64, **shape)
    if draw == "dominant":
        q, k, v = dominant_key(subject, case, gap=8.0)
    elif draw == "flat-tail":
        q, k, v = dominant_key(subject, case, gap=7.5, spread=0.05)
        v = v + 1.0
    else:
        q, k, v = (
            subject.rng.standard_normal(s) for s in (case.q_shape, case.k_shape, case.v_shape)
        )
        if draw == "uniform":
            q, k = 0.05 * q, 0.05 * k
    return case, quantized(case, q, k, v)


ACCURACY_CASES = [
    pytest.param(dict(tq=64, tk=1024), "dominant", id="first-key-of-1024-dominant"),
    pytest.param(dict(tq=64, tk=1024), "flat-tail", id="1023-weights-under-2^-10"),
    pytest.param(dict(tq=64, tk=1024), "uniform", id="1024-near-uniform-keys"),
    pytest.param(dict(tq=129, tk=129), "normal", id="Tk=129"),
    pytest.param(dict(tq=257, tk=257), "normal", id="Tk=257"),
    pytest.param(dict(tq=1, tk=1000), "normal", id="decode-Tk=1000"),
]

# Every FP8 test's call by name, as (its builder, its arguments): python -m conformance.survey
# --fp8 draws them as the tests do
FP8_CALLS = {
    **{
        f"FP8-SCALES {name}": (scales_call, args)
        for args, name in zip(SCALINGS, SCALING_IDS, strict=True)
    },
    **{f"FP8-FORMAT {fmt}": (format_call, (fmt,)) for fmt in FP8_FORMATS},
    **{f"FP8-ACCURACY {row.id}": (accuracy_call, tuple(row.values)) for row in ACCURACY_CASES},
}
