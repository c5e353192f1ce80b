"""The attnspec command: list, run (the matrix, JSON, HTML, JUnit), explain, demo, bad arguments."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conformance import cli
from conformance.run.options import OPTIONS, add_to_pytest
from tests.suite_process import ROOT, run_attnspec

MUTANT = "tests.zoo.mutants:mask_off_by_one"


attnspec = run_attnspec


def test_list_shows_every_builtin_and_whether_it_runs_here():
    run = attnspec("list")
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line for line in run.stdout.splitlines()[1:]}
    assert {"numpy_reference", "numpy", "torch_sdpa", "torch_sdpa_cuda"} <= set(rows)
    assert rows["numpy"].rstrip().endswith("yes")


@pytest.mark.parametrize(
    "detail", [(), ("-v",), ("--impl", "numpy,tests.zoo.mutants:scaled_twice")]
)
def test_list_fits_100_columns_with_the_detail_behind_v_or_impl(detail):
    run = attnspec("list", *detail)
    assert run.returncode == 0, run.stderr
    too_wide = [line for line in run.stdout.splitlines() if len(line) > 100]
    assert not too_wide, too_wide
    declares = "    declares: float64/float32; Tq<Tk, scale"
    assert (declares in run.stdout) == bool(detail), run.stdout


def test_an_unknown_hypothesis_profile_is_a_usage_error(suite):
    run = suite("--hypothesis-profile", "nope", "-k", "nothing")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "INTERNALERROR" not in run.stdout + run.stderr
    assert "--hypothesis-profile 'nope' is not a profile; attnspec's are ci" in run.stderr
    command = attnspec("run", "--impl", "numpy", "--", "--hypothesis-profile", "nope")
    assert command.returncode == 2, command.stdout + command.stderr


def test_list_names_an_unresolvable_impl_and_exits_with_usage_error():
    run = attnspec("list", "--impl", "tests.planted.plain:NOT_CALLABLE")
    assert run.returncode == 2
    assert "neither an attnspec Implementation nor a callable" in " ".join(run.stdout.split())
    assert "--impl tests.planted.plain:NOT_CALLABLE: not an implementation" in run.stderr


CONFIGURED_KERNEL = """
import os

import numpy as np

if os.environ.get("MYKERNEL_MODE") != "on":
    raise ImportError("MYKERNEL_MODE is not set: this kernel is configured through it")


def attention(q, k, v, *, causal=True, scale=None):
    return np.zeros_like(q)
