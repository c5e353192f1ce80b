"""Naming the mistake: what a failing output matches among :mod:`spec.mistakes`' variants, and
where its error lies when it matches none.

A failing comparison becomes a *finding*: the mistakes whose variant the output matches within
the same budget it failed against (``matched``, with the fraction of that budget), the mistakes
that do not explain it (``refuted``: the output is not their variant, or their variant is the
truth on these inputs, which the output is not), and a description of where the error is
(``where``). The report pools an implementation's findings (:func:`conclude`): one kernel has
one set of bugs, so a mistake is named only when it explains every failing comparison, being
refuted by none; the precision mistakes (the formula computed in a coarser dtype) only when no
exact variant is named; otherwise each failed claim gets a description of where its errors lie,
never a guess.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from conformance.judge.tolerance import Comparison, compare_to_oracle, describe_fraction
from conformance.judge.truth import CaseTruth, largest_finite
from spec.block_scaled import BlockCall
from spec.dtypes import UNIT_ROUNDOFF
from spec.masks import LISTED_KEYWORDS
from spec.mistakes import Family, find_mistake, of_family
from spec.mistakes.forward import Call, mistakes_showing_in
from spec.mistakes.fp8 import Fp8Call
from spec.mistakes.gradients import GradientCall
from spec.mistakes.state import LseCall, MergeCall

SPANS_SHOWN = 4  # runs of indices a localisation names before "..."
# The largest call (in multiply-adds, :func:`work_of`) on which every variant is computed: two
# heads of 181 x 181 at D = 64, 1.3 ms a variant here, against 0.24 s at ANDREA's twelve heads of
# 1024 x 1024, some fifty variants a failing call; a kernel failing there fails smaller cases
# too, where its mistake is named.
DIAGNOSED_WORK = 1 << 23
# An output whose error is below this fraction of a coarser dtype's budget (its scores' rounding
# aside: a bound, not what that arithmetic shows) was not computed in that dtype, whose naive
# formula alone errs by about a third of it: the zoo's computes_in_float32, judged in float64,
# sat at 0.07 to 0.33 of float32's budget; window_soft_lower_edge, off by exp(-30) and nothing
# else, at 0.00.
PRECISION_SHOWS = 0.02


def mismatch(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|actual - expected| elementwise, where NaN against NaN and inf against the same inf agree
    (0) and a NaN against anything else is infinitely far (inf)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(actual - expected)
    same = (np.isnan(actual) & np.isnan(expected)) | (np.isinf(actual) & (actual == expected))
    return np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))


def largest(values: np.ndarray) -> float:
    return float(values.max()) if values.size else 0.0


def diagnose(
    out,
    q,
    k,
    v,
    *,
    case,
    comparison: Comparison,
    truth: np.ndarray,
    pieces=None,
    refuted_before: set[str] = frozenset(),
    empty_rows: str | None = None,
) -> dict:
    """The finding of one failing comparison of ``out`` (the implementation's answer to
    ``case`` on q, k, v) with ``truth``. ``pieces``, where the output was assembled from several
    calls along the query rows, lists each call as (case, q, k, v): a variant is then the
    variants of those calls, assembled the same way. ``refuted_before``: the mistakes an earlier
    finding of the same implementation refuted, which nothing can name again: not computed.
    ``empty_rows``: the convention the implementation declares for a row that sees no key, which
    a kernel with a variant's bug follows where that variant's row sees none (its 0 / 0)."""
    pieces = pieces or [(case, q, k, v)]
    if sum(work_of(piece) for piece, *_ in pieces) > DIAGNOSED_WORK:
        # Too large to compute every variant on: where the error lies, and no mistake either
        # matched or refuted (a smaller failing case of the same kernel names it).
        return finding_of(out, truth, case, comparison, matched={}, refuted=[], tried=False)
    calls = [
        (piece, CaseTruth(*arrays), Call.of(*arrays, dtype=piece.dtype, causal=piece.causal,
                                            scale=piece.scale, **mistake_options(piece)))
        for piece, *arrays in pieces
    ]  # fmt: skip
    showing = {m.name for *_, call in calls for m in mistakes_showing_in(call)}
    showing -= refuted_before
    listed = any(case.formula_variant.get(name) is not None for name in LISTED_KEYWORDS)
    outputs = of_family(Family.OUTPUT)
    exact = [m for m in outputs if m.precision is None]
    # A mistake that cannot show here does not explain this failure: refuted, uncomputed.
    matched, refuted = match_or_refute(
        exact,
        [Judged(out, truth, comparison.allowed)],
        predicted=lambda mistake: [
            output_variant(mistake, calls, out, empty_rows if listed else None)
        ],
        shows=lambda mistake: mistake.name in showing,
        widened=lambda mistake, variant, error, allowed: widened_budget(
            comparison, variant, error, allowed,
            in_dtype=functools.partial(assembled, mistake, calls, True),
        ),
    )  # fmt: skip
    for mistake in (m for m in outputs if m.precision is not None):
        fraction = None
        if mistake.name in showing:
            fraction = precision_fraction(mistake, out, q, k, v, case=case, truth=truth)
        if fraction is None:
            refuted.append(mistake.name)
        else:
            matched[mistake.name] = fraction
    return finding_of(out, truth, case, comparison, matched=matched, refuted=refuted)


def output_variant(mistake, calls, out, empty_rows: str | None) -> np.ndarray:
    """The output mistake's variant of the failing call's ``calls``, assembled; where the call
    has a listed mask (the only calls with rows that see no key in these tests), its empty rows
    as the output's declared convention writes them."""
    variant = assembled(mistake, calls)
    return with_empty_rows(variant, out, empty_rows) if empty_rows else variant


