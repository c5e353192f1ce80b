"""The tolerance policy: how far from the float64 oracle an implementation may be, per dtype.

The rule (the one FlashAttention's and PyTorch's own SDPA tests use): in the same test, compute a
*naive baseline* - the formula evaluated step by step in the dtype under test - and measure its
error against the float64 oracle. The implementation's error may be at most

    allowed = baseline_factor * baseline_error + floor

    floor   = floor_u * u(dtype) * magnitude + u(float32) * K    (float32, float16, bfloat16)
    floor   = floor_u * u(dtype) * magnitude * (1 + max|s|)      (float64)

where u is the dtype's unit roundoff, ``magnitude`` the size of the quantity compared (max|V|
for outputs, max|truth| for gradients) and max|s| the largest scaled score. The floor is the
error that rounding alone commits where the baseline cannot show it: for low precision, the
rounding of the output itself (2u = one ulp of max|V|), should the baseline be exact by luck; for
float64, whose baseline *is* the oracle's computation and so has no error at all, also the
rounding of the scores (a score s is off by up to u|s|, which exp() turns into a relative error
of u|s| in its weight).

Below float64, an output's floor also carries the rounding of the scores where they are held,
in the accumulation dtype (float32): K is the largest ``spec.formula.score_rounding_sensitivity``,
how far scores each rounded by the size of their dot product (|scale| sum_d |q_d k_d|, not the
result |s|, which cancellation can make tens of times smaller at D = 576) can move an output
element (gradients, log-sum-exps and merges have no K). The baseline commits that rounding too,
but on a row whose top scores are large and nearly tied it can be exact by chance, and two
correct float32 evaluations that sum the same dot products in another order then differ by many
times the baseline's error (docs/tolerance.md). Elsewhere the term is below the others.
Float64's score term is the crude form of the same bound, with 64u of room for the sum.

Run ``python -m conformance.survey`` to see where the built-ins sit inside these budgets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from conformance.judge.truth import CaseTruth, largest_finite
from spec.dtypes import UNIT_ROUNDOFF, check_dtype
from spec.formula import (
    accumulation_dtype,
    gradient_magnitudes,
    naive_baseline_vjp,
    reference_feature_vjp,
    reference_scores,
    repeat_kv_heads,
)


@dataclass(frozen=True)
class Budget:
    dtype: str
    baseline_factor: float
    floor_u: float  # the floor, in units of the dtype's unit roundoff u
    floor_scales_with_scores: bool
    reason: str
    baseline: str | None = None  # how a failure names the baseline; None: the naive <dtype> formula


BUDGETS = {
    "float64": Budget(
        "float64",
        baseline_factor=2.0,
        floor_u=64.0,
        floor_scales_with_scores=True,
        reason=(
            "The float64 baseline is the oracle's own computation, so its error is 0 and the floor "
            "decides: 64u per unit of score covers any summation order and an online softmax, "
            "while an implementation that computes in float32 inside is off by about 2^29 u."
        ),
    ),
    "float32": Budget(
        "float32",
        baseline_factor=3.0,
        floor_u=2.0,
        floor_scales_with_scores=False,
        reason=(
            "Two float32 evaluations with different matmul blocking have errors of the same order "
            "but not the same maximum (python -m conformance.survey prints each built-in's ratio "
            "to the baseline; docs/tolerance.md records it), so 3x is tight yet "
            "free of false alarms."
        ),
    ),
    "float16": Budget(
        "float16",
        baseline_factor=2.0,
        floor_u=2.0,
        floor_scales_with_scores=False,
        reason=(
            "FlashAttention's rule for half precision: at most twice the error of the same formula "
            "computed in float16 with float32 accumulation."
        ),
    ),
    "bfloat16": Budget(
        "bfloat16",
        baseline_factor=2.0,
        floor_u=2.0,
        floor_scales_with_scores=False,
        reason="As float16: twice the naive bfloat16 baseline (8 mantissa bits, float32 sums).",
    ),
}


# Gradients: the same rule, with the naive backward pass (spec.formula.naive_baseline_vjp) as the
# baseline, and a floor that knows the backward's conditioning in every dtype: its magnitude is
# that of the terms each gradient sums (spec.formula.gradient_magnitudes), not of the gradient,
# which cancels to 0 where a row's weight sits on one key, and it grows with max|s|, since a
# score rounded by u|s| moves its weight, and so dS, by u|s| relative. Only float32 needs a wider
# factor: see its reason.
GRADIENT_BUDGETS = {
    **{dtype: replace(budget, floor_scales_with_scores=True) for dtype, budget in BUDGETS.items()},
    "float32": Budget(
        "float32",
        baseline_factor=6.0,
        floor_u=2.0,
        floor_scales_with_scores=True,
        reason=(
            "A backward pass chains five rounded matmuls, and a fused kernel computes the row term "
            "rowsum(dA * A) as rowsum(dO * O), from its rounded output: the maximum of two correct "
            "float32 backward passes differs more than that of two forward passes. Over 3000 "
            "seeds of OUT-GRAD's case, PyTorch's SDPA backward reached 4.6x the baseline's "
            "error and torch_eager's 2.9x (python -m conformance.survey --gradients --seeds "
            "3000); 6x leaves a margin of 1.3, and a wrong gradient or float32 arithmetic inside "
            "a float64 kernel is off by orders of magnitude more."
        ),
    ),
}


def budget_for(dtype: str, budgets: dict[str, Budget] = BUDGETS) -> Budget:
    return budgets[check_dtype(dtype)]


def summation_slack(dtype: str, terms: int) -> float:
    """Relative rounding a weighted sum of ``terms`` values with weights summing to 1 may commit:
    storing each weight in ``dtype`` moves it by at most u (the relative errors are weighted by
    weights summing to 1), and summing adds ``terms`` roundoffs of the accumulation type. Twice
    the first allows for rounding both weights and result: 4 u(dtype) + terms u(accumulation)."""
    return 4 * UNIT_ROUNDOFF[dtype] + terms * UNIT_ROUNDOFF[accumulation_dtype(dtype)]


@dataclass(frozen=True)
class Comparison:
    """The error of ``actual`` against the oracle, and what the budget allows."""

    dtype: str
    max_abs: float
    max_rel: float  # max_abs relative to max|truth|
    worst_index: tuple[int, ...]
    actual_at_worst: float
    truth_at_worst: float
    baseline_error: float
    floor: float
    allowed: float
    budget: Budget
    score_floor: float = 0.0  # the part of the floor that is the scores' rounding
    # NaN and infinities in ``actual`` where the truth is finite: how many, of how many, first where
    nonfinite: str = ""

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.allowed

    @property
    def budget_fraction(self) -> float:
        """Error as a fraction of the budget (<= 1 passes)."""
        return self.max_abs / self.allowed if self.allowed > 0 else float("inf")

    def describe(self) -> str:
        budget = self.budget
        scores = f" + {self.score_floor:.3e} for the scores' rounding" if self.score_floor else ""
        baseline = budget.baseline or f"the naive {self.dtype} formula"
        if self.baseline_error == 0:
            # The naive formula in this dtype gets every element exactly: only the floor is left.
            allowance = (
                f"allowed {self.allowed:.3e}, the floor of {budget.floor_u:g}u{scores}: "
                f"{baseline} is exact here"
            )
        else:
            allowance = (
                f"allowed {self.allowed:.3e} = {budget.baseline_factor:g} x {baseline}'s error "
                f"{self.baseline_error:.3e} + {budget.floor_u:g}u{scores}"
            )
        return (
            f"{describe_fraction(self.budget_fraction)}: {self.nonfinite}max abs err "
            f"{self.max_abs:.3e} at "
            f"{self.worst_index}, got {self.actual_at_worst:.6g}, truth {self.truth_at_worst:.6g}"
            f" (rel err {self.max_rel:.2e}); {allowance}"
        )


def describe_fraction(fraction: float) -> str:
    """A budget fraction as a reader takes it in: "0.31 of budget", "12x budget", ">1000x
    budget" (past that, the number says nothing more)."""
    if np.isnan(fraction):
        return "NaN of budget"
    if fraction > 1000:
        return ">1000x budget"
    return f"{fraction:.2f} of budget" if fraction < 10 else f"{fraction:.0f}x budget"


