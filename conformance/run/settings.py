"""The run's settings: attnspec's pytest options, each with a typed parser that names the problem,
read once into one :class:`RunSettings` that every hook and fixture shares."""

from __future__ import annotations

import argparse
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance.run.selection import ENV_VAR, split_names
from conformance.run.worker_clients import DEFAULT_CALL_TIMEOUT
from impls.sandbox import Confinement, expected_confinement
from spec.catalogue import load_catalogue

DEFAULT_SEED = 20261129
SEED_VAR = "ATTNSPEC_SEED"
REPORTED_ENV = (
    ENV_VAR,
    SEED_VAR,
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "TRITON_INTERPRET",
    "PYTHONHASHSEED",
)


RANDOM_SEED = "random"  # a fresh seed per run, so that no answer is learnt against a known one


def seed_value(text: str) -> int:
    """A seed: a non-negative integer, or ``random`` for one drawn now."""
    if text == RANDOM_SEED:
        return secrets.randbelow(1 << 32)
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seed={text!r}, but should be a whole number or {RANDOM_SEED!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed={value}, but should be >= 0")
    return value


def call_timeout_value(text: str) -> float:
    """A call deadline: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}, but should be a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g}, but should be > 0 seconds")
    return value


def claim_patterns_value(text: str) -> list[str]:
    """Comma-separated claim patterns (shell-style, upper-cased as claim IDs are: ``mask-zero``
    is ``MASK-ZERO``), each matching at least one claim."""
    patterns = [pattern.upper() for pattern in split_names([text])]
    catalogue = load_catalogue()
    unmatched = [p for p in patterns if not catalogue.matching([p])]
    if unmatched:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unmatched)} matches no claim; claims are: "
            + ", ".join(c.id for c in catalogue)
        )
    return patterns


def report_path_value(text: str) -> Path:
    """A report's path: a file that can be written, in a directory that exists."""
    path = Path(text)
    problem = report_path_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(f"{path}: {problem}")
    return path


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


OPTION_GROUP = "attnspec"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup(OPTION_GROUP, "attnspec: attention conformance")
    group.addoption(
        "--impl",
        action="append",
        metavar="NAME[,NAME...]",
        help=(
            "implementation(s) to judge: a built-in name, an 'attnspec.impls' entry point, or "
            f"package.module:attribute; repeatable. Default: ${ENV_VAR}, else every built-in."
        ),
    )
    group.addoption(
        "--claims",
        action="append",
        type=claim_patterns_value,
        metavar="PATTERN[,PATTERN...]",
        help="run only tests of claims matching PATTERN (shell-style, e.g. 'MASK-*'); repeatable. "
        "Default: every claim.",
    )
    group.addoption(
        "--attnspec-seed",
        type=seed_value,
        default=None,
        metavar="N",
        help=f"seed of every test's random inputs, or '{RANDOM_SEED}' for one drawn for the run "
        f"(printed in the header and every reproducer). Default: ${SEED_VAR}, else {DEFAULT_SEED}.",
    )
    group.addoption(
        "--fail-on-should",
        action="store_true",
        default=False,
        help="a SHOULD claim not met fails the run, as a MUST claim does. Default: it is "
        "reported as an expected failure (unmet).",
    )
    group.addoption(
        "--call-timeout",
        type=call_timeout_value,
        default=None,
        metavar="SECONDS",
        help="deadline of one call of an implementation: past it, its worker is killed and the "
        "test fails as a hang. Default: what the implementation declares (call_timeout), else "
        f"{DEFAULT_CALL_TIMEOUT:g}.",
    )
    group.addoption(
        "--in-process",
        action="store_true",
        default=False,
        help="run implementations in the judge's own process, for pdb and profilers: a crash, "
        "a hang or a patched module can then lose or change the verdict. Default: a worker "
        "process per implementation.",
    )
    group.addoption(
        "--no-sandbox",
        action="store_true",
        default=False,
        help="run workers unconfined, for debugging: an implementation can then write files, "
        "signal or trace the judge, and read the shared truth. Default: each worker confined "
        "(impls/sandbox.py) as far as the kernel allows.",
    )
    group.addoption(
        "--require-sandbox",
        action="store_true",
        default=False,
        help="a run whose workers cannot be fully confined (no Landlock, an ABI before 6, "
        "--no-sandbox, --in-process) is a usage error. Default: it runs, and says so.",
    )
    group.addoption(
        "--no-truth-cache",
        action="store_true",
        default=False,
        help="compute the float64 truth and the naive baseline in every test that needs them. "
        "Default: once per inputs in a run, shared by the implementations and the xdist workers "
        "(conformance/judge/truth.py).",
    )
    group.addoption(
        "--report-json",
        type=report_path_value,
        default=None,
        metavar="PATH",
        help="write the verdict per implementation and claim as JSON (schema attnspec-report/2, "
        "documented in conformance/report/json_report.py) to PATH. Default: no file.",
    )
    group.addoption(
        "--report-html",
        type=report_path_value,
        default=None,
        metavar="PATH",
        help="write a self-contained HTML report (the matrix, the environment, the document's "
        "figures; plots need matplotlib) to PATH. Default: no file.",
    )


@dataclass(frozen=True)
class RunSettings:
    """Everything the run was asked for, parsed and checked once."""

    impl_options: list[str] | None  # the --impl values as given; None: $ATTNSPEC_IMPL or all
    claim_patterns: tuple[str, ...]  # empty: every claim
    seed: int
    fail_on_should: bool
    call_timeout: float | None
    in_process: bool
    sandbox: bool  # workers confined (impls.sandbox); not with --no-sandbox or --in-process
    require_sandbox: bool
    truth_cache: bool
    report_json: Path | None
    report_html: Path | None
    hypothesis_profile: str | None  # None: hypothesis is not installed
    hypothesis_seed: int | None

    @classmethod
    def from_config(cls, config: pytest.Config, hypothesis_profile: str | None) -> RunSettings:
        return cls(
            impl_options=config.getoption("impl"),
            claim_patterns=tuple(
                pattern for value in config.getoption("claims") or () for pattern in value
            ),
            seed=run_seed(config.getoption("attnspec_seed")),
            fail_on_should=config.getoption("fail_on_should"),
            call_timeout=config.getoption("call_timeout"),
            in_process=config.getoption("in_process"),
            sandbox=not (config.getoption("no_sandbox") or config.getoption("in_process")),
            require_sandbox=config.getoption("require_sandbox"),
            truth_cache=not config.getoption("no_truth_cache"),
            report_json=config.getoption("report_json"),
            report_html=config.getoption("report_html"),
            hypothesis_profile=hypothesis_profile,
            hypothesis_seed=config.getoption("hypothesis_seed", None),
        )

    def rerun_options(self) -> str:
        """The hypothesis options a reproducer needs, when not the defaults (property-based
        tests draw their cases inside the test, so any test may depend on them)."""
        options = []
        if self.hypothesis_profile not in (None, "ci"):
            options.append(f"--hypothesis-profile {self.hypothesis_profile}")
        if self.hypothesis_seed is not None:
            options.append(f"--hypothesis-seed {self.hypothesis_seed}")
        return " ".join(options)

    def confinement(self) -> Confinement:
        """How far this run's workers will be confined."""
        if self.in_process:
            return Confinement("none", "--in-process: implementations run in the judge")
        if not self.sandbox:
            return Confinement("none", "--no-sandbox")
        return expected_confinement()

    def call_deadline(self) -> str:
        """The call deadline in words, for the report header."""
        if self.call_timeout:
            return f"{self.call_timeout:g} s (--call-timeout)"
        return f"as each declares, else {DEFAULT_CALL_TIMEOUT:g} s"


def run_seed(option: int | None, environ=os.environ) -> int:
    """``--attnspec-seed``, else ``$ATTNSPEC_SEED``, else the default."""
    if option is not None:
        return option
    text = environ.get(SEED_VAR)
    if not text:
        return DEFAULT_SEED
    try:
        return seed_value(text)
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(f"attnspec: ${SEED_VAR}: {exc}") from None
