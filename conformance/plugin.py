"""The pytest wiring of attnspec: options, markers, parametrisation, fixtures, header, summary.

Hooks only; the logic lives in :mod:`conformance.selection`, :mod:`conformance.harness` and
:mod:`conformance.verdicts`.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import platform
from pathlib import Path

import pytest

from conformance.harness import Subject
from conformance.selection import ENV_VAR, Selected, select
from conformance.verdicts import MATHEMATICS, Ledger
from impls.registry import RegistryError
from spec.catalogue import load_catalogue

CONFORMANCE_DIR = Path(__file__).parent
SELECTION_KEY = pytest.StashKey[list]()
LEDGER_KEY = pytest.StashKey[Ledger]()
DEFAULT_SEED = 20261129
REPORTED_ENV = (
    ENV_VAR,
    "ATTNSPEC_SEED",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "TRITON_INTERPRET",
    "PYTHONHASHSEED",
)

try:
    from hypothesis import HealthCheck, settings

    # Registered on import so that hypothesis's own --hypothesis-profile can name them.
    settings.register_profile(
        "ci",
        derandomize=True,
        max_examples=25,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", max_examples=100, deadline=None, print_blob=True)
    settings.register_profile(
        "thorough",
        max_examples=2000,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
except ImportError:  # hypothesis is a core dependency; its absence is reported by the import
    settings = None


def seed_value(text: str) -> int:
    """The ``--attnspec-seed`` parser: a non-negative integer."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed={text!r}, but should be a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed={value}, but should be >= 0")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnspec", "attnspec: attention conformance")
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
        metavar="PATTERN",
        help="run only tests of claims matching PATTERN (shell-style, e.g. 'MASK-*'); repeatable. "
        "Default: every claim.",
    )
    group.addoption(
        "--attnspec-seed",
        type=seed_value,
        default=None,
        metavar="N",
        help=f"seed of every test's random inputs. Default: $ATTNSPEC_SEED, else {DEFAULT_SEED}.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "claim(*ids): the catalogue claim(s) a conformance test checks"
    )
    try:
        selection = select(config.getoption("impl"))
    except RegistryError as exc:
        raise pytest.UsageError(f"attnspec: {exc}") from None
    config.stash[SELECTION_KEY] = selection
    config.stash[LEDGER_KEY] = Ledger(load_catalogue(), [s.impl.name for s in selection])
    config.pluginmanager.register(VerdictRecorder(config.stash[LEDGER_KEY]), "attnspec-verdicts")
    if settings is not None and not config.getoption("hypothesis_profile", None):
        settings.load_profile("ci")


def run_seed(config: pytest.Config) -> int:
    value = config.getoption("attnspec_seed")
    if value is not None:
        return value
    env = os.environ.get("ATTNSPEC_SEED")
    if env:
        try:
            return seed_value(env)
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"attnspec: $ATTNSPEC_SEED: {exc}") from None
    return DEFAULT_SEED


def pytest_report_header(config: pytest.Config) -> list[str]:
    catalogue = load_catalogue()
    levels = {}
    for claim in catalogue:
        levels[claim.level] = levels.get(claim.level, 0) + 1
    lines = [
        f"attnspec: {len(catalogue)} claims ("
        + ", ".join(f"{n} {level}" for level, n in levels.items())
        + f"), seed {run_seed(config)}, python {platform.python_version()}",
    ]
    if settings is not None:
        lines.append(f"attnspec: hypothesis profile {settings._current_profile}")
    for item in config.stash[SELECTION_KEY]:
        impl = item.impl
        status = f"SKIPPED: {item.skip_reason}" if item.skip_reason else "runs"
        lines.append(
            f"attnspec impl {impl.name}: {impl.version()}, {impl.family} on {impl.device}; "
            f"{impl.capabilities.describe()}; {status}"
        )
    env = [f"{name}={os.environ[name]}" for name in REPORTED_ENV if name in os.environ]
    lines.append(
        "attnspec env: " + (" ".join(env) if env else "(none of " + ", ".join(REPORTED_ENV) + ")")
    )
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames:
        return
    selection: list[Selected] = metafunc.config.stash[SELECTION_KEY]
    if "dtype" in metafunc.fixturenames:
        pairs = [(s, dtype) for s in selection for dtype in s.impl.capabilities.dtypes]
        metafunc.parametrize(
            ["impl", "dtype"],
            pairs,
            indirect=["impl"],
            ids=[f"{s.impl.name}-{dtype}" for s, dtype in pairs],
        )
    else:
        metafunc.parametrize("impl", selection, indirect=True, ids=[s.impl.name for s in selection])


