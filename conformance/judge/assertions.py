"""Assertion helpers for conformance tests.

Each takes the test's subject first (an implementation bound to the test, or the document for
the mathematics tests; either knows the test's claims from its marker), hides its own frame from
the traceback, and fails with one consistent message:

    <what>=<got>, but should be <expected> [CLAIM-ID numpy attention(causal=True, scale=None)]
    reproduce: python -m pytest --pyargs '<module::test>' --impl numpy --attnspec-seed 0   # B=1 ...
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.diagnosis import conclude, describe_diagnosis, diagnose, finding_of
from conformance.judge.harness import Case, Document, Subject
from conformance.judge.tolerance import Comparison, compare_to_oracle
from conformance.judge.truth import CaseTruth
from conformance.run.worker_clients import ImplementationRaised
from impls.contract import CONVENTIONS
from spec.formula import keys_read_and_blind_rows


def fail(subject: Subject | Document, case: Case | None, message: str) -> None:
    __tracebackhide__ = True
    where = [*subject.claims]
    if subject.name is not None:
        where.append(subject.name)
    if case is not None:
        where.append(case.call_signature())
    first, *more = message.split("\n", 1)  # the claims and call belong to the first line
    text = "\n".join(
        [f"{first} [{' '.join(where)}]", *more, f"reproduce: {subject.reproducer(case)}"]
    )
    pytest.fail(text, pytrace=False)


def assert_shape(subject: Subject | Document, case: Case, what: str, got, expected) -> None:
    __tracebackhide__ = True
    if tuple(got) != tuple(expected):
        fail(subject, case, f"{what}={tuple(got)}, but should be {tuple(expected)}")


def assert_equal(subject: Subject | Document, case: Case, what: str, got, expected) -> None:
    __tracebackhide__ = True
    if got != expected:
        fail(subject, case, f"{what}={got!r}, but should be {expected!r}")


def assert_identical(
    subject: Subject | Document,
    case: Case,
    what: str,
    got: np.ndarray,
    expected: np.ndarray,
    *,
    answer: tuple | None = None,
) -> None:
    """Bit-for-bit equality (NaNs equal to NaNs), reporting the first differing index. ``answer``,
    (out, q, k, v): the whole call ``got`` was cut from; where that answer is also off the truth
    by more than its budget, the failure names the catalogued mistake it matches."""
    __tracebackhide__ = True
    assert_shape(subject, case, f"{what}.shape", np.shape(got), np.shape(expected))
    got, expected = np.asarray(got), np.asarray(expected)
    differs = ~((got == expected) | (np.isnan(got) & np.isnan(expected)))
    if differs.any():
        index = tuple(int(i) for i in np.argwhere(differs)[0])
        message = (
            f"{what} differs in {int(differs.sum())} of {differs.size} elements, first at {index}: "
            f"{got[index]!r}, but should be {expected[index]!r} bit for bit"
        )
        if answer is not None:
            # The whole answer, where it is also off the truth, names the mistake.
            _, finding = judged(subject, case, *answer)
            message = with_diagnosis(subject, message, finding)
        fail(subject, case, message)


def judged(
    subject: Subject, case: Case, out, q, k, v, *, truth=None, pieces=None, diagnosable=True
) -> tuple[Comparison, dict | None]:
    """``out``, the answer to ``case`` on q, k, v, against ``truth`` (the oracle's by default),
    and where it misses its budget, the finding of its diagnosis: the mistakes the subject's
    earlier findings in this process refuted are not computed again (its client keeps them:
    one kernel, one set of bugs)."""
    case_truth = CaseTruth(q, k, v)
    options = dict(causal=case.causal, scale=case.scale, **case.formula_variant)
    if truth is None:
        truth = case_truth.attention(**options)
    comparison = compare_to_oracle(
        out, q, k, v, dtype=case.dtype, truth=truth, case_truth=case_truth, **options
    )
    if comparison.ok:
        return comparison, None
    if not diagnosable:  # a variant of ``case`` is not what made ``out``: it proves nothing
        return comparison, finding_of(out, truth, case, comparison, matched={}, refuted=[])
    refuted = subject.client.refuted_mistakes
    finding = diagnose(
        out, q, k, v, case=case, comparison=comparison, truth=truth, pieces=pieces,
        refuted_before=refuted, empty_rows=subject.client.capabilities.empty_rows,
    )  # fmt: skip
    refuted.update(finding["refuted"])
    return comparison, finding


def with_diagnosis(subject: Subject, message: str, finding: dict | None) -> str:
    """``message``, with the diagnosis of ``finding`` under it, noted for the test's claims."""
    if finding is None:
        return message
    subject.notes.note_finding(finding)
    return message + "\n" + describe_diagnosis(conclude([{**finding, "test": subject.test_id}]))


def answer_or_none_if_raised(subject: Subject, problem: str, call):
    """What ``call()`` returned, or None where the implementation raised; an error without a
    message fails the test's claim."""
    __tracebackhide__ = True
    try:
        return call()
    except ImplementationRaised as exc:
        if not exc.message.strip():
            fail(subject, None, f"{problem}: raised {exc.type_name} with no message")
        return None


def assert_raises_clearly(subject: Subject, case: Case, problem: str, call) -> None:
    """``call()`` raises an exception with a message: any type, as long as it says something."""
    __tracebackhide__ = True
    out = answer_or_none_if_raised(subject, problem, call)
    if out is None:
        return
    fail(
        subject,
        case,
        f"{problem}: returned an answer of shape {tuple(getattr(out, 'shape', ()))}, "
        "but should raise an error",
    )


def assert_follows_convention(
    subject: Subject, problem: str, convention: str, followed: str | None, why_not: str
) -> None:
    """The answer to ``problem`` followed one of ``convention``'s accepted values, and the one the
    implementation declares if it declares one; the one followed goes to the report."""
    __tracebackhide__ = True
    accepted = CONVENTIONS[convention]
    if followed is None:
        fail(
            subject,
            None,
            f"{problem}: {why_not}; it should raise an error or follow {convention}="
            + " or ".join(v for v in accepted if v != "raise"),
        )
    declared = subject.client.capabilities.convention(convention)
    if declared is not None and followed != declared:
        fail(
            subject,
            None,
            f"{problem}: {convention}={followed} ({accepted[followed]}), but it declares "
            f"{convention}={declared} ({accepted[declared]})",
        )
    subject.notes.note_convention(convention, followed)


def assert_within_budget(
    subject: Subject, case: Case, what: str, comparison: Comparison, finding: dict | None = None
) -> None:
    """``comparison`` within its budget; where it is not and the judge diagnosed the failing
    output (``finding``, :func:`conformance.judge.diagnosis.diagnose`), the diagnosis is noted
    for the claim and said in the message."""
    __tracebackhide__ = True
    subject.notes.note_budget_fraction(comparison.budget_fraction, comparison.dtype)
    if not comparison.ok:
        fail(subject, case, with_diagnosis(subject, f"{what}: {comparison.describe()}", finding))


def assert_matches_oracle(
    subject: Subject,
    case: Case,
    out: np.ndarray,
    q,
    k,
    v,
    *,
    truth: np.ndarray | None = None,
    what: str = "out",
    pieces: list[tuple] | None = None,
    diagnosable: bool = True,
) -> Comparison:
    """``out`` is attention(q, k, v) - or ``truth``, where the test knows it another way - within
    the tolerance budget for the case's dtype; where it is not, the failure names the catalogued
    mistake its output matches, or where its error lies. ``pieces``: the calls, as (case, q, k, v),
    whose outputs were joined along the query rows into ``out``, where it was not one call.
    ``diagnosable=False``: ``out`` is cut from a call that is not ``case`` and that no variant
    computes; a failure then says only where its errors lie."""
    __tracebackhide__ = True
    assert_shape(subject, case, f"{what}.shape", out.shape, case.out_shape)
    comparison, finding = judged(
        subject, case, out, q, k, v, truth=truth, pieces=pieces, diagnosable=diagnosable
    )
    assert_within_budget(subject, case, what, comparison, finding)
    return comparison


def assert_empty_rows(subject, case: Case, what: str, rows: np.ndarray) -> None:
    """``rows`` (of query rows that see no key) hold what the implementation declares."""
    __tracebackhide__ = True
    convention = subject.client.capabilities.empty_rows
    expected = np.zeros_like(rows) if convention == "zeros" else np.full_like(rows, np.nan)
    # Bit for bit against a constant: a row with no key computes nothing to round.
    assert_identical(
        subject, case, f"{what} (it declares empty_rows={convention!r})", rows, expected
    )


def blind_rows_of(case: Case) -> np.ndarray:
    """(B, H, Tq): the rows that see no key under the case's mask and the rest."""
    _, blind = keys_read_and_blind_rows(case.tq, case.tk, causal=case.causal, heads=case.heads,
                                        **case.formula_variant)  # fmt: skip
    return np.broadcast_to(blind, case.q_shape[:-1])


def assert_output_and_empty_rows(subject, case: Case, out, q, k, v, blind) -> None:
    """``out`` against the truth, its rows that see no key (``blind``, (B, H, Tq)) against the
    declared convention: within budget (a failure diagnosed), then those rows bit for bit."""
    __tracebackhide__ = True
    if not blind.any():
        assert_matches_oracle(subject, case, out, q, k, v)
        return
    truth = CaseTruth(q, k, v).attention(causal=case.causal, scale=case.scale,
                                         **case.formula_variant)  # fmt: skip
    empty = 0.0 if subject.client.capabilities.empty_rows == "zeros" else np.nan
    truth = np.where(blind[..., None], empty, truth)
    assert_matches_oracle(subject, case, out, q, k, v, truth=truth)
    assert_empty_rows(subject, case, f"the {int(blind.sum())} rows that see no key", out[blind])