def precision_fraction(mistake, out, q, k, v, *, case, truth) -> float | None:
    """A precision mistake has no variant: the formula itself in a coarser dtype. The fraction of
    that dtype's budget the output's error is, where it lies within it and is not far better
    than that arithmetic shows (:data:`PRECISION_SHOWS`); None where the mistake is refuted (and
    where the dtype is no coarser than the call's)."""
    if UNIT_ROUNDOFF[mistake.precision] <= UNIT_ROUNDOFF[case.dtype]:
        return None
    coarser = compare_to_oracle(
        truth, q, k, v, dtype=mistake.precision, causal=case.causal, scale=case.scale,
        truth=truth, **case.formula_variant,
    )  # fmt: skip
    error = largest(mismatch(out, truth))
    # Against what that arithmetic shows, its baseline and ulp: the scores' rounding is a bound,
    # far above it where large scores nearly tie.
    if error < (coarser.allowed - coarser.score_floor) * PRECISION_SHOWS:
        return None  # far better than that arithmetic: not what went wrong
    if error > coarser.allowed:
        return None
    return error / coarser.allowed if coarser.allowed > 0 else 0.0


def diagnose_lse(lse, call: LseCall, *, case, comparison: Comparison) -> dict:
    """The finding of a failing log-sum-exp (natural base, as compared) of ``call``: the state
    mistakes of the log-sum-exp whose variant it matches within the budget it failed against.
    The output's mistakes are not judged on it: neither matched nor refuted."""
    judged = [Judged(lse, call.truth, comparison.allowed)]
    matched, refuted = match_or_refute(of_family(Family.LSE), judged, *on(call))
    # (B, H, Tq) as a one-column output, for the localisation
    return finding_of(
        lse[..., None], call.truth[..., None], case, comparison, matched=matched, refuted=refuted
    )


def diagnose_fp8(out, call: Fp8Call, *, truth, case, comparison: Comparison) -> dict:
    """The finding of a failing FP8 output: the FP8 mistakes (spec.mistakes.fp8), each in the
    arithmetic the implementation declares, whose variant it matches within its budget."""
    judged = [Judged(out, truth, comparison.allowed)]
    matched, refuted = match_or_refute(of_family(Family.FP8), judged, *on(call))
    return finding_of(out, truth, case, comparison, matched=matched, refuted=refuted)


def diagnose_block(out, call: BlockCall, *, truth, case, comparison: Comparison) -> dict:
    """The finding of a failing block-scaled output: the block-scaled mistakes
    (spec.mistakes.block_scaled), each in the arithmetic the implementation declares, whose
    variant it matches within its budget."""
    judged = [Judged(out, truth, comparison.allowed)]
    matched, refuted = match_or_refute(of_family(Family.BLOCK), judged, *on(call))
    return finding_of(out, truth, case, comparison, matched=matched, refuted=refuted)


@dataclass(frozen=True)
class Judged:
    """One array of a failing answer a mistake's variant predicts: the answer's, the truth's, and
    the budget it failed against. ``at_variant_size``: the budget scales to the variant's size
    when the answer is held to it, as an output's does: a variant several times
    the truth (a P not normalised, a scale dropped) rounds at its own size."""

    answer: np.ndarray
    truth: np.ndarray
    allowed: float
    at_variant_size: bool = True

    def distances(self, variant: np.ndarray) -> tuple[float, float, float]:
        """(the answer's distance from ``variant``, the variant's from the truth, the budget the
        answer is held to there)."""
        size = max(1.0, largest_finite(variant) / max(largest_finite(self.truth), 1e-300))
        allowed = self.allowed * (size if self.at_variant_size else 1.0)
        return (
            largest(mismatch(self.answer, variant)),
            largest(mismatch(variant, self.truth)),
            allowed,
        )


