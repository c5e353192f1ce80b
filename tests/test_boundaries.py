"""The boundaries inside the layers: every message between the judge and a worker goes through
impls/messages.py, every attnspec option is declared in one table, claim levels are spelt by the
catalogue alone, and each feature is declared once (spec/features.py)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from conformance.judge.harness import Case
from conformance.run.options import OPTIONS
from impls.capabilities import EXTENSIONS, Capabilities
from spec.catalogue import BACKWARD, BLOCK_SCALED, CAPABILITIES, FP8, LEVELS
from spec.features import FEATURE_NAMES, FEATURES, NO_FEATURE
from tests.suite_process import ROOT

# The modules at the two ends of the two lines (impls/messages.py carries what they say).
LINE_ENDS = (
    "impls/worker_process.py",
    "conformance/run/worker_clients.py",
    "impls/fork_server.py",
    "conformance/run/fork_server_client.py",
)
# What only impls/messages.py may do: frame a whole message (and pickle, below).
FRAMING_CALLS = {"send_bytes", "recv_bytes", "recv_bytes_into"}
OPTION_FLAGS = {flag for option in OPTIONS for flag in (option.flag, *option.run_flags)}
# attnspec list's --impl names what to list: an option of another command, not the table's.
# Options of other commands that share a name with the table's, in the same role: what to judge
# or time, where its JSON or HTML goes, where its modules are found.
OTHER_COMMANDS_OPTIONS = {("conformance/cli.py", "--impl"), ("conformance/survey.py", "--impl")} | {
    ("conformance/bench/cli.py", flag)
    for flag in ("--impl", "--report-json", "--report-html", "--impl-path")
}


def calls_and_constants(source: str) -> tuple[list[tuple[int, str, tuple]], list[tuple[int, str]]]:
    """(line, called name, its string arguments) of every call, and (line, text) of every string
    constant, in ``source``."""
    calls, constants = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            strings = tuple(
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            )
            calls.append((node.lineno, name, strings))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            constants.append((node.lineno, node.value))
    return calls, constants


def line_traffic(source: str) -> list[str]:
    """Framing a message, or pickling at all: impls/messages.py's job."""
    calls, _ = calls_and_constants(source)
    found = [f"{line}: {name}()" for line, name, _ in calls if name in FRAMING_CALLS]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] + [getattr(node, "module", None)]
            if "pickle" in names:
                found.append(f"{node.lineno}: import pickle")
    return sorted(found)


def option_declarations(source: str, path: str = "") -> list[str]:
    """addoption/add_argument calls declaring one of the table's flags."""
    calls, _ = calls_and_constants(source)
    return [
        f"{line}: {name} {flag}"
        for line, name, strings in calls
        if name in ("addoption", "add_argument")
        for flag in OPTION_FLAGS & set(strings)
        if (path, flag) not in OTHER_COMMANDS_OPTIONS
    ]


def literal_levels(source: str) -> list[str]:
    _, constants = calls_and_constants(source)
    return [f"{line}: {text!r}" for line, text in constants if text in LEVELS]


def project_sources(*tops: str) -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for top in tops
        for path in sorted((ROOT / top).rglob("*.py"))
    }


def test_the_ends_of_the_lines_leave_pickling_and_framing_to_the_messages_module():
    problems = {
        end: found for end in LINE_ENDS if (found := line_traffic((ROOT / end).read_text()))
    }
    assert not problems


def test_every_attnspec_option_is_declared_in_the_options_table_alone():
    problems = {
        path: found
        for path, source in project_sources("conformance").items()
        if path != "conformance/run/options.py" and (found := option_declarations(source, path))
    }
    assert not problems


def test_claim_levels_are_spelt_by_the_catalogue_alone():
    sources = project_sources("spec", "impls", "conformance", "perf")
    problems = {
        path: found
        for path, source in sources.items()
        if path != "spec/catalogue.py" and (found := literal_levels(source))
    }
    assert not problems


@pytest.mark.parametrize(
    ("scan", "source", "found"),
    [
        (line_traffic, "import pickle\nx = pickle.loads(b)\n", ["1: import pickle"]),
        (line_traffic, "from pickle import loads\n", ["1: import pickle"]),
        (line_traffic, "conn.send_bytes(payload)\n", ["1: send_bytes()"]),
        (line_traffic, "from impls.messages import send\nsend(conn, m)\n", []),
        (option_declarations, 'g.addoption("--impl", action="append")\n', ["1: addoption --impl"]),
        (
            option_declarations,
            'p.add_argument("--timeout", type=float)\n',
            ["1: add_argument --timeout"],
        ),
        (option_declarations, 'run.add_argument("--profile")\n', []),
        (literal_levels, 'if claim.level == "MUST":\n    pass\n', ["1: 'MUST'"]),
        (literal_levels, '"""A MUST claim"""\n', []),
    ],
)
def test_each_scan_sees_a_planted_breach(scan, source, found):
    assert scan(source) == found


def test_each_feature_is_one_declaration_that_the_rest_reads():
    fields = {field.name for field in dataclasses.fields(Capabilities)}
    case_fields = {field.name for field in dataclasses.fields(Case)}
    assert set(FEATURE_NAMES) <= fields
    assert set(EXTENSIONS) == set(FEATURE_NAMES)
    assert set(CAPABILITIES) == {*FEATURE_NAMES, BACKWARD, FP8, BLOCK_SCALED, NO_FEATURE}
    for feature in FEATURES:
        # a case sets a feature by its first keyword; a draw there gives the others with it
        assert set(feature.keywords[:1]) <= case_fields, feature.name
        assert Capabilities(dtypes=("float32",), **{feature.name: True}).declares(feature.name)


def test_the_scans_read_real_files():
    """A scan of nothing passes vacuously: the files it names must exist and hold code."""
    for end in LINE_ENDS:
        assert len(Path(ROOT / end).read_text()) > 1000, end
    assert len(project_sources("conformance")) > 30


FIRST_SCREEN = 40  # lines a newcomer sees before scrolling
WIDTH = 100  # columns, as the code's


def test_the_readme_first_screen_is_the_product_and_no_row_is_wider_than_the_code():
    """The five-line kernel, the command that judges it and the matrix it ends with, in the
    first screen; the long form lives in docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_screen = "\n".join(readme.splitlines()[:FIRST_SCREEN])
    assert "def attention(q, k, v, *, causal=True, scale=None):" in first_screen
    assert "attnspec run --impl mykernel:attention" in first_screen
    assert re.search(r"^verdict +conforms", first_screen, re.M), "the matrix's verdict row"
    wide = [
        f"line {number}: {len(line)} columns"
        for number, line in enumerate(readme.splitlines(), 1)
        if len(line) > WIDTH
    ]
    assert wide == [], wide


def test_the_readme_reaches_every_document():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", readme))
    documents = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert documents, "docs/ holds no document"
    assert sorted(documents - linked) == [], "documents the README does not link"
    assert sorted(link for link in linked if not (ROOT / link).is_file()) == []
