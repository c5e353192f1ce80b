"""The verdict per implementation as the terminal shows it: a failure a kernel author reads in
one screen.

Per failed claim: the count of failing tests, one message, the diagnosis (the catalogued mistake
the failing outputs match, or where their errors lie) and one reproducer, every line within
:data:`WIDTH` columns. An implementation whose first call broke the contract says so once. The
per-test detail stays in pytest's own output (``-v``) and in the JSON and HTML reports.
Rendered from the JSON report's subjects (:mod:`conformance.report.json_report`), so the
terminal and the reports cannot disagree.
"""

from __future__ import annotations

import re
import shlex
import textwrap

from conformance.judge.diagnosis import unmatched
from conformance.judge.tolerance import describe_fraction
from conformance.run.ledger import ClaimVerdict, RowVerdict

WIDTH = 100
NAME_WIDTH = 40  # an implementation's name beyond this gets a line of its own
INDENT = "  "
SKIP_REASONS_SHOWN = 3


def wrapped(text: str, indent: str, *, first: str = "", lines: int | None = None) -> list[str]:
    """``first`` + ``text`` within WIDTH columns, continued at ``indent`` + 2 spaces; at most
    ``lines`` lines, the last ending in "..." where text was cut."""
    out = textwrap.wrap(
        first + text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
    )
    if lines is not None and len(out) > lines:
        out = out[:lines]
        out[-1] = out[-1][: WIDTH - 4] + " ..."
    return out


def shell_lines(command: str, first: str, indent: str) -> list[str]:
    """``command`` as shell lines within WIDTH columns, the first after ``first``, the others at
    ``indent``, joined by backslash continuations: pasted whole, it is the same command. A quoted
    word too long for a line is cut into quoted pieces, each continuing at the start of its line
    (bash joins 'ab'\\<newline>'cd' into one word, but not 'ab'\\<newline>  'cd')."""
    lines: list[str] = []
    current = first

    def room() -> int:
        return WIDTH - 2 - len(current)  # " \\" ends a continued line

    for word in (shlex.quote(word) for word in shlex.split(command)):
        separator = "" if current in (first, indent, "") else " "
        if len(separator + word) <= room():
            current += separator + word
            continue
        if separator and len(word) <= WIDTH - 2 - len(indent):
            lines.append(current + " \\")
            current = indent + word
            continue
        # A word too long for any line: quoted pieces, each line ending in a bare backslash.
        current += separator
        while len(current) + len(word) > WIDTH - 1:
            cut = max(WIDTH - 2 - len(current), 8)
            lines.append(current + word[:cut] + "'\\")
            current, word = "", "'" + word[cut:]
        current += word
    lines.append(current)
    return lines


def short_test(test_id: str, implementation: str) -> str:
    """A test id without its module and the implementation's name: what a reader scans."""
    name = test_id.split("::", 1)[-1]
    return name.replace(f"[{implementation}-", "[").replace(f"[{implementation}]", "")