def describe_nonfinite(actual: np.ndarray, truth: np.ndarray) -> str:
    """ "NaN in 12 of 672 elements where the truth is finite, first at (0, 1, 3, 0); " (and the
    infinities alike), or "" where ``actual`` is finite wherever the truth is."""
    actual = np.asarray(actual, np.float64)
    if actual.shape != np.shape(truth):
        return ""
    finite_truth = np.isfinite(truth)
    said = []
    for name, found in (("NaN", np.isnan(actual)), ("inf", np.isinf(actual))):
        where = found & finite_truth
        if where.any():
            first = tuple(int(i) for i in np.argwhere(where)[0])
            said.append(
                f"{name} in {int(where.sum())} of {actual.size} elements where the truth is "
                f"finite, first at {first}; "
            )
    return "".join(said)


def max_error(actual: np.ndarray, truth: np.ndarray) -> tuple[float, tuple[int, ...]]:
    """Largest |actual - truth| and where; NaN or inf where the truth is finite counts as inf. NaN
    where the truth is NaN agrees: the truth of a row that sees no key, where the implementation
    declares NaN for it (the tests give the truth the declared convention there)."""
    actual = np.asarray(actual, np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(actual - truth)
    diff = np.where(np.isnan(actual) & np.isnan(truth), 0.0, np.where(np.isnan(diff), np.inf, diff))
    if diff.size == 0:
        return 0.0, ()
    flat = int(np.argmax(diff))
    return float(diff.flat[flat]), tuple(int(i) for i in np.unravel_index(flat, diff.shape))


def compare(
    actual: np.ndarray,
    truth: np.ndarray,
    baseline: np.ndarray,
    *,
    dtype: str,
    magnitude: float,
    max_score: float = 0.0,
    score_rounding: Callable[[], float] | None = None,
    budgets: dict[str, Budget] = BUDGETS,
) -> Comparison:
    """Judge ``actual`` against ``truth`` (the float64 oracle) under the budget for ``dtype``
    (from ``budgets``: the outputs', or GRADIENT_BUDGETS). ``score_rounding``: for an output, what
    gives the largest ``spec.formula.score_rounding_sensitivity`` of its call, called only where
    the floor does not bound it already; its rounding in the accumulation dtype joins the
    floor."""
    budget = budget_for(dtype, budgets)
    max_abs, worst = max_error(actual, truth)
    if np.ndim(baseline) and np.size(baseline):
        # A row the baseline leaves NaN throughout saw no key (0 / 0): it has no rounding to
        # measure, and the truth there is the declared convention; NaN would make the budget inf.
        unseen = np.isnan(baseline).all(axis=-1, keepdims=True)
        baseline = np.where(unseen, truth, baseline)
    baseline_error, _ = max_error(baseline, truth)
    floor = budget.floor_u * UNIT_ROUNDOFF[dtype] * magnitude
    if budget.floor_scales_with_scores:
        floor *= 1.0 + max_score
    # A floor that grows with max|s| (float64's) already bounds the scores' rounding, crudely.
    score_floor = 0.0
    if score_rounding is not None and not budget.floor_scales_with_scores:
        score_floor = UNIT_ROUNDOFF[accumulation_dtype(dtype)] * score_rounding()
    floor += score_floor
    finite = np.abs(truth[np.isfinite(truth)]) if truth.size else np.zeros(0)
    truth_scale = float(finite.max()) if finite.size else 0.0
    return Comparison(
        dtype=dtype,
        max_abs=max_abs,
        max_rel=max_abs / truth_scale if truth_scale > 0 else max_abs,
        worst_index=worst,
        actual_at_worst=float(np.asarray(actual, np.float64)[worst]) if worst else float("nan"),
        truth_at_worst=float(truth[worst]) if worst else float("nan"),
        baseline_error=baseline_error,
        floor=floor,
        allowed=budget.baseline_factor * baseline_error + floor,
        budget=budget,
        score_floor=score_floor,
        nonfinite=describe_nonfinite(actual, truth),
    )


# A shipped merge weighs part i by exp(lse_i - L). An lse rounded by its own magnitude, as a
# conversion between bases rounds it (ln 2 times a base-2 lse), moves that weight by u|lse|: the
# merge's condition in its lses is max|lse|, as the softmax's in its scores is max|s|. Its floor
# is therefore 4u (1 + max|lse|) of the outputs' magnitude, in every dtype (docs/tolerance.md):
# a correct merge that converts bases first sits at 0.04 of it, one whose lses are 16 ulps
# worse at 2.06 (tests/test_tolerance.py's inputs).
MERGE_FLOOR_U = 4.0


def compare_merged(
    actual: np.ndarray,
    truth: np.ndarray,
    baseline: np.ndarray,
    *,
    outputs: np.ndarray,
    natural_lses: np.ndarray,
    dtype: str,
) -> Comparison:
    """Judge a shipped merge's output against the merge of the float64 formula, ``baseline`` the
    same merge in the dtype's accumulation; ``outputs`` and ``natural_lses`` the parts merged
    (their lses in the natural base), which size the floor."""
    finite = np.isfinite(outputs)
    budget = budget_for(dtype)
    merge_budget = Budget(
        dtype,
        baseline_factor=budget.baseline_factor,
        floor_u=MERGE_FLOOR_U,
        floor_scales_with_scores=True,
        reason=f"{budget.reason} A merge's floor carries (1 + max|lse|): see MERGE_FLOOR_U.",
    )
    return compare(
        actual,
        truth,
        baseline,
        dtype=dtype,
        magnitude=float(np.abs(outputs[finite]).max()) if finite.any() else 0.0,
        max_score=largest_finite(natural_lses),
        budgets={dtype: merge_budget},
    )


def natural_lse(subject, lse: np.ndarray) -> np.ndarray:
    """A returned log-sum-exp in the natural base, from the base the implementation declares."""
    return lse * math.log(2) if subject.client.capabilities.lse_base == "2" else lse


def compare_lse(actual: np.ndarray, truth: np.ndarray, naive: np.ndarray, *, dtype: str):
    """Judge a returned log-sum-exp (in the natural base) against the oracle's. A kernel keeps it
    in its accumulation dtype whatever its inputs' (FlashAttention's softmax_lse is float32 for
    float16 and bfloat16), so the budget is that dtype's: 3x the naive float32 log-sum-exp's
    error plus 2u of its magnitude below float64, the 64u floor in float64. Rows that see no key
    (-inf in the truth) must be -inf."""
    budget_dtype = accumulation_dtype(dtype)
    finite = np.isfinite(truth)
    magnitude = max(1.0, float(np.max(np.abs(truth[finite])))) if finite.any() else 1.0
    return compare(
        np.where(finite, actual, np.where(actual == truth, 0.0, np.inf)),
        np.where(finite, truth, 0.0),
        np.where(finite, naive, 0.0),
        dtype=budget_dtype,
        magnitude=magnitude,
    )


def compare_to_oracle(
    actual: np.ndarray,
    q,
    k,
    v,
    *,
    dtype: str,
    causal: bool = True,
    scale: float | None = None,
    truth: np.ndarray | None = None,
    case_truth: CaseTruth | None = None,
    **variant,
) -> Comparison:
    """Judge ``actual`` as attention(q, k, v): against the float64 oracle (or ``truth``, where the
    test knows it differently), with the naive baseline and the budget for ``dtype``. ``variant``
    holds the extensions' keywords (window, key_lengths) where the case sets them;
    ``case_truth``, the caller's :class:`CaseTruth` of q, k, v, where it has one."""
    # the inputs hashed once for the three lookups below, and the caller's
    case_truth = case_truth or CaseTruth(q, k, v)
    if truth is None:
        truth = case_truth.attention(causal=causal, scale=scale, **variant)
    return compare(
        actual,
        truth,
        case_truth.baseline(dtype=dtype, causal=causal, scale=scale, **variant),
        dtype=dtype,
        magnitude=largest_finite(v),
        max_score=case_truth.largest_score(scale),
        score_rounding=lambda: case_truth.score_rounding(causal=causal, scale=scale, **variant),
    )


def compare_gradients(
    grads: dict, q, k, v, grad_out, *, dtype: str, causal: bool = True,
    scale: float | None = None, grad_lse=None, **variant,
) -> dict[str, Comparison]:  # fmt: skip
    """Judge gradients {"q", "k", "v"[, "sinks"]} of sum(out * grad_out) (+ sum(lse *
    grad_lse), lse natural), as float64 arrays, against the oracle's
    (spec.formula.reference_feature_vjp), with the naive backward pass in ``dtype`` as baseline
    and GRADIENT_BUDGETS, whose floor takes the size of what each gradient sums:
    {"dq", "dk", "dv"[, "dsinks"]}."""
    options = dict(causal=causal, scale=scale, grad_lse=grad_lse, **variant)
    truths = reference_feature_vjp(q, k, v, grad_out, **options)
    baselines = naive_baseline_vjp(q, k, v, grad_out, dtype=dtype, **options)
    magnitudes = gradient_magnitudes(q, k, v, grad_out, **options)
    # The scores whose rounding the weights feel: a softcap's capped ones (dtanh damps a large
    # score's rounding to what its capped value carries); ALiBi's bias is exact
    scores = reference_scores(q, repeat_kv_heads(q, k), scale=scale)  # (B, H, Tq, Tk)
    if variant.get("softcap") is not None:
        scores = variant["softcap"] * np.tanh(scores / variant["softcap"])
    max_score = float(np.abs(scores).max(initial=0.0))
    return {
        f"d{name}": compare(
            grads[name],
            truth,
            baselines[name],
            dtype=dtype,
            magnitude=magnitudes[name],
            max_score=max_score,
            budgets=GRADIENT_BUDGETS,
        )
        for name, truth in truths.items()
    }