"""


def test_list_finds_and_configures_a_kernel_as_run_does(tmp_path, monkeypatch):
    """A kernel found through --impl-path and configured through a variable the run passes on
    with --pass-env is listed as runnable, not as 'not an implementation'."""
    (tmp_path / "configured.py").write_text(CONFIGURED_KERNEL)
    monkeypatch.setenv("MYKERNEL_MODE", "on")
    plain = attnspec("list", "--impl", "configured:attention")
    assert plain.returncode == 2, plain.stdout
    given = attnspec(
        "list", "--impl", "configured:attention", "--impl-path", str(tmp_path),
        "--pass-env", "MYKERNEL_MODE",
    )  # fmt: skip
    assert given.returncode == 0, given.stdout + given.stderr
    assert given.stdout.splitlines()[1].rstrip().endswith("yes"), given.stdout


@pytest.fixture(scope="module")
def mutant_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    run = attnspec(
        "run",
        "--impl",
        f"numpy,{MUTANT}",
        "--claims",
        "MASK-ZERO,MASK-ROW0,OUT-FORMULA,DOT-GROWTH,SOFTMAX-SATURATION",
        "--report-json",
        str(out / "report.json"),
        "--report-html",
        str(out / "report.html"),
        "--junitxml",
        str(out / "junit.xml"),
    )
    return run, out


def test_run_prints_the_matrix_with_the_mutant_failing(mutant_run):
    run, _ = mutant_run
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    matrix = run.stdout.split("attnspec: claim x implementation", 1)[1]
    rows = {line.split()[0]: line.split()[2:] for line in matrix.splitlines() if "(MUST)" in line}
    # columns: (mathematics), numpy, the mutant; the document's tests check no MASK claim
    assert rows["MASK-ZERO"] == ["-", "pass", "FAIL"]
    assert rows["MASK-ROW0"] == ["-", "pass", "FAIL"]
    numpy_cell, mutant_cell = re.findall(r"(pass|FAIL) ([0-9.e+]+)", matrix.split("OUT-FORMULA")[1])
    assert float(numpy_cell[1]) <= 1 < float(mutant_cell[1])
    assert re.search(r"verdict\s+conforms\s+conforms\s+FAILS", matrix)


def test_run_output_ends_with_a_matrix_within_100_columns(mutant_run):
    run, _ = mutant_run
    lines = run.stdout.splitlines()
    matrix_start = lines.index("attnspec: claim x implementation")
    assert all(len(line) <= 100 for line in lines[matrix_start:]), lines[matrix_start:]
    assert lines[-1].startswith(("cells:", "  "))
    assert "SKIPPED" not in run.stdout  # per-test lines only with -v
    assert "XFAIL" not in run.stdout
    # each failed claim with its diagnosis and reproducer, in the verdict per implementation
    verdicts = run.stdout.split("attnspec: verdict per implementation", 1)[1]
    assert "FAILED MUST MASK-ZERO" in verdicts
    assert "diagnosis: mask-one-ahead" in verdicts


def test_run_folds_implementations_that_did_not_run_into_one_line():
    run = attnspec("run", "--impl", "numpy,torch_eager_cuda", "--claims", "SCORE-SHAPE")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    matrix = run.stdout.split("attnspec: claim x implementation", 1)[1]
    assert "torch_eager_cuda" not in matrix.split("\nverdict", 1)[0]
    assert "not run here: torch_eager_cuda (torch_eager_cuda cannot run here" in matrix


@pytest.mark.optional_libraries
def test_run_writes_json_html_and_junit(mutant_run):
    _, out = mutant_run
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "attnspec-report/2"
    subjects = {s["name"]: s for s in report["subjects"]}
    # the diagnosis of each failed claim, with its evidence (json_report's schema documents it)
    diagnosis = subjects[MUTANT]["claims"]["OUT-FORMULA"]["diagnosis"]
    assert [d["name"] for d in diagnosis] == ["mask-one-ahead"], diagnosis
    assert set(diagnosis[0]) == {"kind", "name", "text", "hint", "test", "fraction_of_budget"}
    assert diagnosis[0]["kind"] == "mistake"
    assert diagnosis[0]["fraction_of_budget"] <= 1
    assert diagnosis[0]["test"] in subjects[MUTANT]["claims"]["OUT-FORMULA"]["failing_tests"]
    # a built-in never gets a diagnosis
    assert all(entry["diagnosis"] == [] for entry in subjects["numpy"]["claims"].values())
    assert subjects[MUTANT]["broken"] is None
    assert subjects[MUTANT]["claims"]["MASK-ZERO"]["verdict"] == "FAILED"
    assert subjects[MUTANT]["claims"]["MASK-ZERO"]["failing_tests"]
    first = subjects[MUTANT]["claims"]["MASK-ZERO"]["first_failure"]
    assert "[MASK-ZERO tests.zoo.mutants:mask_off_by_one" in first["message"]
    assert "np.float64(" not in first["message"]
    assert first["reproducer"].startswith("python -m pytest --pyargs 'conformance.")
    assert f"--impl {MUTANT}" in first["reproducer"]
    assert subjects["numpy"]["claims"]["MASK-ZERO"]["first_failure"] is None
    assert subjects["numpy"]["claims"]["OUT-FORMULA"]["worst_budget_fraction"] <= 1
    html = (out / "report.html").read_text()
    assert "<td class='failed'>FAILED" in html  # the matrix, coloured by verdict
    assert "<b>mask-one-ahead</b>" in html  # each failed claim's diagnosis
    assert "MASK-ZERO (MUST): " in html
    assert "numpy: <b>conforms</b>" in html
    assert f"{MUTANT}: <b>FAILS</b>" in html
    if importlib.util.find_spec("matplotlib"):
        # growth, saturation (recorded by DOT-GROWTH's and SOFTMAX-SATURATION's tests), the
        # causal weights MASK-ZERO's tests recorded for each implementation, budgets
        assert html.count("data:image/png;base64,") == 5
        # the failing implementation's heat map comes first, beside the truth's: the picture a
        # review needs
        assert html.index(f"Causal attention weights of {MUTANT} (FAILS") < html.index(
            "Causal attention weights of numpy (conforms"
        )
        assert "beside the truth" in html
    else:
        assert "Plots need matplotlib" in html
    cases = ET.parse(out / "junit.xml").getroot().iter("testcase")
    assert any(case.find("failure") is not None and MUTANT in case.get("name") for case in cases)


def test_html_report_renders_without_matplotlib(monkeypatch, mutant_run):
    from conformance.report.html import render_html

    _, out = mutant_run
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    html = render_html(json.loads((out / "report.json").read_text()), recorded={})
    assert "Plots need matplotlib" in html
    assert "MASK-ZERO (MUST)" in html


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--claims", "NOPE-*"], "--claims: NOPE-* matches no claim"),
        (["run", "--profile", "fast"], "invalid choice: 'fast'"),
        (["run", "--workers", "0"], "0, but should be >= 1"),
        (["run", "--seed", "x"], "'x', but should be a whole number"),
        (["explain", "MASK-ZER"], "did you mean MASK-ZERO"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_arguments_are_usage_errors(args, message):
    run = attnspec(*args)
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr


def test_run_of_an_unknown_impl_is_a_usage_error_like_any_other():
    """The suite's usage error (4) is this command's usage error (2), as a bad --claims is."""
    run = attnspec("run", "--impl", "no_such_impl")
    assert run.returncode == 2
    assert "unknown implementation 'no_such_impl'" in run.stderr


def test_run_where_nothing_is_checked_exits_5():
    run = attnspec("run", "--impl", "torch_sdpa_cuda", "--claims", "CONTRACT-DETERMINISM")
    if "torch_sdpa_cuda cannot run here" not in run.stdout:
        pytest.skip("torch_sdpa_cuda can run on this machine")
    assert run.returncode == 5
    assert "nothing was checked" in run.stdout


def test_explain_names_level_section_tests_and_erratum():
    run = attnspec("explain", "dot-growth")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("DOT-GROWTH (MUST): section 1, Why divide by sqrt(d_k)")
    assert "erratum: The document calls the vectors 'unit vectors'" in run.stdout
    assert "conformance/test_scores.py::test_dot_products_grow_as_sqrt_d" in run.stdout


def test_explain_lists_the_regimes_a_claims_tests_draw():
    run = attnspec("explain", "PAGED-KV")
    assert run.returncode == 0, run.stderr
    assert "regimes its tests draw (15; docs/regimes.md):" in run.stdout
    assert "    paged.group-not-a-power-of-two: a paged call whose group is not" in run.stdout
    assert "regimes its tests draw" not in attnspec("explain", "DOT-GROWTH").stdout


def test_demo_reproduces_the_documents_numbers():
    run = attnspec("demo")
    assert run.returncode == 0, run.stderr
    stds = {
        int(m[0]): (float(m[1]), float(m[2]))
        for m in re.findall(r"^\s+(\d+)\s+([\d.]+)\s+\d+\s+([\d.]+)\s+[\d.]+$", run.stdout, re.M)
    }
    for d, expected in ((64, 8), (256, 16), (4096, 64)):
        measured, unit = stds[d]
        assert abs(measured / expected - 1) < 0.03, (d, measured)
        assert abs(unit * expected - 1) < 0.03, (d, unit)  # the erratum: 1/sqrt(d)
    assert "row 0: 1.000  0.000  0.000  0.000  0.000   sum 1.000" in run.stdout
    assert "scores per layer: 12,582,912" in run.stdout
    assert "heads concatenated: (1024, 768)" in run.stdout


# --- what a newcomer types first ----------------------------------------------------------------

KERNEL_FILE = """
import numpy as np