def first_line(message: str) -> str:
    """A failure message's first line, without the bracketed claims and call at its end."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return re.sub(r" \[[^\[\]]*\]$", "", line)


def diagnosis_lines(
    subject: dict, entries: list[dict], said: set[str], indent: str, shown_test: str
):
    """The diagnosis of one claim: each mistake matched with its evidence (its hint, the first
    time the subject's summary names it; "as above" after), or
    where the errors lie. ``shown_test``: the test whose reproducer follows."""
    lines = []
    for entry in entries:
        test = (
            "the test reproduced below"
            if entry["test"] == shown_test
            else short_test(entry["test"], subject["name"])
        )
        evidence = f"{describe_fraction(entry['fraction_of_budget'])} in {test}"
        if entry["kind"] == "mistake" and entry["name"] in said:
            lines += wrapped(
                f"{entry['name']}, as above "
                f"({evidence.replace('the test reproduced below', 'this one')})",
                indent,
                first="diagnosis: ",
            )
        elif entry["kind"] == "mistake":
            lines += wrapped(
                f"{entry['name']}: {entry['text']} ({evidence})", indent, first="diagnosis: "
            )
            lines += wrapped(entry["hint"], indent + "  ", first="usually: ")
        elif entry["name"] == "where":
            lines += wrapped(f"{unmatched([entry])}; {entry['text']}", indent, first="diagnosis: ")
        else:
            lines += wrapped(entry["text"], indent + "  ")
    return lines


def claim_block(subject: dict, claim: str, entry: dict, said: set[str]) -> list[str]:
    """A failed claim in a few lines: count, message, diagnosis, reproducer."""
    count = entry["failed"] + entry["unmet"]
    failure = entry.get("first_failure") or {}
    # With a mistake named, the diagnosis tells the story: the message gets one line.
    named = any(d["kind"] == "mistake" for d in entry.get("diagnosis") or [])
    lines = wrapped(
        first_line(failure.get("message", "")),
        INDENT,
        first=f"FAILED {entry['level']} {claim} ({count} test{'s' if count != 1 else ''}): ",
        lines=1 if named else 2,
    )
    lines += diagnosis_lines(
        subject, entry.get("diagnosis") or [], said, INDENT * 2, failure.get("test", "")
    )
    for diagnosed in entry.get("diagnosis") or []:
        if diagnosed["kind"] == "mistake":
            said.add(diagnosed["name"])
    if failure.get("reproducer"):
        command = failure["reproducer"].split("   # ")[0]
        lines += shell_lines(command, INDENT * 2 + "reproduce: ", INDENT * 3)
    return lines


def broken_block(subject: dict) -> list[str]:
    """An implementation whose first call broke the contract: the sentence once, the claims it
    failed by name, one reproducer."""
    failed = sorted(c for c, e in subject["claims"].items() if e["verdict"] == ClaimVerdict.FAILED)
    lines = wrapped(subject["broken"], INDENT, first="broken at its first call: ")
    lines += wrapped(", ".join(failed), INDENT + "  ", first=f"{len(failed)} claims FAILED: ")
    reproducer = next(
        (
            e["first_failure"]["reproducer"]
            for c, e in sorted(subject["claims"].items())
            if c in failed and (e.get("first_failure") or {}).get("reproducer")
        ),
        None,
    )
    if reproducer:
        lines += shell_lines(reproducer.split("   # ")[0], INDENT + "reproduce: ", INDENT * 2)
    return lines


def subject_lines(subject: dict, name_width: int) -> list[str]:
    claims = subject["claims"]
    by_verdict: dict[str, list[str]] = {}
    for claim, entry in sorted(claims.items()):
        by_verdict.setdefault(entry["verdict"], []).append(claim)
    counts = ", ".join(f"{len(by_verdict[v])} {v}" for v in ClaimVerdict if v in by_verdict)
    name = subject["name"]
    if len(name) > name_width:
        lines = [name, f"{'':<{name_width}}  {subject['verdict']:<8}  {counts}"]
    else:
        lines = [f"{name:<{name_width}}  {subject['verdict']:<8}  {counts}"]
    sandbox = subject.get("sandbox")
    if sandbox and not sandbox.startswith("full"):
        lines += wrapped(sandbox, INDENT, first="judged UNCONFINED: sandbox ")
    if subject.get("conventions"):
        followed = ", ".join(f"{k}={v}" for k, v in subject["conventions"].items())
        lines += wrapped(followed, INDENT, first="conventions: ")
    if subject.get("broken"):
        return lines + broken_block(subject)
    said: set[str] = set()  # the mistakes an earlier claim's diagnosis named, with their hint
    for claim in by_verdict.get(ClaimVerdict.FAILED, []):
        lines += claim_block(subject, claim, claims[claim], said)
    unmet = [
        f"{claim} ({claims[claim]['unmet']} tests)"
        for claim in by_verdict.get(ClaimVerdict.UNMET, [])
    ]
    if unmet:
        lines += wrapped(", ".join(unmet), INDENT, first="unmet, not failing the run: ")
    if subject["verdict"] == RowVerdict.NOT_RUN:
        reasons = sorted({r for e in claims.values() for r in e["skip_reasons"]})
        for reason in reasons[:SKIP_REASONS_SHOWN]:
            lines += wrapped(reason, INDENT, first="skipped: ", lines=1)
    return lines


def verdict_lines(report: dict) -> list[str]:
    """Every subject of ``report`` (the JSON report's shape), within WIDTH columns."""
    subjects = report["subjects"]
    name_width = min(max([len(s["name"]) for s in subjects] + [10]), NAME_WIDTH)
    return [line for subject in subjects for line in subject_lines(subject, name_width)]
