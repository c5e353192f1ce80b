"""From one test's report to the run's ledger: what the judge noted during the test travels on
its report (through pytest-xdist too) as one record, and the controller's recorder adds it up.

A test whose claims do not fail the run (SHOULD, INFO; see ``Claim.fails_run``) and that fails
is reported as an expected failure: its claim is *unmet*, not failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pytest

from conformance.run.collection import (
    claims_of,
    is_conformance_test,
    judged_name,
    row_of,
    suite_test_id,
)
from conformance.run.ledger import Ledger, TestOutcome, worst_fraction
from conformance.run.worker_clients import (
    ImplementationBroke,
    ImplementationDied,
    ImplementationRaised,
)
from spec.catalogue import Catalogue, Level

RECORD_ATTRIBUTE = "attnspec"  # the report attribute that carries a TestRecord's fields


@dataclass
class TestNotes:
    """What the judge noted while one test ran."""

    __test__ = False  # not a pytest test class

    budget_fraction: float | None = None  # the largest error / tolerance budget judged
    budget_fractions_by_dtype: dict[str, float] = field(default_factory=dict)  # the same, per dtype
    conventions: dict[str, str] = field(default_factory=dict)  # convention -> value followed
    figures: dict[str, object] = field(default_factory=dict)  # name -> data for the HTML report
    # what the judge found in each failing comparison (conformance.judge.diagnosis.diagnose)
    findings: list[dict] = field(default_factory=list)
    broken: str | None = None  # why the implementation's first call broke the contract
    regimes: list[str] = field(default_factory=list)  # spec.regimes its calls drew, sorted

    def note_budget_fraction(self, fraction: float, dtype: str) -> None:
        self.budget_fraction = worst_fraction(self.budget_fraction, fraction)
        self.budget_fractions_by_dtype[dtype] = worst_fraction(
            self.budget_fractions_by_dtype.get(dtype), fraction
        )

    def note_convention(self, convention: str, followed: str) -> None:
        self.conventions[convention] = followed

    def note_figure(self, name: str, data: object) -> None:
        self.figures.setdefault(name, data)

    def note_regimes(self, regimes: set[str]) -> None:
        self.regimes = sorted(set(self.regimes) | regimes)

    def note_finding(self, finding: dict) -> None:
        self.findings.append(finding)


NOTES_KEY = pytest.StashKey[TestNotes]()


@dataclass
class TestRecord:
    """One test's contribution to the ledger."""

    __test__ = False  # not a pytest test class

    row: str
    claims: list[str]
    notes: TestNotes
    test_id: str  # as the checkout names it, whatever the rootdir (collection.suite_test_id)
    unmet_level: str | None = None  # a Level, SHOULD or INFO, when it failed an expected way

    def attach(self, report: pytest.TestReport) -> None:
        # Plain data, so that pytest-xdist carries it from its workers to the controller.
        setattr(report, RECORD_ATTRIBUTE, asdict(self))

    @classmethod
    def of(cls, report: pytest.TestReport) -> TestRecord | None:
        data = getattr(report, RECORD_ATTRIBUTE, None)
        if data is None:
            return None
        return cls(**{**data, "notes": TestNotes(**data["notes"])})


def tolerated_level(
    claim_ids: list[str], catalogue: Catalogue, fail_on_should: bool
) -> Level | None:
    """SHOULD or INFO when no claim of a failing test fails the run, else None."""
    claims = [catalogue[c] for c in claim_ids if c in catalogue]
    if not claims or any(claim.fails_run(fail_on_should) for claim in claims):
        return None
    return Level.SHOULD if any(claim.level == Level.SHOULD for claim in claims) else Level.INFO


IMPLEMENTATION_FAILURES = (ImplementationRaised, ImplementationBroke, ImplementationDied)


def implementation_failure_text(error: Exception, reproducer: Callable[[], str] | None) -> str:
    """The implementation's failure, not the judge's: its words and how to reproduce them,
    without the judge's frames."""
    text = str(error)
    if isinstance(error, ImplementationRaised) and error.trace:
        text += "\n" + error.trace.rstrip()
    if reproducer is not None:
        text += f"\nreproduce: {reproducer()}"
    return text


def message_only_failure(error: Exception, reproducer: Callable[[], str] | None) -> BaseException:
    """The failure a test that ended on ``error`` (one of IMPLEMENTATION_FAILURES) raises to
    pytest: a message-only ``pytest.fail``, since the judge's frames are never shown and pytest
    formats a traceback by parsing the source of each frame (14 of 33 CPU-s of a run where twelve
    implementations fail every test, before this). Hypothesis' notes go with it."""
    failure = pytest.fail.Exception(implementation_failure_text(error, reproducer), pytrace=False)
    if hasattr(error, "__notes__"):
        failure.__notes__ = error.__notes__
    return failure