def match_or_refute(mistakes, judged: list[Judged], predicted, shows, widened=None):
    """({mistake: fraction of its budget} for the ``mistakes`` whose variant every ``judged``
    array matches, [the others]). ``predicted(mistake)``: its variant's arrays in ``judged``'s
    order; ``shows(mistake)``: whether it can differ from the truth on the call. A mistake is
    refuted where it cannot show, where its variant is not shaped as the truth, where it gives the
    truth (every array within the failed budget of it, at the truth's size), which the answer is
    not, and where any array is off its variant by more than its budget. ``widened(mistake,
    variant, error, allowed)``: the budget where ``error`` exceeds the scaled one (the output's:
    the variant's own baseline, :func:`widened_budget`)."""
    matched, refuted = {}, []
    for mistake in mistakes:
        if not shows(mistake):
            refuted.append(mistake.name)
            continue
        with np.errstate(all="ignore"):
            variants = predicted(mistake)
        if any(np.shape(v) != np.shape(p.truth) for p, v in zip(judged, variants, strict=True)):
            refuted.append(mistake.name)
            continue
        distances = [
            part.distances(variant) for part, variant in zip(judged, variants, strict=True)
        ]
        if all(off <= part.allowed for part, (_, off, _) in zip(judged, distances, strict=True)):
            refuted.append(mistake.name)  # it gives the truth here
            continue
        if widened is not None:
            distances = [
                (error, off, allowed if error <= allowed else widened(mistake, v, error, allowed))
                for v, (error, off, allowed) in zip(variants, distances, strict=True)
            ]
        if all(error <= allowed for error, _, allowed in distances):
            matched[mistake.name] = max(
                error / allowed if allowed else 0.0 for error, _, allowed in distances
            )
        else:
            refuted.append(mistake.name)
    return matched, refuted


def on(call, arrays=lambda variant: [variant]):
    """``predicted`` and ``shows`` of :func:`match_or_refute` for a family whose variant takes
    the call: ``arrays(variant)`` its arrays in the judged order."""
    return (lambda mistake: arrays(mistake.variant(call))), (lambda mistake: mistake.shows(call))


def diagnose_merge(
    out, lse, call: MergeCall, *, truth, case, comparisons: tuple[Comparison, Comparison]
) -> dict:
    """The finding of a shipped merge's failing (out, lse) against ``truth``, its (out, lse),
    with the lse in the natural base as both comparisons (out's, lse's) were made: the merge
    mistakes whose variant both match within their budgets (not scaled: a merge's variant is a
    weighting of the same partial outputs)."""
    to_natural = math.log(2) if call.base == "2" else 1.0
    judged = [
        Judged(got, right, c.allowed, at_variant_size=False)
        for got, right, c in zip((out, lse), truth, comparisons, strict=True)
    ]
    matched, refuted = match_or_refute(
        of_family(Family.MERGE), judged, *on(call, lambda v: [v[0], v[1] * to_natural])
    )
    failing = comparisons[0] if not comparisons[0].ok else comparisons[1]
    return finding_of(out, truth[0], case, failing, matched=matched, refuted=refuted)


def diagnose_gradients(grads: dict, call: GradientCall, *, case, comparisons: dict) -> dict:
    """The finding of a failing backward: the backward's mistakes (spec.mistakes.gradients) whose
    variant every gradient matches within its budget ({"dq": Comparison, ...}), scaled to the
    variant's size (a P recomputed with the wrong mask is not normalised, its gradients many
    times the truth's). The first failing gradient is located; a sink's (H,) as one element
    per head."""
    names = list(call.truth)
    judged = [Judged(grads[n], call.truth[n], comparisons[f"d{n}"].allowed) for n in names]
    matched, refuted = match_or_refute(
        of_family(Family.GRADIENT), judged, *on(call, lambda v: [v[n] for n in names])
    )
    name = next(n for n in call.truth if not comparisons[f"d{n}"].ok)
    got, truth = grads[name], call.truth[name]
    if got.ndim == 1:  # dsinks (H,), located as (1, H, 1, 1)
        got, truth = got[None, :, None, None], truth[None, :, None, None]
    return finding_of(got, truth, case, comparisons[f"d{name}"], matched=matched, refuted=refuted)


