"""Per-implementation, per-claim verdicts, gathered from test reports.

A claim is *met* by an implementation when at least one of its tests ran and none failed, *failed*
when any failed, and *not checked* when every test was skipped (the reasons are kept). A SHOULD
claim that fails is *unmet*: reported, but not a failure of the run unless ``--strict``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from spec.catalogue import Catalogue

MATHEMATICS = "(mathematics)"  # the row for tests of the document itself, run once

MET, FAILED, UNMET, NOT_CHECKED = "met", "FAILED", "unmet", "not checked"


@dataclass
class ClaimRecord:
    passed: int = 0
    failed: int = 0
    unmet: int = 0
    skipped: int = 0
    skip_reasons: set[str] = field(default_factory=set)
    failing_tests: list[str] = field(default_factory=list)
    worst_budget_fraction: float | None = None  # largest error / tolerance budget in its tests
    first_failure: dict | None = None  # {"test", "message", "reproducer"} of its first failure

    @property
    def verdict(self) -> str:
        if self.failed:
            return FAILED
        if self.unmet:
            return UNMET
        if self.passed:
            return MET
        return NOT_CHECKED


MESSAGE_KEPT = 2000  # characters of a failure message kept in the report


def failure_summary(test_id: str, message: str) -> dict:
    """A failure as the report keeps it: the test, its message (without the reproducer line,
    truncated) and the reproducer line, where the message has one."""
    # xdist starts a report's text with the worker's name and interpreter: not the failure's.
    lines = [line for line in message.strip().splitlines() if not re.match(r"\[gw\d+\] ", line)]
    reproducer = next((line for line in lines if line.startswith("reproduce: ")), None)
    text = "\n".join(line for line in lines if line is not reproducer)
    if len(text) > MESSAGE_KEPT:
        text = text[:MESSAGE_KEPT] + f" [... {len(text) - MESSAGE_KEPT} characters more]"
    return {
        "test": test_id,
        "message": text,
        "reproducer": reproducer.removeprefix("reproduce: ") if reproducer else None,
    }


class Ledger:
    def __init__(self, catalogue: Catalogue, implementations: list[str]):
        self.catalogue = catalogue
        self.implementations = list(implementations)
        self.records: dict[tuple[str, str], ClaimRecord] = defaultdict(ClaimRecord)
        # subject -> convention -> the values its answers followed (impls.contract.CONVENTIONS)
        self.conventions: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))

    def note_convention(self, subject: str, convention: str, followed: str) -> None:
        self.conventions[subject][convention].add(followed)

    def conventions_followed(self, subject: str) -> dict[str, str]:
        """convention -> the value followed ("raise/broadcast" where the answers differed)."""
        return {
            name: "/".join(sorted(values))
            for name, values in sorted(self.conventions.get(subject, {}).items())
        }

    def record(
        self,
        subject: str,
        claims: list[str],
        outcome: str,
        test_id: str,
        reason: str = "",
        budget_fraction: float | None = None,
        message: str = "",
    ):
        for claim in claims:
            entry = self.records[(subject, claim)]
            if budget_fraction is not None and not (
                entry.worst_budget_fraction is not None
                and budget_fraction <= entry.worst_budget_fraction
            ):
                entry.worst_budget_fraction = budget_fraction
            if outcome == "passed":
                entry.passed += 1
            elif outcome in ("failed", "unmet"):
                if outcome == "failed":
                    entry.failed += 1
                else:
                    entry.unmet += 1
                entry.failing_tests.append(test_id)
                if entry.first_failure is None:
                    entry.first_failure = failure_summary(test_id, message)
            else:
                entry.skipped += 1
                if reason:
                    entry.skip_reasons.add(reason)

    def implementation_records(self) -> list[ClaimRecord]:
        return [rec for (subject, _), rec in self.records.items() if subject != MATHEMATICS]

    def implementations_checked(self) -> int:
        """How many implementations had at least one test run (not skipped)."""
        ran = {
            subject
            for (subject, _), rec in self.records.items()
            if subject != MATHEMATICS and (rec.passed or rec.failed or rec.unmet)
        }
        return len(ran)

    def subjects(self) -> list[str]:
        seen = {subject for subject, _ in self.records}
        ordered = [name for name in self.implementations if name in seen]
        return ([MATHEMATICS] if MATHEMATICS in seen else []) + ordered

    def verdicts(self, subject: str) -> dict[str, ClaimRecord]:
        return {claim: rec for (name, claim), rec in self.records.items() if name == subject}

    def subject_verdict(self, subject: str) -> str:
        """FAILS when any claim failed, conforms when at least one was checked, else NOT RUN."""
        verdicts = {rec.verdict for rec in self.verdicts(subject).values()}
        if FAILED in verdicts:
            return "FAILS"
        if verdicts & {MET, UNMET}:
            return "conforms"
        return "NOT RUN"

    def summary_lines(self) -> list[str]:
        lines = []
        width = max([len(s) for s in self.subjects()] + [10])
        for subject in self.subjects():
            by_verdict: dict[str, list[str]] = defaultdict(list)
            for claim, rec in sorted(self.verdicts(subject).items()):
                by_verdict[rec.verdict].append(claim)
            failed_must = by_verdict[FAILED]
            verdict = self.subject_verdict(subject)
            counts = ", ".join(
                f"{len(by_verdict[v])} {v}"
                for v in (MET, FAILED, UNMET, NOT_CHECKED)
                if by_verdict[v]
            )
            lines.append(f"{subject:<{width}}  {verdict:<8}  {counts}")
            followed = self.conventions_followed(subject)
            if followed:
                lines.append(
                    f"{'':<{width}}    conventions: "
                    + ", ".join(f"{name}={value}" for name, value in followed.items())
                )
            for label, claims in (("failed", failed_must), ("unmet", by_verdict[UNMET])):
                for claim in claims:
                    rec = self.records[(subject, claim)]
                    level = self.catalogue[claim].level if claim in self.catalogue else "?"
                    lines.append(
                        f"{'':<{width}}    {label} {level} {claim}: "
                        f"{rec.failed + rec.unmet} test(s), "
                        f"e.g. {rec.failing_tests[0]}"
                    )
            if verdict == "NOT RUN":
                reasons = sorted(
                    set().union(*(r.skip_reasons for r in self.verdicts(subject).values()))
                )
                for reason in reasons[:3]:
                    lines.append(f"{'':<{width}}    skipped: {reason}")
        return lines
