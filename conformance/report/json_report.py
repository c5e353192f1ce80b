"""The machine-readable report: one JSON document per run, under a versioned schema.

Schema ``attnspec-report/1``::

    {
      "schema": "attnspec-report/1",
      "exit_status": 0,                      # pytest's exit status of the run
      "environment": {"python": ..., "platform": ..., "seed": ..., "hypothesis_profile": ...,
                      "env": {NAME: value, ...}},
      "subjects": [                          # "(mathematics)" first, then each implementation
        {"name": ..., "selector": ...,       # what --impl takes to select it again (null: maths)
         "version": ..., "device": ..., "family": ..., "capabilities": ...,
         "skip_reason": null | "...",        # why it could not run here
         "verdict": "conforms" | "FAILS" | "NOT RUN",
         "claims": {CLAIM_ID: {"level": "MUST" | "SHOULD" | "INFO",
                               "verdict": "met" | "FAILED" | "unmet" | "not checked",
                               "passed": n, "failed": n, "unmet": n, "skipped": n,
                               "worst_budget_fraction": null | x,  # error / tolerance budget,
                                                      # the largest in the claim's tests (<= 1 ok)
                               "failing_tests": [node ids], "skip_reasons": [...],
                               "first_failure": null | {"test": node id,
                                                        "message": "...",  # truncated
                                                        "reproducer": null | "python -m ..."}}},
         "conventions": {NAME: VALUE}},      # the CONTRACT-ERRORS conventions it followed
      ]
    }

A field is only ever added to this schema; a change in meaning bumps the version.
"""

from __future__ import annotations

import json
import os
import platform
import textwrap
from pathlib import Path

from conformance.run.ledger import MATHEMATICS, Ledger
from conformance.run.selection import Selected
from spec.catalogue import load_catalogue

SCHEMA = "attnspec-report/1"


def subject_entry(ledger: Ledger, name: str, selected: Selected | None) -> dict:
    claims = {}
    for claim, rec in sorted(ledger.verdicts(name).items()):
        claims[claim] = {
            "level": ledger.catalogue[claim].level if claim in ledger.catalogue else None,
            "verdict": rec.verdict,
            "passed": rec.passed,
            "failed": rec.failed,
            "unmet": rec.unmet,
            "skipped": rec.skipped,
            "worst_budget_fraction": rec.worst_budget_fraction,
            "failing_tests": list(rec.failing_tests),
            "first_failure": rec.first_failure,
            "skip_reasons": sorted(rec.skip_reasons),
        }
    entry = {"name": name, "selector": None, "verdict": ledger.subject_verdict(name)}
    if selected is not None:
        impl = selected.impl
        entry.update(
            selector=selected.selector,
            version=impl.version(),
            device=impl.device,
            family=impl.family,
            capabilities=impl.capabilities.describe(),
            skip_reason=selected.skip_reason,
        )
    entry["conventions"] = ledger.conventions_followed(name)
    entry["claims"] = claims
    return entry


def build_report(
    ledger: Ledger,
    selection: list[Selected],
    *,
    seed: int,
    hypothesis_profile: str | None,
    exit_status: int,
    reported_env: tuple[str, ...],
) -> dict:
    by_name = {s.impl.name: s for s in selection}
    names = ([MATHEMATICS] if ledger.verdicts(MATHEMATICS) else []) + list(by_name)
    return {
        "schema": SCHEMA,
        "exit_status": int(exit_status),
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "seed": seed,
            "hypothesis_profile": hypothesis_profile,
            "env": {name: os.environ[name] for name in reported_env if name in os.environ},
        },
        "subjects": [subject_entry(ledger, name, by_name.get(name)) for name in names],
    }