def attention(q, k, v, *, causal=True, scale=None):
    return q
"""


def test_every_subcommand_finds_a_kernel_file_in_the_current_directory(tmp_path):
    """The installed script starts with its own folder on sys.path, not the current directory."""
    (tmp_path / "mykernel.py").write_text(KERNEL_FILE)
    script = tmp_path / "bin" / "attnspec_script.py"
    script.parent.mkdir()
    script.write_text("import sys\nfrom attnspec import main\nsys.exit(main())\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, str(script), "list", "--impl", "mykernel:attention"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ModuleNotFoundError" not in run.stdout + run.stderr


def test_list_with_impl_lists_only_what_was_named():
    run = attnspec("list", "--impl", "numpy")
    assert run.returncode == 0, run.stderr
    rows = [line.split()[0] for line in run.stdout.splitlines()[1:] if not line.startswith(" ")]
    assert rows == ["numpy"]


def test_version():
    run = attnspec("--version")
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"attnspec \S.*\n", run.stdout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--impl", ""], "names no implementation"),
        (["--impl", "nump"], "did you mean 'numpy'"),
        (["--claims", "NOPE"], "--claims: NOPE matches no claim"),
        (["--impl", "numpy", "--report-json", "README.md/r.json"], "is a file, not a directory"),
        (["--impl", "numpy", "--report-json", "no/such/dir/r.json"], "does not exist"),
        (["--impl", "numpy", "--report-html", "conformance"], "is a directory"),
    ],
)
def test_run_usage_errors_exit_2_before_any_test_runs(args, message):
    run = attnspec("run", *args)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert message in run.stderr
    assert "passed" not in run.stdout
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--impl", ""], "names no implementation"),
        (["--report-json", "README.md/r.json"], "is a file, not a directory"),
        (["--report-json", "no/such/dir/r.json"], "does not exist"),
    ],
)
def test_pytest_usage_errors_exit_4_before_collecting(suite, args, message):
    run = suite("--claims", "SCORE-SHAPE", *args)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert message in run.stderr
    assert "passed" not in run.stdout


def test_claim_ids_are_case_insensitive_everywhere(suite):
    run = suite("--impl", "numpy", "--claims", "score-shape", "-q")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "passed" in run.stdout


class PytestParserOnArgparse:
    """pytest's parser as far as conformance.run.options uses it, on argparse."""

    def __init__(self) -> None:
        self.argparse = argparse.ArgumentParser()

    def getgroup(self, *names):
        return self

    def addoption(self, *flags, **arguments):
        self.argparse.add_argument(*flags, **arguments)


