"""The ``attnspec`` command: list implementations, run the suite and print the claim matrix,
explain a claim, reproduce the document's numbers.

``attnspec run`` is a thin layer over ``python -m pytest`` on the installed conformance suite:
the suite runs in a child process (its progress streams through), writes its JSON report, and
the matrix is printed from that report. The exit status is pytest's: 0 when every MUST claim
held, 1 when one failed, 2 on a usage error (its own or pytest's), 5 when nothing was checked.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.metadata
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from conformance.bench.cli import add_bench_parser
from conformance.judge.measurements import (
    andrea_numbers,
    dot_product_std,
    masked_softmax_example,
    saturation,
)
from conformance.report.matrix import matrix_lines
from conformance.report.tables import text_table
from conformance.report.verdicts import shell_lines
from conformance.run.collection import claims_of
from conformance.run.commands import USAGE_ERROR, absolute_selector, usage_error
from conformance.run.fork_server_client import isolated_command
from conformance.run.options import OPTIONS, add_to_command, pytest_arguments_of
from conformance.run.profiles import DEFAULT_PROFILE, PROFILES
from conformance.run.selection import split_names_or_fail
from conformance.run.settings import file_of_selector
from conformance.run.worker_clients import WorkerSetup, open_clients, pythonpath_directories
from impls.messages import Description
from impls.registry import BUILTINS, ECOSYSTEM, RegistryError, entry_point_names, resolve
from impls.templates import TEMPLATES_DIR
from impls.worker_process import describe
from spec.catalogue import load_catalogue
from spec.regimes import regimes_of_claim

CONFORMANCE_DIR = Path(__file__).resolve().parent
LINE_WIDTH = 100  # what the command prints fits a terminal of this width
PYTEST_USAGE_ERROR = 4


# --- attnspec list ------------------------------------------------------------------------------


def command_list(options: argparse.Namespace) -> int:
    if options.impl is not None:
        try:
            selected = split_names_or_fail(options.impl)
        except RegistryError as exc:
            return usage_error(str(exc))
        known = {
            **{n: "entry point" for n in entry_point_names()},
            **dict.fromkeys(ECOSYSTEM, "ecosystem"),
            **dict.fromkeys(BUILTINS, "built-in"),
        }
        names = [(name, known.get(name, "--impl")) for name in selected]
    else:
        names = [(name, "built-in") for name in BUILTINS]
        names += [(name, "entry point") for name in entry_point_names()]
    rows = [("name", "source", "device", "runs here")]
    details: list[list[str]] = [[]]  # per row: what -v (or --impl) prints below it
    unresolved = []
    for name, source in names:
        try:
            found = description_of(name, options.impl_path or (), options.pass_env or ())
        except RegistryError as exc:
            rows.append((name, source, "-", "no: not an implementation"))
            details.append([f"why not: {exc}"])
            unresolved.append(name)
            continue
        reason = found.unavailable_reason
        rows.append((name, source, f"{found.family} on {found.device}", "no" if reason else "yes"))
        details.append(
            [f"version: {found.version}", f"declares: {found.capabilities.describe()}"]
            + ([f"why not: {reason}"] if reason else [])
        )
    verbose = options.verbose or options.impl is not None
    for line, detail in zip(text_table(rows), details, strict=True):
        print(line)
        for text in detail if verbose else ():
            print(
                textwrap.fill(text, LINE_WIDTH, initial_indent="    ", subsequent_indent="      ")
            )
    if not verbose:
        print("versions, what each declares, and why one does not run: attnspec list -v")
    if unresolved:
        return usage_error(f"--impl {', '.join(unresolved)}: not an implementation (see above)")
    return 0


def description_of(name: str, impl_paths=(), pass_env=()) -> Description:
    """What ``name`` declares: a built-in's or an adapter's read here (the suite's own code); any
    other's by a confined worker of its own, which finds it where ``attnspec run`` would (the
    current directory, ``$PYTHONPATH``, a selector's file, ``impl_paths``) and gets the
    variables it would (``pass_env``), so that listing a candidate runs nothing of it in this
    process and lists it as the run would judge it."""
    if name in BUILTINS or name in ECOSYSTEM:
        return describe(resolve(name))
    selector = absolute_selector(name)
    file = file_of_selector(selector)
    # $PYTHONPATH's directories too, which every worker's search path holds
    paths = [*impl_paths, *([str(file.parent)] if file else []), os.getcwd()]
    setup = WorkerSetup(impl_paths=tuple(paths), pass_env=tuple(pass_env))
    (client,) = open_clients([selector], setup=setup)
    client.close()
    return client.description


# --- attnspec run -------------------------------------------------------------------------------


# The judge's pytest configuration: `attnspec run` reads no ini file, conftest or plugin of the
# directory it is run from, where a candidate's files may lie (docs/isolation.md).
JUDGE_INI = CONFORMANCE_DIR / "judge.ini"


def pytest_arguments(options: argparse.Namespace, rootdir: Path) -> list[str]:
    # The suite by module name, as its reproducers name its tests; pytest's rootdir the run's
    # own scratch directory, which holds nothing of the candidate.
    args = ["--pyargs", "conformance", "-p", "conformance.plugin", "-c", str(JUDGE_INI)]
    args += ["--rootdir", str(rootdir), "--noconftest", "-p", "no:cacheprovider"]
    # The matrix is the answer; pytest's per-test summary is there with -v.
    args += ["-v", "-ra"] if options.verbose else ["-qq", "--no-summary"]
    args += pytest_arguments_of(options)
    args += ["--hypothesis-profile", options.profile]
    if options.junitxml:
        args += ["--junitxml", str(options.junitxml)]
    if options.workers:
        args += ["-n", str(options.workers), "--dist", "loadgroup"]
    return args + list(options.pytest_args)


def as_judged_elsewhere(options: argparse.Namespace) -> None:
    """The run's paths made absolute, and the places a candidate's modules are found named, for a
    judge that runs in a directory of its own: a selector naming a file, the report files, and
    the directory the command was started in and ``$PYTHONPATH``'s, which reach the workers'
    ``sys.path`` (as --impl-path) and nothing of the judge's."""
    if options.impl is not None:
        options.impl = [
            ",".join(absolute_selector(name) for name in value.split(",")) for value in options.impl
        ]
    for name in ("report_json", "report_html", "junitxml"):
        if getattr(options, name) is not None:
            setattr(options, name, Path(getattr(options, name)).resolve())
    searched = [os.getcwd(), *pythonpath_directories()]
    options.impl_path = list(dict.fromkeys([*(options.impl_path or ()), *searched]))


def judge_environment() -> dict[str, str]:
    """The judge's environment without ``PYTHONPATH`` (its directories are the workers' alone),
    and with ``PYTHONSAFEPATH``, so that the xdist processes put no current directory on their
    ``sys.path`` either."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return environ | {"PYTHONSAFEPATH": "1"}


@dataclass
class JudgeRun:
    """One confined run of the suite as ``attnspec run`` makes it: pytest's exit status, the
    JSON report's data (None where the suite wrote none) and, where asked, what it printed."""

    status: int
    report: dict | None
    output: str | None = None


def run_judge(options: argparse.Namespace, capture: bool = False) -> JudgeRun:
    """The suite, judged from a directory of its own by an isolated pytest (docs/isolation.md),
    on what ``options`` (``attnspec run``'s) ask; ``capture``: its output kept, not printed."""
    as_judged_elsewhere(options)
    with tempfile.TemporaryDirectory(prefix="attnspec-run-") as scratch:
        options.report_json = options.report_json or Path(scratch) / "report.json"
        report_json = options.report_json
        judge = Path(scratch) / "judge"  # the judge's current directory and pytest's rootdir
        judge.mkdir()
        command = isolated_command("pytest", *pytest_arguments(options, judge))
        if options.verbose:
            shown = shlex.join(["python", "-I", "-m", "pytest", *command[6:]])
            print("\n".join(shell_lines(shown, "attnspec run: ", "  ")))
        sys.stdout.flush()
        judged = subprocess.run(
            command, cwd=judge, env=judge_environment(), text=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
        )  # fmt: skip
        report = json.loads(report_json.read_text()) if report_json.exists() else None
    return JudgeRun(judged.returncode, report, judged.stdout)


def command_run(options: argparse.Namespace) -> int:
    if options.impl is not None:
        try:
            split_names_or_fail(options.impl)
        except RegistryError as exc:
            return usage_error(str(exc))
    run = run_judge(options)
    if run.status == PYTEST_USAGE_ERROR:
        # pytest's usage error (a bad --impl, say): this command's usage errors exit 2.
        return USAGE_ERROR
    if run.report is None:
        print(
            f"attnspec run: the suite ended with status {run.status} and wrote no report "
            "(it crashed: see above)",
            file=sys.stderr,
        )
        return run.status or 1
    # The failures, each with its diagnosis and reproducer, are in the suite's own summary above.
    print()
    print("attnspec: claim x implementation")
    for line in matrix_lines(run.report):
        print(line)
    return run.status


# --- attnspec explain ---------------------------------------------------------------------------


def tests_of_claims() -> dict[str, list[str]]:
    """claim -> conformance tests marked with it, read from the test modules' functions."""
    found: dict[str, list[str]] = {}
    for path in sorted(CONFORMANCE_DIR.glob("test_*.py")):
        module = importlib.import_module(f"conformance.{path.stem}")
        for name, function in vars(module).items():
            if name.startswith("test_") and callable(function):
                for claim in claims_of(function):
                    found.setdefault(claim, []).append(f"conformance/{path.name}::{name}")
    return found


def command_explain(options: argparse.Namespace) -> int:
    catalogue = load_catalogue()
    claim_id = options.claim.upper()
    if claim_id not in catalogue:
        close = difflib.get_close_matches(claim_id, [c.id for c in catalogue], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return usage_error(
            f"unknown claim {options.claim!r}{hint} Claims: {', '.join(c.id for c in catalogue)}"
        )
    claim = catalogue[claim_id]
    section = claim.section
    print(f"{claim.id} ({claim.level}): section {section.number}, {section.title} ({claim.group})")
    print(f"  {claim.statement}")
    print(f"  checked on: {claim.checked_on}")
    if claim.follows_from:
        print(f"  follows from: {', '.join(claim.follows_from)}")
    if claim.erratum:
        print(f"  erratum: {claim.erratum}")
    if claim.is_extension:
        print("  extension: not in the document; the attention that kernels ship")
        print(f"  convention: {claim.convention}")
        if claim.capability == "none":
            print("  needs: nothing declared; every implementation is checked")
        else:
            flags = ", ".join(f"{flag}=True" for flag in claim.needs)
            print(f"  needs: Capabilities({flags}); others show it as not checked")
    tests = tests_of_claims().get(claim.id, [])
    print(f"  tests ({len(tests)}):")
    for test in tests:
        print(f"    {test}")
    regimes = regimes_of_claim(claim.id)
    if regimes:
        # tests/test_regimes.py holds every one to a test of this claim that draws it
        print(f"  regimes its tests draw ({len(regimes)}; docs/regimes.md):")
        for regime in regimes:
            print(f"    {regime.id}: {regime.what}")
    print(f"  run them: attnspec run --claims {claim.id}")
    return 0


# --- attnspec new -------------------------------------------------------------------------------

TEMPLATE_NAME = "mykernel"  # the module name the templates are written for
FAMILIES = ("numpy", "torch", "jax", "cupy", "triton")


def kernel_skeleton(family: str, module: str) -> str:
    """The template of ``family`` (impls/templates), written for a module named ``module``."""
    text = (TEMPLATES_DIR / f"{family}_kernel.py").read_text(encoding="utf-8")
    return text.replace(TEMPLATE_NAME, module)


def command_new(options: argparse.Namespace) -> int:
    path: Path = options.file
    module = path.stem
    if path.suffix != ".py" or not module.isidentifier():
        return usage_error(f"{path}: give a Python module's file name, such as mykernel.py")
    if path.exists():
        return usage_error(f"{path} exists; attnspec new writes only a new file")
    if not path.parent.is_dir():
        return usage_error(f"directory {path.parent} does not exist; create it first")
    path.write_text(kernel_skeleton(options.family, module), encoding="utf-8")
    print(f"attnspec new: wrote {path}, a {options.family} implementation that conforms as written")
    print("  your kernel goes in MyKernel.attention(), where the file says so; judge it with:")
    print(f"  attnspec run --impl {module}:MyKernel")
    return 0


# --- attnspec demo ------------------------------------------------------------------------------


def command_demo(options: argparse.Namespace) -> int:
    print("Dot products of independent standard-normal vectors grow as sqrt(d) (DOT-GROWTH);")
    print("for unit vectors they shrink as 1/sqrt(d) instead (its erratum):")
    rows = [("d", "std of q.k", "sqrt(d)", "unit vectors", "1/sqrt(d)")]
    rows += [
        (
            f"{d}",
            f"{dot_product_std(d):.2f}",
            f"{math.sqrt(d):.0f}",
            f"{dot_product_std(d, unit_norm=True):.4f}",
            f"{1 / math.sqrt(d):.4f}",
        )
        for d in (64, 256, 4096)
    ]
    for line in text_table(rows, right=range(5)):
        print(f"  {line}")
    print()
    print("The softmax of unscaled scores is peaked; scaled by 1/sqrt(d_k) it is not")
    print("(SOFTMAX-SATURATION; 128 rows of 128 keys, mean largest weight, rows whose Jacobian")
    print("norm is below 1e-2):")
    rows = [("d_k", "unscaled max", "vanishing", "scaled max", "vanishing")]
    for d_k in (64, 256, 1024, 4096):
        unscaled, scaled = saturation(d_k, 1.0), saturation(d_k, 1 / math.sqrt(d_k))
        values = (unscaled[0], unscaled[1], scaled[0], scaled[1])
        rows.append((f"{d_k}", *(f"{v:.3f}" for v in values)))
    for line in text_table(rows, right=range(5)):
        print(f"  {line}")
    print()
    weights = masked_softmax_example()
    print(f"Causal softmax rows of a small example (T = {len(weights)}, d_k = 4): zeros above the")
    print("diagonal (MASK-ZERO), row 0 all on key 0 (MASK-ROW0), every row sums to 1:")
    for i, row in enumerate(weights):
        print(f"  row {i}: " + "  ".join(f"{w:.3f}" for w in row) + f"   sum {row.sum():.3f}")
    print()
    print("ANDREA-120M (d_model 768, 12 heads, d_k 64, T 1024), one attention layer:")
    for what, value in andrea_numbers().items():
        text = f"{value:,}" if isinstance(value, int) else str(value)
        print(f"  {what}: {text}")
    return 0


# --- the parser ---------------------------------------------------------------------------------


def attnspec_version() -> str:
    try:
        return importlib.metadata.version("attnspec")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: a plain checkout)"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}, but should be a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}, but should be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnspec",
        description="The conformance suite for causal scaled dot-product attention.",
    )
    parser.add_argument("--version", action="version", version=f"attnspec {attnspec_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="known implementations and whether they run here")
    listing.add_argument(
        "--impl",
        action="append",
        metavar="NAME[,NAME...]",
        help="list only these (module:attr too), with the detail of -v",
    )
    listing.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="each one's version, what it declares, and why it does not run here (default: a "
        "line each)",
    )
    for option in OPTIONS:  # where the workers that describe a candidate find it, and its variables
        if option.flag in ("--impl-path", "--pass-env"):
            listing.add_argument(option.flag, dest=option.dest, **option.arguments())
    listing.set_defaults(handler=command_list)

    run = commands.add_parser(
        "run",
        help="run the suite and print the claim x implementation matrix",
        description="Run the conformance suite; arguments after -- go to pytest unchanged.",
    )
    add_to_command(run)
    run.add_argument(
        "--profile",
        choices=PROFILES,
        default=DEFAULT_PROFILE,
        help=f"hypothesis profile. Default: {DEFAULT_PROFILE}.",
    )
    run.add_argument("--junitxml", type=Path, metavar="PATH", help="Default: no file.")
    run.add_argument(
        "-n",
        "--workers",
        type=positive_int,
        metavar="N",
        help="spread the tests over N pytest-xdist processes (every implementation runs in a "
        "worker process of its own either way). Default: one.",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="pytest's per-test lines and summary as well (default: progress, then the matrix)",
    )
    run.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help=argparse.SUPPRESS)
    run.set_defaults(handler=command_run)

    add_bench_parser(commands)
    explain = commands.add_parser("explain", help="a claim, its source, its tests, its erratum")
    explain.add_argument("claim", metavar="CLAIM-ID")
    explain.set_defaults(handler=command_explain)

    new = commands.add_parser(
        "new",
        help="write a skeleton implementation that conforms as written",
        description="Write FILE: an Implementation of the family's arrays that conforms as "
        "written, with the place for your kernel marked.",
    )
    new.add_argument("--family", required=True, choices=FAMILIES, help="the array library")
    new.add_argument("file", type=Path, metavar="FILE", help="the module to write (mykernel.py)")
    new.set_defaults(handler=command_new)

    demo = commands.add_parser("demo", help="the document's numbers, measured")
    demo.set_defaults(handler=command_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command, once :func:`attnspec.main` has taken the current directory off ``sys.path``
    and checked that nothing shadows the suite's packages."""
    options = build_parser().parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return options.handler(options)


if __name__ == "__main__":
    sys.exit(main())