def complete_report(
    item: pytest.Item,
    call: pytest.CallInfo,
    report: pytest.TestReport,
    catalogue: Catalogue,
    fail_on_should: bool,
    reproducer: Callable[[], str] | None,
    output: str,
) -> pytest.TestReport:
    """Finish a conformance test's report: the implementation's own words where it failed, its
    worker's output where the test failed, the judge's notes, and the SHOULD/INFO policy."""
    if report.when == "call" and output and report.failed:
        name = judged_name(item)
        report.sections.append((f"output of {name} (its worker's stdout and stderr)", output))
    if call.excinfo is not None and isinstance(call.excinfo.value, IMPLEMENTATION_FAILURES):
        # Outside a test's call (the test's own call raises message_only_failure instead).
        report.longrepr = implementation_failure_text(call.excinfo.value, reproducer)
    if not is_conformance_test(item) or not decides_the_outcome(report):
        # The ledger reads no other report: a record on each of the three would cost a copy of
        # the judge's notes, and xdist would carry it to the controller, for nothing.
        return report
    claims = claims_of(item)
    record = TestRecord(
        row_of(item), claims, item.stash.get(NOTES_KEY, None) or TestNotes(), suite_test_id(item)
    )
    if report.when == "call" and report.failed and claims:
        notes = getattr(call.excinfo.value, "__notes__", None) if call.excinfo else None
        if notes:
            # A message-only failure does not print the exception's notes, where hypothesis
            # puts the falsifying example and its @reproduce_failure blob.
            report.sections.append(("exception notes (hypothesis)", "\n".join(notes)))
        level = tolerated_level(claims, catalogue, fail_on_should)
        if level:
            first_line = str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""
            report.outcome = "skipped"
            report.wasxfail = f"{level} claim not met: {first_line}"
            record.unmet_level = level.value  # plain data, which xdist carries
    record.attach(report)
    return report


def decides_the_outcome(report: pytest.TestReport) -> bool:
    """The report that says how a test ended: its call's, or its setup's where the setup did not
    pass (a skip, an error) and there was no call."""
    return report.when == "call" or (report.when == "setup" and not report.passed)


def outcome_of(report: pytest.TestReport, record: TestRecord) -> TestOutcome:
    if record.unmet_level:
        return TestOutcome.UNMET
    if report.skipped:
        return TestOutcome.SKIPPED
    return TestOutcome(report.outcome)


class VerdictRecorder:
    """Feeds every test report into the run's :class:`Ledger` and prints its summary; on the
    xdist controller, or in a run without xdist."""

    def __init__(
        self,
        ledger: Ledger,
        finish: Callable[[pytest.Session], None],
        summarise: Callable[[], list[str]],
    ):
        self.ledger = ledger
        self.finish = finish  # writes the reports, once the exit status is known
        self.summarise = summarise  # the verdict per implementation (conformance.report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = TestRecord.of(report)  # complete_report gives one to the deciding report alone
        if record is None:
            return
        outcome = outcome_of(report, record)
        reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        message = report.longreprtext if outcome in (TestOutcome.FAILED, TestOutcome.UNMET) else ""
        self.ledger.record(
            record.row,
            record.claims,
            outcome,
            record.test_id,
            reason,
            record.notes.budget_fraction,
            message,
            record.notes.findings,
        )
        for dtype, fraction in record.notes.budget_fractions_by_dtype.items():
            self.ledger.note_budget_fraction(record.row, dtype, fraction)
        for convention, followed in record.notes.conventions.items():
            self.ledger.note_convention(record.row, convention, followed)
        for name, data in record.notes.figures.items():
            self.ledger.note_figure(record.row, name, data)
        for regime in record.notes.regimes:
            self.ledger.note_regime(record.row, regime, record.test_id)
        if record.notes.broken:
            self.ledger.broken[record.row] = record.notes.broken

    def nothing_checked(self) -> bool:
        """Every selected implementation was skipped: a green run would claim conformance that
        nothing showed."""
        return self.ledger.implementations_checked() == 0 and bool(
            self.ledger.implementation_records()
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.nothing_checked():
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        self.finish(session)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.ledger.records:
            return
        terminalreporter.section("attnspec: verdict per implementation")
        for line in self.summarise():
            terminalreporter.write_line(line)
        if self.nothing_checked():
            terminalreporter.write_line(
                "attnspec: nothing was checked: every selected implementation was skipped "
                "(exit status 5)",
                red=True,
            )
