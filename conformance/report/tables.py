"""The one table renderer: rows of cells in aligned columns, as plain text or as Markdown."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(
    rows: Sequence[Sequence[str]], *, right: Sequence[int] = (), rule_after: Sequence[int] = ()
) -> list[str]:
    """Lines of ``rows`` (the first is the header) in columns two spaces apart, each as wide as
    its widest cell; columns whose index is in ``right`` align right (numbers); a rule of dashes
    follows each row index in ``rule_after``. Trailing spaces are dropped."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    lines = []
    for index, row in enumerate(rows):
        lines.append(line(row))
        if index in rule_after:
            lines.append(rule)
    return lines


def markdown_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a Markdown table; the first row is the header."""
    header, *body = rows
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines
