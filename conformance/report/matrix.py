"""The report as text: the claim x implementation matrix and each failed claim's first failure,
rendered from the JSON report's data (``attnspec run`` prints both; the HTML report shows the
matrix)."""

from __future__ import annotations

import textwrap

from conformance.report.tables import text_table
from conformance.run.ledger import ClaimVerdict, RowVerdict
from spec.catalogue import Level, load_catalogue

CELL = {
    ClaimVerdict.MET: "pass",
    ClaimVerdict.FAILED: "FAIL",
    ClaimVerdict.UNMET: "unmet",
    ClaimVerdict.NOT_CHECKED: "skip",
}

MATRIX_WIDTH = 100


def explains_verdict(entry: dict) -> bool:
    """Whether a claim's worst error against its budget explains its verdict: how close a met
    claim came, or by how much a failed one missed. A claim that failed otherwise (an exception,
    a wrong shape) shows none: beside FAIL, a number within budget would read as a pass."""
    fraction = entry.get("worst_budget_fraction")
    if fraction is None or entry["verdict"] == ClaimVerdict.NOT_CHECKED:
        return False
    return entry["verdict"] != ClaimVerdict.FAILED or not fraction <= 1


def matrix_lines(report: dict, width: int = MATRIX_WIDTH) -> list[str]:
    """The claim x implementation matrix, at most ``width`` columns wide: one row per claim
    (failed MUST claims first), one column per subject that ran, each cell pass / FAIL / unmet /
    skip[n] / - (no test of that claim for it), with the worst error as a fraction of the
    tolerance budget where the claim measures one. Subjects that did not run are folded into
    one line naming them and why; skip reasons follow as numbered notes. Columns that do not
    fit go to a further block."""
    ran = [s for s in report["subjects"] if s["verdict"] != RowVerdict.NOT_RUN]
    not_run = [s for s in report["subjects"] if s["verdict"] == RowVerdict.NOT_RUN]
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
        if entry["verdict"] == ClaimVerdict.FAILED
    }
    order = {level: n for n, level in enumerate(Level)}
    position = {claim.id: n for n, claim in enumerate(load_catalogue())}
    claim_ids.sort(key=lambda c: (c not in failing, order.get(levels[c], 3), position.get(c, 99)))
    reasons: list[str] = []

    def cell(entry: dict | None) -> str:
        if entry is None:
            return "-"
        text = CELL[entry["verdict"]]
        if entry["verdict"] == ClaimVerdict.NOT_CHECKED and entry["skip_reasons"]:
            reason = entry["skip_reasons"][0]
            if reason not in reasons:
                reasons.append(reason)
            text += f"[{reasons.index(reason) + 1}]"
        if explains_verdict(entry):
            fraction = entry["worst_budget_fraction"]
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
        rows = [["claim"] + [c[0] for c in block]]
        rows += [[label] + [c[1][i] for c in block] for i, label in enumerate(labels)]
        rows += [["verdict"] + [c[2] for c in block]]
        lines += [*text_table(rows, rule_after=(0, len(labels))), ""]
    lines.pop()
    lines += legend
    for i, reason in enumerate(reasons, 1):
        lines += textwrap.wrap(
            f"[{i}] {reason}", width, subsequent_indent="    ", break_on_hyphens=False
        )
    if not_run:
        text = "not run here: " + "; ".join(
            f"{s['name']} ({s.get('skip_reason') or 'no test ran'})" for s in not_run
        )
        lines += textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False)
    lines += textwrap.wrap(
        "cells: pass/FAIL/unmet (a SHOULD not met)/skip[n] (not checked, reason n)/- (no test); "
        "x.xx = worst error / tolerance budget (<= 1 passes; beside FAIL only when over 1)",
        width,
        subsequent_indent="  ",
    )
    return lines