def report_path_problem(path: Path) -> str | None:
    """Why a report cannot be written to ``path``, or None: checked before the run, so that a
    typo never costs the run's verdict."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return "is a directory; give a file name"
    if not parent.exists():
        # Walk up to say which part is missing or is a file.
        for ancestor in [parent, *parent.parents]:
            if ancestor.exists():
                if not ancestor.is_dir():
                    return f"{ancestor} is a file, not a directory"
                break
        return f"directory {parent} does not exist; create it first"
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    if not os.access(parent, os.W_OK):
        return f"directory {parent} is not writable"
    return None


def write_report(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n", encoding="utf-8")


CELL = {"met": "pass", "FAILED": "FAIL", "unmet": "unmet", "not checked": "skip"}


MATRIX_WIDTH = 100


def matrix_lines(report: dict, width: int = MATRIX_WIDTH) -> list[str]:
    """The claim x implementation matrix, at most ``width`` columns wide: one row per claim
    (failed MUST claims first), one column per subject that ran, each cell pass / FAIL / unmet /
    skip[n] / - (no test of that claim for it), with the worst error as a fraction of the
    tolerance budget where the claim measures one. Subjects that did not run are folded into
    one line naming them and why; skip reasons follow as numbered notes. Columns that do not
    fit go to a further block."""
    ran = [s for s in report["subjects"] if s["verdict"] != "NOT RUN"]
    not_run = [s for s in report["subjects"] if s["verdict"] == "NOT RUN"]
    claim_ids: list[str] = []
    levels: dict[str, str] = {}
    for subject in ran:
        for claim, entry in subject["claims"].items():
            if claim not in levels:
                claim_ids.append(claim)
                levels[claim] = entry["level"] or "?"
    failing = {
        claim
        for subject in ran
        for claim, entry in subject["claims"].items()
        if entry["verdict"] == "FAILED"
    }
    order = {"MUST": 0, "SHOULD": 1, "INFO": 2}
    position = {claim.id: n for n, claim in enumerate(load_catalogue())}
    claim_ids.sort(key=lambda c: (c not in failing, order.get(levels[c], 3), position.get(c, 99)))
    reasons: list[str] = []

    def cell(entry: dict | None) -> str:
        if entry is None:
            return "-"
        text = CELL[entry["verdict"]]
        if entry["verdict"] == "not checked" and entry["skip_reasons"]:
            reason = entry["skip_reasons"][0]
            if reason not in reasons:
                reasons.append(reason)
            text += f"[{reasons.index(reason) + 1}]"
        fraction = entry.get("worst_budget_fraction")
        if fraction is not None and entry["verdict"] != "not checked":
            text += f" {fraction:.2f}" if fraction < 100 else f" {fraction:.0e}"
        return text

    labels = [f"{claim} ({levels[claim]})" for claim in claim_ids]
    label_width = max([len(label) for label in labels] + [len("verdict")])
    columns = []  # (header, cells, verdict)
    for subject in ran:
        cells = [cell(subject["claims"].get(claim)) for claim in claim_ids]
        columns.append((subject["name"], cells, subject["verdict"]))
    legend: list[str] = []

    def column_width(header: str, cells: list[str], verdict: str) -> int:
        return max(len(header), len(verdict), *(len(c) for c in cells))

    if label_width + sum(2 + column_width(*c) for c in columns) > width:
        # Long names would push the matrix wide: number the columns and name them below.
        legend = [f"({n}) {name}" for n, (name, _, _) in enumerate(columns, 1)]
        columns = [(f"({n})", cells, v) for n, (_, cells, v) in enumerate(columns, 1)]
    blocks: list[list[tuple[str, list[str], str]]] = [[]]
    used = label_width
    for column in columns:
        needed = 2 + column_width(*column)
        if blocks[-1] and used + needed > width:
            blocks.append([])
            used = label_width
        blocks[-1].append(column)
        used += needed
    lines: list[str] = []
    for block in blocks:
        widths = [label_width] + [column_width(*c) for c in block]

        def line(row: list[str], widths=widths) -> str:
            return "  ".join(t.ljust(w) for t, w in zip(row, widths, strict=True)).rstrip()

        rule = "  ".join("-" * w for w in widths)
        lines += [line(["claim"] + [c[0] for c in block]), rule]
        lines += [line([label] + [c[1][i] for c in block]) for i, label in enumerate(labels)]
        lines += [rule, line(["verdict"] + [c[2] for c in block]), ""]
    lines.pop()
    lines += legend
    lines += [f"[{i}] {reason}" for i, reason in enumerate(reasons, 1)]
    if not_run:
        text = "not run here: " + "; ".join(
            f"{s['name']} ({s.get('skip_reason') or 'no test ran'})" for s in not_run
        )
        lines += textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False)
    lines += textwrap.wrap(
        "cells: pass/FAIL/unmet (a SHOULD not met)/skip[n] (not checked, reason n)/- (no test); "
        "x.xx = worst error / tolerance budget (<= 1 passes)",
        width,
        subsequent_indent="  ",
    )
    return lines


def failure_lines(report: dict) -> list[str]:
    """For each implementation that fails, each failed claim's first failure and reproducer."""
    lines = []
    for subject in report["subjects"]:
        for claim, entry in subject["claims"].items():
            failure = entry.get("first_failure")
            if entry["verdict"] != "FAILED" or not failure:
                continue
            message = failure["message"].splitlines()
            lines.append(f"{subject['name']} fails {claim}: {message[0] if message else ''}")
            if failure["reproducer"]:
                lines.append(f"  reproduce: {failure['reproducer']}")
    return lines
