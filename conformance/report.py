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
                               "failing_tests": [node ids], "skip_reasons": [...]}}}
      ]
    }

A field is only ever added to this schema; a change in meaning bumps the version.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from conformance.selection import Selected
from conformance.verdicts import MATHEMATICS, Ledger
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


def matrix_lines(report: dict) -> list[str]:
    """The claim x implementation matrix: one row per claim (failed MUST claims first), one column
    per subject, each cell pass / FAIL / unmet / skip[n] / - (no test of that claim for it), with
    the worst error as a fraction of the tolerance budget where the claim measures one. Skip
    reasons follow as numbered notes."""
    subjects = report["subjects"]
    claim_ids: list[str] = []
    levels: dict[str, str] = {}
    for subject in subjects:
        for claim, entry in subject["claims"].items():
            if claim not in levels:
                claim_ids.append(claim)
                levels[claim] = entry["level"] or "?"
    failing = {
        claim
        for subject in subjects
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

    rows = [
        [f"{claim} ({levels[claim]})"] + [cell(s["claims"].get(claim)) for s in subjects]
        for claim in claim_ids
    ]
    header = ["claim"] + [s["name"] for s in subjects]
    footer = ["verdict"] + [s["verdict"] for s in subjects]
    widths = [max(len(row[i]) for row in [header, footer, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = (text.ljust(width) for text, width in zip(row, widths, strict=True))
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    lines = [line(header), rule, *map(line, rows), rule, line(footer)]
    lines += [f"[{i}] {reason}" for i, reason in enumerate(reasons, 1)]
    lines.append(
        "cells: pass/FAIL/unmet (a SHOULD not met)/skip[n] (not checked, reason n)/- (no test); "
        "x.xx = worst error / tolerance budget (<= 1 passes)"
    )
    return lines