def finding_of(out, truth, case, comparison: Comparison, *, matched, refuted,
               tried: bool = True) -> dict:  # fmt: skip
    """``tried``: whether the catalogue's variants were computed on the call (not past
    :data:`DIAGNOSED_WORK`), so that an empty ``matched`` means none matched."""
    return {
        "tried": tried,
        "case": case.describe(),
        "tq": case.tq,
        "tk": case.tk,
        "dtype": case.dtype,
        "fraction_of_budget": comparison.budget_fraction,
        "matched": matched,
        "refuted": refuted,
        "where": locate(out, truth, comparison.allowed, case),
    }


def work_of(case) -> int:
    """Multiply-adds of one attention call: B H Tq Tk (D + Dv)."""
    return case.batch * case.heads * case.tq * case.tk * (case.head_dim + case.value_dim)


def mistake_options(case) -> dict:
    """What a mistake's variant needs of ``case`` beyond causal and scale: the formula's keywords,
    and the page size where k and v reached the kernel as page pools (the truth needs none)."""
    paging = {} if case.page_size is None else {"page_size": case.page_size}
    return {**case.formula_variant, **paging}


def with_empty_rows(variant: np.ndarray, out: np.ndarray, empty_rows: str | None) -> np.ndarray:
    """``variant`` with each row it leaves NaN throughout (its row saw no key: 0 / 0) where the
    output wrote the declared empty row, zeros, taken as that empty row: the variant's bug in a
    kernel that follows its convention. A NaN row the output did not zero (an overflow) stays;
    under the NaN convention NaN against NaN agrees already."""
    if empty_rows != "zeros" or variant.shape != np.shape(out):
        return variant
    unseen = np.isnan(variant).all(axis=-1, keepdims=True) & (out == 0).all(axis=-1, keepdims=True)
    return np.where(unseen, 0.0, variant)


def assembled(mistake, calls, in_dtype: bool = False) -> np.ndarray:
    """The mistake's output on each call, joined along the query rows; where it cannot show on
    a call, the truth's. ``in_dtype``: computed in the call's arithmetic."""
    pieces = []
    for case, case_truth, call in calls:
        options = dict(causal=case.causal, scale=case.scale, **case.formula_variant)
        if not mistake.shows(call):
            pieces.append(case_truth.attention(**options))
        else:
            pieces.append(
                case_truth.mistake(
                    mistake.name, dtype=case.dtype, in_dtype=in_dtype, causal=case.causal,
                    scale=case.scale, **mistake_options(case),
                )
            )  # fmt: skip
    return np.concatenate(pieces, axis=-2)


# Past this many times the comparison's budget, an output is no rounding of a variant, however
# badly conditioned: the variant's own baseline is not computed (it costs a second variant).
FAR_OFF = 1e4


def widened_budget(comparison: Comparison, variant, error: float, allowed: float, in_dtype):
    """How far an output may be from a variant it is more than ``allowed`` (the failed
    comparison's budget at the variant's size) from, and still be it: where ``error`` is not
    past FAR_OFF times that, the budget rule applied to the variant itself, its naive baseline
    the variant computed in the dtype's arithmetic (``in_dtype()``): a variant can be worse
    conditioned than the formula (scores at another scale, an accumulator never rescaled)."""
    if error > FAR_OFF * allowed or comparison.dtype == "float64":
        return allowed  # float64's arithmetic is the variant's own: no baseline error
    size = allowed / comparison.allowed if comparison.allowed else 1.0
    own = comparison.budget.baseline_factor * largest(mismatch(in_dtype(), variant))
    return max(allowed, own + comparison.floor * size)


def spans(indices) -> str:
    """Sorted indices as runs: "0-3, 7, 9-12" (the first few, then "...")."""
    runs: list[list[int]] = []
    for index in sorted(int(i) for i in indices):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:SPANS_SHOWN])
    return text + (", ..." if len(runs) > SPANS_SHOWN else "")


def _tile_boundary(first: int) -> int | None:
    """The largest power of two from 16 up that ``first`` is a multiple of, if any."""
    boundary = None
    tile = 16
    while first and first % tile == 0:
        boundary, tile = tile, tile * 2
    return boundary


