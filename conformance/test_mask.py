"""Section 2, why position i cannot see j > i: the causal mask, through outputs and weights."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from conformance.judge.assertions import assert_identical, assert_matches_oracle, fail
from conformance.judge.harness import Case
from conformance.judge.probe import all_weights
from conformance.judge.truth import oracle_attention
from spec.dtypes import DTYPES, LARGEST_FINITE, UNIT_ROUNDOFF, round_to
from spec.formula import accumulation_dtype, causal_mask, reference_weights, softmax

MASK_CASES = [
    Case(batch=2, heads=2, tq=65, head_dim=16),
    Case(batch=1, heads=2, tq=3, tk=40, head_dim=8),
]
MASK_IDS = ["square", "Tq<Tk"]


def future_of(case: Case) -> np.ndarray:
    """(Tq, Tk) True where key j lies in query i's future: j > i + Tk - Tq."""
    return ~case.visible


@pytest.mark.claim("MASK-ZERO")
@pytest.mark.parametrize("case", MASK_CASES, ids=MASK_IDS)
def test_future_weights_are_exactly_zero(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, _ = subject.inputs(case, spread=2.0)
    truth = reference_weights(q, k)[0, 0, :24, :24]  # (Tq, Tk) of the first head, at most 24
    for source, weights in all_weights(subject, case, q, k):
        shown = weights[0, 0, :24, :24]
        subject.notes.note_figure(
            f"causal attention weights/{'square' if case.tq == case.tk else 'Tq<Tk'}",
            {
                "source": source,
                "dtype": dtype,
                "weights": shown.tolist(),
                "truth": truth.tolist(),
                "largest difference": float(np.nan_to_num(np.abs(shown - truth), nan=np.inf).max()),
            },
        )
        leaked = weights[..., future_of(case)]
        if np.any(leaked != 0):
            b, h, i, j = np.argwhere((weights != 0) & future_of(case))[0]
            fail(
                subject,
                case,
                f"{source} weights[{b}, {h}, {i}, {j}]="
                f"{weights[b, h, i, j]!r}, but should be 0 (key {j} is after query {i})",
            )


@pytest.mark.claim("MASK-ROW0")
def test_first_position_sees_only_itself(subject, dtype):
    case = Case(batch=2, heads=3, tq=50, head_dim=32, dtype=dtype)
    q, k, v = subject.inputs(case, spread=2.0)
    out = subject.call(case, q, k, v)
    row0, v0 = out[..., 0, :], v[..., 0, :]
    one_ulp = 2 * UNIT_ROUNDOFF[dtype] * np.maximum(np.abs(v0), np.finfo(np.float64).tiny)
    worst = np.abs(row0 - v0) / one_ulp
    if not worst.max() <= 1:
        index = np.unravel_index(np.argmax(worst), worst.shape)
        fail(
            subject,
            case,
            f"out[..., 0, :] at {index} = {row0[index]!r}, but should "
            f"be V[0] = {v0[index]!r} within 1 ulp ({worst.max():.1f} ulps off)",
        )
    for source, weights in all_weights(subject, case, q, k):
        expected = np.zeros(case.tk)
        expected[0] = 1.0
        # Bit for bit against a constant: one visible key's weight is exp(0) / exp(0) = 1 exactly.
        assert_identical(
            subject,
            case,
            f"{source} weights[..., 0, :]",
            weights[..., 0, :],
            np.broadcast_to(expected, weights[..., 0, :].shape),
        )


def safe_huge(dtype: str, head_dim: int) -> float:
    """The largest magnitude whose products summed over head_dim still stay finite in dtype."""
    return float(round_to(np.array(math.sqrt(LARGEST_FINITE[dtype] / (4 * head_dim))), dtype))


@pytest.mark.claim("MASK-FUTURE-INVARIANT")
@pytest.mark.parametrize("cut", [0, 31, 63])
def test_rows_do_not_depend_on_later_positions(subject, dtype, cut):
    """Rows 0..cut, bit for bit, whatever Q, K and V hold after cut: fresh random values, +-1e4,
    and the dtype's largest values whose dot products stay finite."""
    case = subject.fit(Case(batch=1, heads=2, tq=64, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    reference_rows = subject.call(case, q, k, v)[..., : cut + 1, :]
    huge = safe_huge(dtype, case.head_dim)
    fresh = subject.inputs(case)
    replacements = {
        "fresh values": fresh,
        "+1e4": [np.full_like(x, min(1e4, huge)) for x in (q, k, v)],
        "-1e4 / +1e4": [np.full_like(q, -min(1e4, huge))]
        + [np.full_like(x, min(1e4, huge)) for x in (k, v)],
        f"+-{huge:.3g}": [np.where(fresh[0] > 0, huge, -huge)]
        + [np.full_like(x, huge) for x in (k, v)],
    }
    for label, (q_new, k_new, v_new) in replacements.items():
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        q2[..., cut + 1 :, :] = q_new[..., cut + 1 :, :]
        k2[..., cut + 1 :, :] = k_new[..., cut + 1 :, :]
        v2[..., cut + 1 :, :] = v_new[..., cut + 1 :, :]
        out = subject.call(case, q2, k2, v2)
        # Bit for bit: the same shape and call, only values rows 0..cut never read changed.
        assert_identical(
            subject,
            case,
            f"rows 0..{cut} with positions > {cut} set to {label}",
            out[..., : cut + 1, :],
            reference_rows,
            answer=(out, q2, k2, v2),
        )


@pytest.mark.claim("MASK-PREFIX")
def test_prefix_equals_first_rows_of_the_whole(subject, dtype):
    case = Case(batch=1, heads=2, tq=97, head_dim=32, dtype=dtype)
    q, k, v = subject.inputs(case)
    truth = oracle_attention(q, k, v)
    for t in (1, 17, 64, 96):
        prefix = case.with_(tq=t, tk=t)
        pq, pk, pv = q[..., :t, :], k[..., :t, :], v[..., :t, :]
        assert_matches_oracle(
            subject,
            prefix,
            subject.call(prefix, pq, pk, pv),
            pq,
            pk,
            pv,
            truth=truth[..., :t, :],
            what=f"attention over the first {t} positions",
        )


@pytest.mark.claim("MASK-PREFIX")
@pytest.mark.parametrize(
    ("length", "bounds"),
    [(40, tuple(range(41))), (70, (0, 5, 17, 18, 49, 70))],
    ids=["token-by-token-decode", "chunked-prefill"],
)
def test_incremental_computation_reproduces_every_row(subject, dtype, length, bounds):
    """Generation: each chunk of queries bounds[n]..bounds[n+1] against the cache of keys so far
    plus its own, bottom-right aligned. Chunks of one query each are a token-by-token decode;
    chunks of uneven size are a chunked prefill. Together they must give the whole's rows."""
    case = subject.fit(Case(batch=2, heads=2, tq=length, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    chunks = [
        (case.with_(tq=end - start, tk=end), q[..., start:end, :], k[..., :end, :], v[..., :end, :])
        for start, end in itertools.pairwise(bounds)
    ]
    rows = [subject.call(*chunk) for chunk in chunks]  # each (B, H, end - start, Dv)
    assert_matches_oracle(
        subject,
        case,
        np.concatenate(rows, axis=-2),
        q,
        k,
        v,
        what=f"rows computed in chunks {list(bounds) if len(bounds) < 10 else 'of 1'}",
        pieces=chunks,
    )


FILL = -1e9


def masked_softmax(scores: np.ndarray, fill: float, dtype: str) -> np.ndarray:
    """Row softmax of scores with the future set to ``fill``, computed in dtype (float32 work)."""
    work = accumulation_dtype(dtype)
    filled = np.where(causal_mask(*scores.shape[-2:]), scores, round_to(np.array(fill), dtype))
    filled = round_to(filled, dtype).astype(work)
    with np.errstate(invalid="ignore", over="ignore"):
        return round_to(softmax(filled), dtype)


@pytest.mark.claim("MASK-FILL")
@pytest.mark.parametrize("dtype", DTYPES)
def test_minus_1e9_fill_behaves_as_minus_infinity(dtype):
    """-1e9 gives the same weights as -inf, bit for bit, while the real scores stay well above the
    fill (exp(fill - max) underflows to 0 once max - fill exceeds ~745 in float64, ~104 in float32
    and bfloat16, ~17 in float16: here max - fill is about 1e9). In float16 -1e9 overflows to -inf,
    so the two are the same value. Where it stops: when a row's real scores are themselves near
    -1e9 (all below fill + 100), the fill no longer vanishes and the masked keys take weight."""
    rng = np.random.default_rng(7)
    limit = 6e4 if dtype == "float16" else 1e4
    for magnitude in (1.0, 100.0, limit):
        scores = round_to(rng.uniform(-magnitude, magnitude, (1, 1, 33, 33)), dtype)
        assert np.array_equal(
            masked_softmax(scores, FILL, dtype), masked_softmax(scores, -np.inf, dtype)
        ), f"|s| <= {magnitude:g}"
    if dtype == "float16":
        assert round_to(np.array(FILL), dtype) == -np.inf
        return
    drowned = np.full((1, 1, 4, 4), -2e9)  # real scores below the fill: the fill wins
    with_fill = masked_softmax(drowned, FILL, dtype)
    assert with_fill[0, 0, 0, 1:].sum() > 0.9, "scores below the fill: masked keys take the weight"
    assert masked_softmax(drowned, -np.inf, dtype)[0, 0, 0, 1] == 0


@pytest.mark.claim("MASK-GRAD")
def test_gradients_from_past_rows_to_future_positions_are_zero(subject, dtype):
    case = subject.fit(Case(batch=1, heads=2, tq=48, head_dim=16, dtype=dtype))
    subject.require(case, autograd=True)
    q, k, v = subject.inputs(case)
    cut = 20
    grad_out = subject.rng.standard_normal(case.out_shape)
    grad_out[..., cut + 1 :, :] = 0.0  # only rows 0..cut are differentiated
    native = subject.to_native(case, q, k, v, round_to(grad_out, dtype))
    grads = subject.client.vjp(*native, causal=True, scale=None)
    for name, grad in zip(("dq", "dk", "dv"), grads, strict=True):
        future = subject.client.to_numpy(grad)[..., cut + 1 :, :]
        if np.any(future != 0):
            fail(
                subject,
                case,
                f"{name}[..., {cut + 1}:, :] has "
                f"{np.count_nonzero(future)} non-zero entries (max {np.abs(future).max()!r}), "
                f"but rows 0..{cut} cannot depend on positions after {cut}",
            )


def assert_nonfinite_future_does_not_reach_past_rows(subject, dtype, tensor, bad):
    case = subject.fit(Case(batch=1, heads=2, tq=48, head_dim=16, dtype=dtype))
    q, k, v = subject.inputs(case)
    cut = 20
    clean = subject.call(case, q, k, v)[..., : cut + 1, :]
    planted = {"k": k.copy(), "v": v.copy()}
    planted[tensor][..., cut + 1 :, :] = bad
    with np.errstate(invalid="ignore", over="ignore"):
        rows = subject.call(case, q, planted["k"], planted["v"])[..., : cut + 1, :]
    # Bit for bit: the same shape and call, only values rows 0..cut never read changed.
    assert_identical(
        subject,
        case,
        f"rows 0..{cut} with {tensor}[positions > {cut}] = {bad}",
        rows,
        clean,
    )


NONFINITE = pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])


@pytest.mark.claim("MASK-NONFINITE", "MASK-NONFINITE-KEYS")
@NONFINITE
def test_nonfinite_future_keys_do_not_reach_past_rows(subject, dtype, bad):
    assert_nonfinite_future_does_not_reach_past_rows(subject, dtype, "k", bad)


@pytest.mark.claim("MASK-NONFINITE", "MASK-NONFINITE-VALUES")
@NONFINITE
def test_nonfinite_future_values_do_not_reach_past_rows(subject, dtype, bad):
    assert_nonfinite_future_does_not_reach_past_rows(subject, dtype, "v", bad)
