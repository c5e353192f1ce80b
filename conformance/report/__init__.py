"""What a run says, rendered from what it recorded: the header, the matrix, the JSON and HTML
reports."""

from __future__ import annotations

from conformance.report.header import workers_confinement
from conformance.report.json_report import build_report, write_report
from conformance.report.verdicts import verdict_lines
from conformance.run.ledger import Ledger
from conformance.run.selection import Selected
from conformance.run.settings import REPORTED_ENV, RunSettings


def report_of(
    ledger: Ledger, selection: list[Selected], settings: RunSettings, exit_status: int
) -> dict:
    """The run's report, in the JSON report's shape."""
    return build_report(
        ledger,
        selection,
        seed=settings.seed,
        hypothesis_profile=settings.hypothesis_profile,
        exit_status=exit_status,
        reported_env=REPORTED_ENV,
        workers={"sandbox": workers_confinement(settings, selection), **settings.workers_plain()},
    )


def summary_lines(ledger: Ledger, selection: list[Selected], settings: RunSettings) -> list[str]:
    """The verdict per implementation, as the terminal shows it."""
    return verdict_lines(report_of(ledger, selection, settings, exit_status=0))


def write_reports(
    ledger: Ledger, selection: list[Selected], settings: RunSettings, exit_status: int
) -> None:
    """The JSON and HTML reports the run was asked for."""
    if settings.report_json is None and settings.report_html is None:
        return
    report = report_of(ledger, selection, settings, exit_status)
    if settings.report_json is not None:
        write_report(settings.report_json, report)
    if settings.report_html is not None:
        from conformance.report.html import write_html  # matplotlib only when asked for

        write_html(settings.report_html, report, ledger.figures)