def locate(out, truth, allowed: float, case) -> str:
    """Where ``out`` is off by more than ``allowed``: which batch items, heads, query rows and
    output columns, whether with NaN, and the case's Tq against Tk. A description, not a guess."""
    error = mismatch(out, truth)  # (B, H, Tq, Dv)
    bad = error > allowed
    if not bad.any():
        return "no element is off by more than the budget"
    parts = [f"{int(bad.sum())} of {bad.size} elements off"]
    nans = int((np.isnan(np.asarray(out, np.float64)) & ~np.isnan(truth)).sum())
    if nans:
        parts.append(f"{nans} NaN")
    for axis, label in ((0, "batch items"), (1, "heads"), (2, "query rows"), (3, "columns")):
        others = tuple(a for a in range(4) if a != axis)
        hit = np.flatnonzero(bad.any(axis=others))
        size = bad.shape[axis]
        if len(hit) == size:
            if size > 1:
                parts.append(f"every one of {size} {label}")
            continue
        text = f"{label} {spans(hit)} of {size}"
        boundary = _tile_boundary(int(hit[0])) if axis == 2 else None
        if boundary and hit[0] > 0:
            text += f" (from row {int(hit[0])}, a multiple of {boundary})"
        parts.append(text)
    relation = "=" if case.tq == case.tk else ("<" if case.tq < case.tk else ">")
    parts.append(f"at Tq={case.tq} {relation} Tk={case.tk}, {case.dtype}")
    return "; ".join(parts)


def refuted_by(findings: list[dict]) -> set[str]:
    """The mistakes some finding refutes: pooled over an implementation's claims, since one
    kernel has one set of bugs."""
    return {name for finding in findings for name in finding["refuted"]}


def conclude(findings: list[dict], refuted: set[str] | None = None) -> list[dict]:
    """A claim's diagnosis from its failing comparisons' findings (each with its "test"): the
    mistakes named (``kind`` "mistake"), else where the errors lie (``kind`` "where"). A mistake
    in ``refuted`` (by default, those its own findings refute) is never named."""
    if not findings:
        return []
    refuted = refuted_by(findings) if refuted is None else refuted
    # Each mistake's evidence: the failing comparison it matched least closely, so that the
    # fraction says how close it came everywhere.
    best: dict[str, tuple[float, str]] = {}
    for finding in findings:
        for name, fraction in finding["matched"].items():
            if name not in refuted and (name not in best or fraction > best[name][0]):
                best[name] = (fraction, finding["test"])
    exact = [name for name in best if find_mistake(name).precision is None]
    # Of the precision mistakes, the finest that explains everything says the most.
    finest = sorted(best, key=lambda name: UNIT_ROUNDOFF[find_mistake(name).precision or "float64"])
    named = exact or finest[:1]
    if named:
        return [
            {
                "kind": "mistake",
                "name": name,
                "text": find_mistake(name).text,
                "hint": find_mistake(name).hint,
                "test": best[name][1],
                "fraction_of_budget": best[name][0],
            }
            for name in sorted(named, key=lambda n: best[n][0])
        ]
    first = findings[0]
    where = [
        {
            "kind": "where",
            "name": "where",
            "text": first["where"],
            "test": first["test"],
            "fraction_of_budget": first["fraction_of_budget"],
            # no finding computed the catalogue: nothing was refuted either
            "tried": any(finding.get("tried", True) for finding in findings),
        }
    ]
    pattern = common_pattern(findings)
    if pattern:
        where.append(
            {
                "kind": "where",
                "name": "pattern",
                "text": pattern,
                "test": first["test"],
                "fraction_of_budget": first["fraction_of_budget"],
            }
        )
    return where


def common_pattern(findings: list[dict]) -> str | None:
    """What every failing case has in common (Tq against Tk, the dtype), when all share it."""
    facts = []
    relations = {
        "Tq = 1" if f["tq"] == 1 else ("Tq < Tk" if f["tq"] < f["tk"] else "Tq >= Tk")
        for f in findings
    }
    if len(relations) == 1:
        facts.append(relations.pop())
    dtypes = {f["dtype"] for f in findings}
    if len(dtypes) == 1:
        facts.append(f"dtype {dtypes.pop()}")
    if not facts or len(findings) < 2:
        return None
    return f"all {len(findings)} failing comparisons have " + " and ".join(facts)


def describe_diagnosis(entries: list[dict]) -> str:
    """One line for a failure message: the mistakes matched, or where the error lies."""
    mistakes = [e for e in entries if e["kind"] == "mistake"]
    if mistakes:
        return "diagnosis: matches " + "; or ".join(
            f'{e["name"]}, "{e["text"]}" ({describe_fraction(e["fraction_of_budget"])})'
            for e in mistakes
        )
    return f"diagnosis: {unmatched(entries)}; " + "; ".join(e["text"] for e in entries)


def unmatched(entries: list[dict]) -> str:
    """Why a diagnosis names no mistake: none matched, or none was tried (the call too large)."""
    if all(entry.get("tried", True) for entry in entries):
        return "no catalogued mistake matches"
    return (
        f"the catalogue's mistakes not tried on a call this large (over {DIAGNOSED_WORK} "
        "multiply-adds; a smaller failing case names one)"
    )