def test_every_option_given_to_attnspec_run_reaches_pytest_as_parsed(tmp_path):
    """attnspec run and the plugin read one table of options: whatever run parses, the pytest
    arguments it hands on parse to the same values."""
    given = [
        *("--impl", "numpy,numpy_flash", "--impl", "torch_sdpa", "--claims", "mask-*,OUT-FORMULA"),
        *("--seed", "7", "--fail-on-should", "--timeout", "2.5", "--in-process", "--no-sandbox"),
        *("--require-sandbox", "--first-failure", "--no-truth-cache"),
        *("--report-json", str(tmp_path / "r.json")),
        *("--report-html", str(tmp_path / "r.html")),
        *("--impl-path", str(tmp_path), "--pass-env", "HF_*", "--worker-memory", "2GiB"),
        *("--impl-budget", "600", "--worker-disk", "512MiB", "--worker-processes", "256"),
    ]
    options = cli.build_parser().parse_args(["run", *given])
    pytest_parser = PytestParserOnArgparse()
    flags = add_to_pytest(pytest_parser)
    assert flags == [option.flag for option in OPTIONS]
    arguments = cli.pytest_arguments(options, tmp_path)
    received, _ = pytest_parser.argparse.parse_known_args(arguments)
    for option in OPTIONS:
        value = getattr(options, option.dest)
        assert value not in (None, False), f"{option.flag} was not given in this test"
        assert getattr(received, option.dest) == value, option.flag


def test_options_help_names_each_default():
    for option in OPTIONS:
        assert "Default: " in option.help, option.flag
        assert option.help.endswith("."), option.flag


def test_a_zero_budget_and_memory_bound_reach_pytest_as_none(tmp_path):
    """0 switches --impl-budget and the worker bounds off; attnspec run hands them on as parsed
    (0.0 and 0), which pytest's parser must take too."""
    zeros = ["--impl-budget", "0", "--worker-memory", "0", "--worker-disk", "0"]
    options = cli.build_parser().parse_args(["run", *zeros, "--worker-processes", "0"])
    pytest_parser = PytestParserOnArgparse()
    add_to_pytest(pytest_parser)
    received, _ = pytest_parser.argparse.parse_known_args(cli.pytest_arguments(options, tmp_path))
    assert (received.impl_budget, received.worker_memory) == (0.0, 0)
    assert (received.worker_disk, received.worker_processes) == (0, 0)
