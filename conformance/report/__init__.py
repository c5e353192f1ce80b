"""What a run says, rendered from what it recorded: the header, the matrix, the JSON and HTML
reports."""

from __future__ import annotations

from conformance.report.json_report import build_report, write_report
from conformance.run.ledger import Ledger
from conformance.run.selection import Selected
from conformance.run.settings import REPORTED_ENV, RunSettings


def write_reports(
    ledger: Ledger, selection: list[Selected], settings: RunSettings, exit_status: int
) -> None:
    """The JSON and HTML reports the run was asked for."""
    if settings.report_json is None and settings.report_html is None:
        return
    report = build_report(
        ledger,
        selection,
        seed=settings.seed,
        hypothesis_profile=settings.hypothesis_profile,
        exit_status=exit_status,
        reported_env=REPORTED_ENV,
    )
    if settings.report_json is not None:
        write_report(settings.report_json, report)
    if settings.report_html is not None:
        from conformance.report.html import write_html  # matplotlib only when asked for

        write_html(settings.report_html, report, ledger.figures)
