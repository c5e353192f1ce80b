"""Extensions, FP8 as serving kernels run it: the scales, the formats, accuracy where P's
rounding breaks, and a NaN stored (FP8-SCALES, FP8-FORMAT, FP8-ACCURACY, FP8-NAN), and
MASK-NONFINITE's SHOULD for what FP8 operands store at future positions. Inputs are
quantized as callers quantize them (spec.fp8's recipes); conformance.judge.fp8 holds the output to
the float64 formula on the dequantized inputs within the budget of the arithmetic the
implementation declares."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_identical
from conformance.judge.fp8 import Fp8Inputs, assert_fp8_matches, call_fp8, quantized
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


@pytest.mark.claim("FP8-SCALES")
@pytest.mark.parametrize(("convention", "kv_scale", "page_size"), SCALINGS, ids=SCALING_IDS)
def test_each_scale_is_applied_once_to_its_operand_by_kv_head(
    subject, convention, kv_scale, page_size
):
    case, inputs = scales_call(subject, convention, kv_scale, page_size)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


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


@pytest.mark.claim("FP8-FORMAT")
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_fp8_values_are_read_in_their_format_over_its_whole_range(subject, fmt):
    case, inputs = format_call(subject, fmt)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


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


@pytest.mark.claim("FP8-ACCURACY")
@pytest.mark.parametrize(("shape", "draw"), ACCURACY_CASES)
def test_fp8_output_within_the_budget_of_its_declared_rounding(subject, shape, draw):
    case, inputs = accuracy_call(subject, shape, draw)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


# Where FP8-NAN plants its NaN: (operand, its index (b, head, position, d)), each read by outputs
# the formula makes NaN and beside outputs it leaves alone: a query's row 5 (the other rows
# not); the first key, which every row sees (the other items not); the first value's column 7
# (the other columns not).
NAN_PLANTS = [("q", (0, 1, 5, 3)), ("k", (1, 0, 0, 2)), ("v", (0, 0, 0, 7))]


def small_scales_draw(subject: Subject, fmt: str) -> tuple[Case, Fp8Inputs]:
    """FP8-SCALES' draw, small, in ``fmt``: two items, grouped heads, Tq = 48, every (b, kv
    head) at its own amplitude, in the first convention the implementation declares."""
    convention, kv_scale, _ = first_declared(subject)
    case = fp8_case(subject, convention, kv_scale, fmt, batch=2, heads=4, tq=48, head_dim=16)
    q, k, v = per_head_amplitudes(subject, case, case.q_shape, case.k_shape, case.v_shape)
    return case, quantized(case, q, k, v)


def with_stored(inputs: Fp8Inputs, operand: str, where, value: float) -> Fp8Inputs:
    """``inputs`` with ``value`` stored in ``operand`` at ``where`` (an index), in a copy."""
    stored = {name: getattr(inputs, name) for name in "qkv"}
    stored[operand] = stored[operand].copy()
    stored[operand][where] = value
    return Fp8Inputs(*stored.values(), inputs.scales)


def nan_call(subject: Subject, fmt: str, operand: str, index: tuple):
    """FP8-NAN's call: :func:`small_scales_draw` with a NaN stored in ``operand`` at
    ``index``."""
    if operand == "q" and first_declared(subject)[0] == "kv_scale":
        pytest.skip("under the key/value cache's convention q is not FP8")
    case, inputs = small_scales_draw(subject, fmt)
    return case, with_stored(inputs, operand, index, np.nan)


@pytest.mark.claim("FP8-NAN")
@pytest.mark.parametrize(("operand", "index"), NAN_PLANTS, ids=[op for op, _ in NAN_PLANTS])
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_a_nan_in_an_fp8_operand_reaches_the_outputs_that_read_it(subject, fmt, operand, index):
    if subject.client.capabilities.fp8_nan != "propagate":
        pytest.skip(f"{subject.name} declares fp8_nan={subject.client.capabilities.fp8_nan!r}")
    case, inputs = nan_call(subject, fmt, operand, index)
    assert_fp8_matches(subject, case, call_fp8(subject, case, inputs), inputs)


# MASK-NONFINITE's SHOULD in FP8: what an FP8 operand can hold that is not a number, stored at
# positions after the cut, must not reach rows 0..cut (a NaN, and e5m2's infinities)
FUTURE_CUT = 20


def nonfinite_values(fmt: str) -> list[float]:
    return [np.nan] + ([np.inf, -np.inf] if fp8_format(fmt).overflow == "inf" else [])


def assert_fp8_future_does_not_reach_past_rows(subject: Subject, fmt: str, operand: str):
    """:func:`small_scales_draw` in ``fmt`` called clean, then with each value
    :func:`nonfinite_values` gives stored in ``operand`` at every position after FUTURE_CUT:
    rows 0..FUTURE_CUT bit for bit as clean."""
    case, inputs = small_scales_draw(subject, fmt)
    clean = call_fp8(subject, case, inputs)[..., : FUTURE_CUT + 1, :]
    future = (..., slice(FUTURE_CUT + 1, None), slice(None))  # positions after the cut
    for bad in nonfinite_values(fmt):
        with np.errstate(invalid="ignore", over="ignore"):
            out = call_fp8(subject, case, with_stored(inputs, operand, future, bad))
        what = f"rows 0..{FUTURE_CUT} with {operand}[positions > {FUTURE_CUT}] = {bad} in {fmt}"
        assert_identical(subject, case, what, out[..., : FUTURE_CUT + 1, :], clean)


@pytest.mark.claim("MASK-NONFINITE", "MASK-NONFINITE-KEYS")
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_nonfinite_fp8_future_keys_do_not_reach_past_rows(subject, fmt):
    assert_fp8_future_does_not_reach_past_rows(subject, fmt, "k")


@pytest.mark.claim("MASK-NONFINITE", "MASK-NONFINITE-VALUES")
@pytest.mark.parametrize("fmt", list(FP8_FORMATS))
def test_nonfinite_fp8_future_values_do_not_reach_past_rows(subject, fmt):
    assert_fp8_future_does_not_reach_past_rows(subject, fmt, "v")


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
