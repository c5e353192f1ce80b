"""The judge of FP8 calls (spec.fp8): inputs quantized as a kernel's callers quantize them, the
call in its convention, and the output against the float64 formula on the dequantized inputs.

The budget is the suite's rule with the baseline the FP8 kernel's own: the naive formula rounded
where the implementation declares it rounds (Capabilities.fp8_p, spec.fp8.fp8_baseline), so a
kernel rounding P to e4m3 where it declared float32 fails, and one that declared it is held to
what that rounding costs. Each output is compared element by element, and a failure reports its
norm's ratio to the truth's: a missing or doubled scale leaves the cosine at 1, and shows there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from conformance.judge.assertions import fail, with_diagnosis
from conformance.judge.diagnosis import diagnose_fp8
from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import Budget, Comparison, compare
from conformance.run.worker_clients import ImplementationBroke
from spec.formula import reference_attention, score_rounding_sensitivity
from spec.fp8 import (
    Fp8Scales,
    dequantized,
    fp8_baseline,
    ml_dtypes_missing,
    quantize_call,
)
from spec.fp8 import output_dtype as fp8_output_dtype
from spec.mistakes.fp8 import Fp8Call

# FlashAttention's rule, as for every dtype: a few times the error of the naive formula that
# rounds where the kernel does. docs/fp8.md has the survey of the built-ins against it.
FP8_BUDGET_FACTOR = 3.0
FP8_FLOOR_U = 2.0  # the output's own rounding: one ulp of max|V|, in the output's dtype


def fp8_budget(out_dtype: str, p_rounding: str) -> Budget:
    return Budget(
        out_dtype,
        baseline_factor=FP8_BUDGET_FACTOR,
        floor_u=FP8_FLOOR_U,
        floor_scales_with_scores=False,
        reason=(
            f"{FP8_BUDGET_FACTOR:g}x the error of the naive formula on the FP8 values with P in "
            f"{p_rounding}, sums in float32 and the output in {out_dtype}, plus {FP8_FLOOR_U:g}u "
            "of the output"
        ),
        baseline=f"the naive formula with P in {p_rounding} and out in {out_dtype}",
    )


@dataclass(frozen=True)
class Fp8Inputs:
    """One FP8 call's inputs: the stored values (float64, exact in their dtypes) and the scales
    that dequantize them."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scales: Fp8Scales

    def dequantized(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return dequantized(self.q, self.k, self.v, self.scales)

    def one_head(self, item: int, head: int) -> Fp8Inputs:
        """Query head ``head`` of batch item ``item`` with its kv head and their scales, a call
        of its own (B = H = Hkv = 1)."""
        kv = head // (self.q.shape[1] // self.k.shape[1])
        keywords = {}
        for name, scale in self.scales.keywords.items():
            scale = np.asarray(scale)
            if scale.ndim == 2:  # (B, Hkv)
                scale = scale[item : item + 1, kv : kv + 1]
            elif scale.ndim == 1:  # (Hkv,)
                scale = scale[kv : kv + 1]
            keywords[name] = scale
        one = (slice(item, item + 1), slice(head, head + 1))
        kv_one = (slice(item, item + 1), slice(kv, kv + 1))
        return Fp8Inputs(
            self.q[one], self.k[kv_one], self.v[kv_one], Fp8Scales(self.scales.convention, keywords)
        )


def quantized(case: Case, q, k, v) -> Fp8Inputs:
    """Model values q, k, v (float64) quantized as the case's convention's callers do
    (spec.fp8.quantize_call)."""
    return Fp8Inputs(*quantize_call(q, k, v, case.fp8_format, case.fp8_convention,
                                    case.fp8_kv_scale, case.dtype))  # fmt: skip


def output_dtype(subject: Subject, case: Case) -> str:
    """What the call must return: q's dtype under kv_scale, the declared fp8_output under
    descale."""
    return fp8_output_dtype(case.fp8_convention, case.dtype, subject.client.capabilities.fp8_output)


def call_fp8(subject: Subject, case: Case, inputs: Fp8Inputs) -> np.ndarray:
    """The implementation's output for an FP8 case, float64 (B, H, Tq, Dv), after checking that
    it came back in the dtype its convention says. Skips, naming what is missing, where the
    implementation does not declare the case."""
    subject.require(case)
    client = subject.client
    if client.family == "numpy" and ml_dtypes_missing():
        pytest.skip(f"{subject.name}: {ml_dtypes_missing()}")
    q_dtype = case.fp8_format if case.fp8_convention == "descale" else case.dtype
    natives = [
        client.from_numpy(x, dtype)
        for x, dtype in (
            (inputs.q, q_dtype),
            (inputs.k, case.fp8_format),
            (inputs.v, case.fp8_format),
        )
    ]
    # a page pool's size: the worker lays k and v out as pools (spec.formula.page_pool)
    paging = {} if case.page_size is None else {"page_size": case.page_size}
    answer = client.attention(
        *natives, causal=case.causal, scale=case.scale, **inputs.scales.keywords, **paging
    )
    return checked_output(subject, case, answer, output_dtype(subject, case))


def checked_output(subject: Subject, case: Case, answer, expected_dtype: str) -> np.ndarray:
    """A low-precision call's answer as float64, after checking that it came back in
    ``expected_dtype`` and the case's output shape."""
    client = subject.client
    if client.dtype_name(answer) != expected_dtype:
        fail(
            subject, case, f"out.dtype={client.dtype_name(answer)}, but should be {expected_dtype}"
        )
    out = client.to_numpy(answer)
    if out.shape != case.out_shape:
        raise ImplementationBroke(
            f"{subject.name} returned shape {out.shape}, but should return {case.out_shape} "
            f"[{case.describe()}]"
        )
    return out.astype(np.float64)


@dataclass(frozen=True)
class Fp8Comparison:
    """An FP8 output's error element by element (``elements``, what decides, over the outputs
    that read no NaN), the truth, the ratio of its norm to the truth's, which a failure reports
    (a scale lost or applied twice shows there as the scale itself, where the cosine stays 1),
    and where the outputs that read a NaN stored in an operand are not NaN."""

    elements: Comparison
    truth: np.ndarray
    norm_ratio: float  # ||out|| / ||truth|| over the outputs that read no NaN
    nan_lost: str | None = None  # the outputs that read a NaN but are numbers, in words

    @property
    def ok(self) -> bool:
        return self.elements.ok and self.nan_lost is None

    def describe(self) -> str:
        described = f"{self.elements.describe()}; ||out|| / ||truth|| = {self.norm_ratio:.4g}"
        return described if self.nan_lost is None else f"{self.nan_lost}; {described}"


def nan_lost(out: np.ndarray, reads_nan: np.ndarray) -> str | None:
    """Where outputs that read a NaN (``reads_nan``) are numbers, in words, or None."""
    lost = reads_nan & ~np.isnan(out)
    if not lost.any():
        return None
    first = tuple(int(i) for i in np.argwhere(lost)[0])
    return (
        f"{np.count_nonzero(lost)} of the {np.count_nonzero(reads_nan)} outputs that read a NaN "
        f"stored in an operand are numbers, first at {first}: {out[first]!r}, but should be nan"
    )


def compare_fp8(
    out, inputs: Fp8Inputs, *, causal: bool, scale: float | None, p_rounding: str, out_dtype: str
) -> Fp8Comparison:
    """``out`` against the float64 formula on the dequantized inputs, with the naive formula
    rounded where the implementation declares (``p_rounding``, ``out_dtype``) as baseline."""
    options = dict(causal=causal, scale=scale)
    with np.errstate(invalid="ignore"):
        baseline = fp8_baseline(inputs.q, inputs.k, nan_values_zeroed(inputs.v), inputs.scales,
                                p_rounding=p_rounding, out_dtype=out_dtype, **options)  # fmt: skip
    return compare_dequantized(out, inputs.dequantized(), baseline, options=options,
                               budget=fp8_budget(out_dtype, p_rounding))  # fmt: skip


def compare_dequantized(out, true_inputs, baseline, *, options: dict, budget: Budget):
    """``out`` against the float64 formula on ``true_inputs`` (q, k, v, dequantized) within
    ``budget`` of ``baseline``'s error, the naive rounding on the operands with their values' NaN
    taken as 0 (:func:`nan_values_zeroed`). A NaN stored in an operand: the outputs that read it
    must be NaN, and the others are held to the budget of the call without it. An output reads a
    NaN value only through a key it sees: where the formula's zero weight on a hidden key carries
    that key's NaN value into an output (0 times NaN), a kernel's tile may too, or may skip the
    tile, so that output may be NaN or its number (MASK-NONFINITE's SHOULD judges it)."""
    true_q, true_k, true_v = true_inputs
    finite_v = nan_values_zeroed(true_v)
    with np.errstate(invalid="ignore"):
        truth = reference_attention(true_q, true_k, true_v, **options)  # the formula's own NaN
        if finite_v is true_v:
            truth_of_numbers = truth
            reads_nan = reads_nan_or_zero = np.isnan(truth)
        else:
            truth_of_numbers = reference_attention(true_q, true_k, finite_v, **options)
            reads_nan = np.isnan(truth_of_numbers) | values_read(
                true_q, true_k, np.isnan(true_v), **options
            )
            reads_nan_or_zero = reads_nan | (np.isnan(truth) & np.isnan(out))
    finite_q, finite_k = (np.nan_to_num(x, nan=0.0) for x in (true_q, true_k))
    answer, truth_read, baseline = (
        np.where(reads_nan_or_zero, 0.0, x) for x in (out, truth_of_numbers, baseline)
    )
    elements = compare(
        answer,
        truth_read,
        baseline,
        dtype=budget.dtype,
        magnitude=float(np.abs(finite_v).max()),
        score_rounding=lambda: float(
            score_rounding_sensitivity(finite_q, finite_k, finite_v, **options).max()
        ),
        budgets={budget.dtype: budget},
    )
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        norm_ratio = float(np.linalg.norm(answer) / np.linalg.norm(truth_read))
    return Fp8Comparison(elements, truth, norm_ratio, nan_lost(out, reads_nan))


def nan_values_zeroed(values: np.ndarray) -> np.ndarray:
    """``values`` with each NaN taken as 0 (itself where none is NaN)."""
    return np.where(np.isnan(values), 0.0, values) if np.isnan(values).any() else values


def values_read(true_q, true_k, is_nan: np.ndarray, **options) -> np.ndarray:
    """Which outputs (B, H, Tq, Dv) weigh a value flagged in ``is_nan`` (B, Hkv, Tk, Dv) by a key
    their row sees: the formula's own mask over the flags (q = k = 0 gives each key a row sees a
    positive weight, and every other key none)."""
    zeros_q, zeros_k = np.zeros(true_q.shape), np.zeros(true_k.shape)
    return reference_attention(zeros_q, zeros_k, is_nan.astype(np.float64), **options) > 0


def assert_fp8_matches(subject: Subject, case: Case, out: np.ndarray, inputs: Fp8Inputs) -> None:
    """``out`` within the budget of the arithmetic the implementation declares, element by
    element; a failure says its norm's ratio to the truth's too."""
    __tracebackhide__ = True
    caps = subject.client.capabilities
    options = dict(causal=case.causal, scale=case.scale)
    call = Fp8Call(*(inputs.q, inputs.k, inputs.v), inputs.scales, case.fp8_format, caps.fp8_p,
                   output_dtype(subject, case), options)  # fmt: skip
    comparison = compare_fp8(
        out, inputs, **options, p_rounding=call.p_rounding, out_dtype=call.out_dtype
    )
    held_to_budget(subject, case, out, call, comparison, diagnose_fp8, f"P in {caps.fp8_p}")


def held_to_budget(subject: Subject, case: Case, out, call, comparison: Fp8Comparison, diagnose,
                   label: str) -> None:  # fmt: skip
    """Notes ``comparison``'s fraction of the budget; where it failed, fails the test with the
    mistake ``diagnose`` (an FP8 or block-scaled family's) names: "out (``label``): ..."."""
    __tracebackhide__ = True
    subject.notes.note_budget_fraction(comparison.elements.budget_fraction, call.out_dtype)
    if not comparison.ok:
        finding = diagnose(out, call, truth=comparison.truth, case=case,
                           comparison=comparison.elements)  # fmt: skip
        message = f"out ({label}): {comparison.describe()}"
        fail(subject, case, with_diagnosis(subject, message, finding))
