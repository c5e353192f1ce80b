"""The ecosystem table: what the suite says of the attention people call from popular libraries.

``python -m conformance.report.ecosystem REPORT.json [REPORT.json ...] --write docs/ecosystem.md``
reads the JSON reports of runs over the adapters (impls/ecosystem) and writes the page: per
adapter, its library's version, its verdict per claim group, its worst error against the budget
per dtype and the conventions it followed; then every finding (impls/ecosystem/findings.py), each
with a reproducer that uses the library alone.

Every test an adapter fails (of a MUST claim) or leaves unmet (a SHOULD) must be explained by a
finding, a real deviation or a convention the library documents. One that is not is listed and the
command exits 1: the page is never written with an unexplained verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from conformance.report.json_report import SCHEMA
from conformance.report.tables import markdown_table
from impls.ecosystem.findings import FINDINGS, Finding, test_name
from impls.registry import ECOSYSTEM
from spec.catalogue import load_catalogue

DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16")
NOT_EXPLAINED = 1
READABLE_SCHEMAS = ("attnspec-report/1", SCHEMA)  # version 2 only added fields


def load_subjects(paths: list[Path]) -> dict[str, dict]:
    """Adapter name -> its subject entry, from every report given (a later one wins)."""
    subjects = {}
    for path in paths:
        report = json.loads(path.read_text())
        if report.get("schema") not in READABLE_SCHEMAS:
            raise ValueError(
                f"{path}: schema {report.get('schema')!r}, but should be one of "
                + ", ".join(READABLE_SCHEMAS)
            )
        for subject in report["subjects"]:
            if subject["name"] in ECOSYSTEM:
                subjects[subject["name"]] = subject
    return subjects


def failing_tests(subject: dict, claims=None) -> list[tuple[str, str]]:
    """(claim, test node id) of every test the subject failed or left unmet, in ``claims``."""
    return [
        (claim, test)
        for claim, entry in subject["claims"].items()
        if entry["verdict"] in ("FAILED", "unmet") and (claims is None or claim in claims)
        for test in entry.get("failing_tests", ())
    ]


def findings_of(name: str, test: str) -> list[int]:
    """The numbers (1-based) of the findings that explain adapter ``name`` failing ``test``."""
    return [n for n, finding in enumerate(FINDINGS, 1) if finding.explains(name, test)]


def unexplained(subjects: dict[str, dict]) -> list[str]:
    return [
        f"{name}: {claim} {test_name(test, name)}"
        for name, subject in subjects.items()
        for claim, test in failing_tests(subject)
        if not findings_of(name, test)
    ]


def group_cell(subject: dict, claims: list[str]) -> str:
    """pass, FAIL n (n: the findings), unmet n, or - where nothing in the group was checked."""
    verdicts = {c: subject["claims"][c]["verdict"] for c in claims if c in subject["claims"]}
    for verdict, word in (("FAILED", "FAIL"), ("unmet", "unmet")):
        failing = [c for c, v in verdicts.items() if v == verdict]
        if failing:
            numbers = sorted(
                {
                    n
                    for _, test in failing_tests(subject, failing)
                    for n in findings_of(subject["name"], test)
                }
            )
            return f"{word} " + ",".join(f"[{n}]" for n in numbers)
    if any(v == "met" for v in verdicts.values()):
        return "pass"
    return "-"


def budget_cell(subject: dict) -> str:
    fractions = subject.get("worst_budget_fraction_by_dtype", {})
    return (
        " ".join(
            f"{dtype.replace('float', 'f').replace('bf16', 'bf16')} {fractions[dtype]:.2f}"
            for dtype in DTYPE_ORDER
            if dtype in fractions
        )
        or "-"
    )


def page(subjects: dict[str, dict], command: str) -> str:
    catalogue = load_catalogue()
    groups: dict[str, list[str]] = {}
    for claim in catalogue:
        if claim.checked_on in ("implementations", "both"):
            groups.setdefault(claim.group, []).append(claim.id)
    header = ["adapter", "library", "verdict", *groups, "worst of budget", "conventions"]
    rows = []
    for name in ECOSYSTEM:
        subject = subjects.get(name)
        if subject is None:
            continue
        if subject["verdict"] == "NOT RUN":
            rows.append(
                [
                    f"`{name}`",
                    subject["version"],
                    "not run",
                    *["-"] * len(groups),
                    "-",
                    subject.get("skip_reason") or "",
                ]
            )
            continue
        conventions = ", ".join(f"{k}={v}" for k, v in subject["conventions"].items()) or "-"
        rows.append(
            [
                f"`{name}`",
                subject["version"],
                subject["verdict"],
                *(group_cell(subject, claims) for claims in groups.values()),
                budget_cell(subject),
                conventions,
            ]
        )
    lines = [
        "# The ecosystem table",
        "",
        "What attnspec says of the attention that popular libraries ship, called the way each "
        "library's documentation shows (`impls/ecosystem`). `*_naive` is that documented call; "
        "`*_bridged` is the same call with the smallest change that meets the contract, where the "
        "library's convention differs from it. Generated by",
        "",
        f"    {command}",
        "",
        "A cell names the findings below that explain a FAIL (a MUST claim) or an unmet SHOULD; "
        "every one is explained, or this page is not written. *worst of budget* is the largest "
        "error against the tolerance budget in any test of that dtype (1 is the budget).",
        "",
        *markdown_table([header, *rows]),
        "",
        "## Findings",
        "",
        "Each reproducer uses the library alone and asserts what it shows.",
        "",
    ]
    for number, finding in enumerate(FINDINGS, 1):
        lines += finding_section(number, finding)
    return "\n".join(lines).rstrip() + "\n"


def finding_section(number: int, finding: Finding) -> list[str]:
    adapters = ", ".join(f"`{a}`" for a in finding.adapters)
    return [
        f"**[{number}] {finding.summary}** ({finding.kind}; {adapters})",
        "",
        "```python",
        finding.reproducer.strip(),
        "```",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.report.ecosystem",
        description="Write the ecosystem table from the JSON reports of runs over the adapters.",
    )
    parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    parser.add_argument(
        "--write", type=Path, metavar="PATH", help="where to write the page (default: print it)"
    )
    parser.add_argument(
        "--command",
        metavar="TEXT",
        default="(the run's command)",
        help="the command that produced the reports, quoted on the page (default: %(default)s)",
    )
    options = parser.parse_args(argv)
    for path in options.reports:
        if not path.is_file():
            parser.error(f"{path}: no such report")
    subjects = load_subjects(options.reports)
    if not subjects:
        parser.error("the reports judge none of the ecosystem's adapters")
    missing = unexplained(subjects)
    if missing:
        print("claims failed or unmet that no finding explains:", file=sys.stderr)
        for line in missing:
            print(f"  {line}", file=sys.stderr)
        return NOT_EXPLAINED
    text = page(subjects, options.command)
    if options.write:
        options.write.parent.mkdir(parents=True, exist_ok=True)
        options.write.write_text(text)
        print(f"wrote {options.write} ({len(subjects)} adapters, {len(FINDINGS)} findings)")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