@pytest.fixture
def impl(request: pytest.FixtureRequest):
    """The implementation under test (parametrised over the selection)."""
    selected: Selected = request.param
    if selected.skip_reason:
        pytest.skip(selected.skip_reason)
    return selected


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    return run_seed(request.config)


@pytest.fixture
def subject(impl: Selected, seed: int, request: pytest.FixtureRequest) -> Subject:
    """The implementation under test, bound to this test's random stream and reproducer."""
    return Subject(impl.impl, impl.selector, seed, request.node.nodeid)


def item_claims(item: pytest.Item) -> list[str]:
    return [claim for marker in item.iter_markers("claim") for claim in marker.args]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    catalogue = load_catalogue()
    problems = []
    for item in items:
        if CONFORMANCE_DIR not in Path(item.path).parents:
            continue
        claims = item_claims(item)
        if not claims:
            problems.append(f"{item.nodeid}: no @pytest.mark.claim(...) marker")
        problems += [f"{item.nodeid}: unknown claim {c!r}" for c in claims if c not in catalogue]
        subject = item.callspec.params["impl"].impl.name if _has_impl(item) else MATHEMATICS
        item.user_properties.append(("attnspec_subject", subject))
        item.user_properties.append(("attnspec_claims", ",".join(claims)))
    if problems:
        raise pytest.UsageError(
            "attnspec: badly marked conformance tests:\n  " + "\n  ".join(problems)
        )

    patterns = config.getoption("claims")
    if patterns:
        unmatched = [p for p in patterns if not catalogue.matching([p])]
        if unmatched:
            raise pytest.UsageError(
                f"attnspec: --claims {', '.join(unmatched)} matches no claim; "
                f"claims are: {', '.join(c.id for c in catalogue)}"
            )
        keep, drop = [], []
        for item in items:
            claims = item_claims(item)
            wanted = any(fnmatch.fnmatchcase(c, p) for c in claims for p in patterns)
            (keep if wanted or not claims else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


def _has_impl(item: pytest.Item) -> bool:
    return hasattr(item, "callspec") and "impl" in item.callspec.params


def _property(report: pytest.TestReport, key: str) -> str | None:
    return next((value for name, value in report.user_properties if name == key), None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report: pytest.TestReport = yield
    if report.when != "call" or not report.failed or not item_claims(item):
        return report
    catalogue = load_catalogue()
    levels = {catalogue[c].level for c in item_claims(item) if c in catalogue}
    strict = bool(item.config.getoption("strict", False))
    tolerated = {"INFO"} if strict else {"SHOULD", "INFO"}
    if levels and levels <= tolerated:
        # A SHOULD (or INFO) claim not met is reported as an expected failure, not a failure.
        level = "SHOULD" if "SHOULD" in levels else "INFO"
        first_line = str(report.longrepr).strip().splitlines()[0] if report.longrepr else ""
        report.outcome = "skipped"
        report.wasxfail = f"{level} claim not met: {first_line}"
        report.user_properties.append(("attnspec_unmet", level))
    return report


class VerdictRecorder:
    """Feeds every test report into the run's :class:`Ledger` and prints its summary."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        subject = _property(report, "attnspec_subject")
        if subject is None or not (
            report.when == "call" or (report.when == "setup" and not report.passed)
        ):
            return
        if _property(report, "attnspec_unmet"):
            outcome = "unmet"
        elif report.skipped:
            outcome = "skipped"
        else:
            outcome = report.outcome
        reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        claims = (_property(report, "attnspec_claims") or "").split(",")
        self.ledger.record(subject, [c for c in claims if c], outcome, report.nodeid, reason)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.ledger.implementations_checked() == 0 and self.ledger.implementation_records():
            # Every selected implementation was skipped: a green run here would claim conformance
            # that nothing showed.
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.ledger.records:
            return
        terminalreporter.section("attnspec: verdict per implementation")
        for line in self.ledger.summary_lines():
            terminalreporter.write_line(line)
        if self.ledger.implementations_checked() == 0 and self.ledger.implementation_records():
            terminalreporter.write_line(
                "attnspec: nothing was checked: every selected implementation was skipped "
                "(exit status 5)",
                red=True,
            )
