"""The claim x implementation matrix, rendered from a report's data."""

from __future__ import annotations

from conformance.report.matrix import matrix_lines


def report_with(cells: dict[str, tuple[str, float | None]]) -> dict:
    """A report of one implementation whose claims have the given (verdict, budget fraction)."""
    claims = {
        claim: {
            "level": "MUST",
            "verdict": verdict,
            "worst_budget_fraction": fraction,
            "skip_reasons": [],
        }
        for claim, (verdict, fraction) in cells.items()
    }
    return {"subjects": [{"name": "k", "verdict": "FAILS", "claims": claims}]}


def cell_of(lines: list[str], claim: str) -> str:
    return next(line for line in lines if line.startswith(claim)).split("(MUST)")[1].strip()


def test_a_budget_fraction_is_shown_only_where_it_explains_the_verdict():
    lines = matrix_lines(
        report_with(
            {
                "OUT-FORMULA": ("met", 0.23),  # how close it came
                "OUT-AFFINE": ("FAILED", 3.5),  # by how much it missed
                "CONTRACT-ERRORS": ("FAILED", 0.23),  # failed by an exception: no number
                "OUT-CONVEX": ("FAILED", None),
            }
        )
    )
    assert cell_of(lines, "OUT-FORMULA") == "pass 0.23"
    assert cell_of(lines, "OUT-AFFINE") == "FAIL 3.50"
    assert cell_of(lines, "CONTRACT-ERRORS") == "FAIL"
    assert cell_of(lines, "OUT-CONVEX") == "FAIL"
