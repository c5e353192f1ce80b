"""Per-implementation, per-claim verdicts, gathered from test outcomes.

A claim is *met* by an implementation when at least one of its tests ran and none failed, *failed*
when any failed, and *not checked* when every test was skipped (the reasons are kept). A SHOULD
claim that fails is *unmet*: reported, but not a failure of the run unless ``--fail-on-should``.

The three vocabularies below are the only spelling of outcomes and verdicts: the terminal
summary, the matrix, the JSON report and the HTML report all use them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum

from spec.catalogue import Catalogue

MATHEMATICS = "(mathematics)"  # the row for tests of the document itself, run once


class TestOutcome(StrEnum):
    """What one test said about its claims."""

    __test__ = False  # not a pytest test class

    PASSED = "passed"
    FAILED = "failed"
    UNMET = "unmet"  # a SHOULD (or INFO) claim's test failed: an expected failure
    SKIPPED = "skipped"


class ClaimVerdict(StrEnum):
    """What a row's tests of one claim add up to."""

    MET = "met"
    FAILED = "FAILED"
    UNMET = "unmet"
    NOT_CHECKED = "not checked"


class RowVerdict(StrEnum):
    """What a row (an implementation, or the document's mathematics) adds up to."""

    CONFORMS = "conforms"
    FAILS = "FAILS"
    NOT_RUN = "NOT RUN"


@dataclass(frozen=True)
class FirstFailure:
    """A claim's first failure as the report keeps it: the test, its message (without the
    reproducer line, truncated) and the reproducer line, where the message has one."""

    test: str
    message: str
    reproducer: str | None


@dataclass
class ClaimRecord:
    passed: int = 0
    failed: int = 0
    unmet: int = 0
    skipped: int = 0
    skip_reasons: set[str] = field(default_factory=set)
    failing_tests: list[str] = field(default_factory=list)
    worst_budget_fraction: float | None = None  # largest error / tolerance budget in its tests
    first_failure: FirstFailure | None = None
    # the judge's findings in its failing comparisons, each with its "test"; the report pools
    # them into the claim's diagnosis (conformance.judge.diagnosis.conclude)
    findings: list[dict] = field(default_factory=list)

    @property
    def verdict(self) -> ClaimVerdict:
        if self.failed:
            return ClaimVerdict.FAILED
        if self.unmet:
            return ClaimVerdict.UNMET
        if self.passed:
            return ClaimVerdict.MET
        return ClaimVerdict.NOT_CHECKED


def worst_fraction(current: float | None, new: float | None) -> float | None:
    """The larger of two budget fractions, None standing for none yet; a NaN wins, so that an
    error that cannot be compared is never hidden behind a finite one."""
    if new is None:
        return current
    return new if current is None or not new <= current else current


MESSAGE_KEPT = 2000  # characters of a failure message kept in the report


def failure_summary(test_id: str, message: str) -> FirstFailure:
    """A failure as the report keeps it (FirstFailure), read from its message."""
    # xdist starts a report's text with the worker's name and interpreter: not the failure's.
    lines = [line for line in message.strip().splitlines() if not re.match(r"\[gw\d+\] ", line)]
    reproducer = next((line for line in lines if line.startswith("reproduce: ")), None)
    text = "\n".join(line for line in lines if line is not reproducer)
    if len(text) > MESSAGE_KEPT:
        text = text[:MESSAGE_KEPT] + f" [... {len(text) - MESSAGE_KEPT} characters more]"
    return FirstFailure(
        test_id, text, reproducer.removeprefix("reproduce: ") if reproducer else None
    )


class Ledger:
    def __init__(self, catalogue: Catalogue, implementations: list[str]):
        self.catalogue = catalogue
        self.implementations = list(implementations)
        self.records: dict[tuple[str, str], ClaimRecord] = defaultdict(ClaimRecord)
        # row -> convention -> the values its answers followed (impls.contract.CONVENTIONS)
        self.conventions: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        # row -> figure name -> what a test recorded for it (a heat map, a measured series)
        self.figures: dict[str, dict[str, object]] = defaultdict(dict)
        # row -> dtype -> the largest error / tolerance budget of its tests in that dtype
        self.budget_fractions: dict[str, dict[str, float]] = defaultdict(dict)
        # row -> regime (spec.regimes) -> the tests whose calls drew it
        self.regimes: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        # implementation -> how its worker was confined, where not fully (impls.sandbox)
        self.unconfined: dict[str, str] = {}
        # implementation -> why its first call broke the contract (judge.preflight)
        self.broken: dict[str, str] = {}

    def note_budget_fraction(self, row: str, dtype: str, fraction: float) -> None:
        self.budget_fractions[row][dtype] = worst_fraction(
            self.budget_fractions[row].get(dtype), fraction
        )

    def note_figure(self, row: str, name: str, data: object) -> None:
        self.figures[row].setdefault(name, data)

    def note_regime(self, row: str, regime: str, test_id: str) -> None:
        self.regimes[row][regime].add(test_id)

    def note_convention(self, row: str, convention: str, followed: str) -> None:
        self.conventions[row][convention].add(followed)

    def conventions_followed(self, row: str) -> dict[str, str]:
        """convention -> the value followed ("raise/broadcast" where the answers differed)."""
        return {
            name: "/".join(sorted(values))
            for name, values in sorted(self.conventions.get(row, {}).items())
        }

    def record(
        self,
        row: str,
        claims: list[str],
        outcome: TestOutcome,
        test_id: str,
        reason: str = "",
        budget_fraction: float | None = None,
        message: str = "",
        findings: list[dict] = (),
    ):
        for claim in claims:
            entry = self.records[(row, claim)]
            entry.worst_budget_fraction = worst_fraction(
                entry.worst_budget_fraction, budget_fraction
            )
            if outcome == TestOutcome.PASSED:
                entry.passed += 1
            elif outcome in (TestOutcome.FAILED, TestOutcome.UNMET):
                if outcome == TestOutcome.FAILED:
                    entry.failed += 1
                else:
                    entry.unmet += 1
                entry.failing_tests.append(test_id)
                entry.findings += [{**finding, "test": test_id} for finding in findings]
                if entry.first_failure is None:
                    entry.first_failure = failure_summary(test_id, message)
            else:
                entry.skipped += 1
                if reason:
                    entry.skip_reasons.add(reason)

    def implementation_records(self) -> list[ClaimRecord]:
        return [rec for (row, _), rec in self.records.items() if row != MATHEMATICS]

    def implementations_checked(self) -> int:
        """How many implementations had at least one test run (not skipped)."""
        ran = {
            row
            for (row, _), rec in self.records.items()
            if row != MATHEMATICS and (rec.passed or rec.failed or rec.unmet)
        }
        return len(ran)

    def rows(self) -> list[str]:
        seen = {row for row, _ in self.records}
        ordered = [name for name in self.implementations if name in seen]
        return ([MATHEMATICS] if MATHEMATICS in seen else []) + ordered

    def verdicts(self, row: str) -> dict[str, ClaimRecord]:
        return {claim: rec for (name, claim), rec in self.records.items() if name == row}

    def row_verdict(self, row: str) -> RowVerdict:
        """FAILS when any claim failed, conforms when at least one was checked, else NOT RUN."""
        verdicts = {rec.verdict for rec in self.verdicts(row).values()}
        if ClaimVerdict.FAILED in verdicts:
            return RowVerdict.FAILS
        if verdicts & {ClaimVerdict.MET, ClaimVerdict.UNMET}:
            return RowVerdict.CONFORMS
        return RowVerdict.NOT_RUN
