"""The pytest wiring of attnspec: options, markers, parametrisation, fixtures, header, summary.

Hooks only; the logic lives in :mod:`conformance.run`, :mod:`conformance.judge` and
:mod:`conformance.report`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
from pathlib import Path

import numpy as np
import pytest

from conformance.judge.harness import Subject
from conformance.judge.preflight import preflight_failure
from conformance.report.json_report import build_report, report_path_problem, write_report
from conformance.run.ledger import MATHEMATICS, Ledger
from conformance.run.selection import ENV_VAR, Selected, select
from conformance.run.selection import claim_patterns as selection_claim_patterns
from conformance.run.workers import (
    DEFAULT_CALL_TIMEOUT,
    ImplementationBroke,
    ImplementationDied,
    ImplementationRaised,
)
from impls.registry import RegistryError
from spec.catalogue import load_catalogue

CONFORMANCE_DIR = Path(__file__).parent
SELECTION_KEY = pytest.StashKey[list]()
LEDGER_KEY = pytest.StashKey[Ledger]()
BROKEN_KEY = pytest.StashKey[dict]()  # implementation name -> its preflight failure
DESCRIPTIONS_INPUT = "attnspec_descriptions"  # the controller's descriptions, for xdist workers
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
        metavar="PATTERN[,PATTERN...]",
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
        "--report-json",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the verdict per implementation and claim as JSON (schema attnspec-report/1, "
        "documented in conformance/report/json_report.py) to PATH. Default: no file.",
    )
    group.addoption(
        "--report-html",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a self-contained HTML report (the matrix, the environment, the document's "
        "figures; plots need matplotlib) to PATH. Default: no file.",
    )


def call_timeout_value(text: str) -> float:
    """The ``--call-timeout`` parser: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}, but should be a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g}, but should be > 0 seconds")
    return value


def pytest_configure(config: pytest.Config) -> None:
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        # Failure messages print values, not NumPy 2's np.float64(...) reprs.
        np.set_printoptions(legacy="1.25")
    config.addinivalue_line(
        "markers", "claim(*ids): the catalogue claim(s) a conformance test checks"
    )
    claim_patterns(config)  # a bad pattern is a usage error before any worker starts
    for option in ("report_json", "report_html"):
        path = config.getoption(option)
        problem = report_path_problem(path) if path is not None else None
        if problem:
            flag = "--" + option.replace("_", "-")
            raise pytest.UsageError(f"attnspec: {flag} {path}: {problem}")
    run_seed(config)
    worker_input = getattr(config, "workerinput", None)
    described = worker_input.get(DESCRIPTIONS_INPUT) if worker_input else None
    try:
        selection = select(
            config.getoption("impl"),
            in_process=config.getoption("in_process"),
            call_timeout=config.getoption("call_timeout"),
            descriptions=json.loads(described) if described else None,
        )
    except RegistryError as exc:
        raise pytest.UsageError(f"attnspec: {exc}") from None
    config.stash[SELECTION_KEY] = selection
    config.stash[BROKEN_KEY] = {}
    config.stash[LEDGER_KEY] = Ledger(load_catalogue(), [s.impl.name for s in selection])
    if worker_input is None:  # a plain run, or the xdist controller: it gathers the verdicts
        config.pluginmanager.register(VerdictRecorder(config), "attnspec-verdicts")
        if _distributed(config):
            # The controller calls no implementation: its xdist workers start their own.
            for item in selection:
                item.impl.channel.close()
            config.pluginmanager.register(DescriptionSharer(config), "attnspec-descriptions")
    if settings is not None and not config.getoption("hypothesis_profile", None):
        settings.load_profile("ci")


def pytest_unconfigure(config: pytest.Config) -> None:
    for item in config.stash.get(SELECTION_KEY, []):
        item.impl.close()


class DescriptionSharer:
    """On the xdist controller: hands each worker what the implementations declared, so that
    workers start an implementation's process only when they call it."""

    def __init__(self, config: pytest.Config):
        self.descriptions = json.dumps(
            {s.selector: s.impl.description for s in config.stash[SELECTION_KEY]}
        )

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[DESCRIPTIONS_INPUT] = self.descriptions


def claim_patterns(config: pytest.Config) -> list[str]:
    """The ``--claims`` patterns, comma-separated or repeated; each must match a claim."""
    patterns = selection_claim_patterns(config.getoption("claims"))
    catalogue = load_catalogue()
    unmatched = [p for p in patterns if not catalogue.matching([p])]
    if unmatched:
        raise pytest.UsageError(
            f"attnspec: --claims {', '.join(unmatched)} matches no claim; "
            f"claims are: {', '.join(c.id for c in catalogue)}"
        )
    return patterns


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
        seed = config.getoption("hypothesis_seed", None)
        lines.append(
            f"attnspec: hypothesis profile {settings._current_profile}, "
            + (f"--hypothesis-seed {seed}" if seed is not None else "no --hypothesis-seed")
        )
    if config.getoption("in_process"):
        lines.append(
            "attnspec: implementations run IN THE JUDGE'S PROCESS (--in-process): a crash, hang "
            "or patched module can lose or change the verdict"
        )
    else:
        timeout = config.getoption("call_timeout")
        lines.append(
            "attnspec: each implementation runs in a worker process of its own; call deadline "
            + (
                f"{timeout:g} s (--call-timeout)"
                if timeout
                else f"as each declares, else {DEFAULT_CALL_TIMEOUT:g} s"
            )
        )
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
    if selected.impl.crashed:
        pytest.skip(f"{selected.impl.name} {selected.impl.crashed}")
    broken = request.config.stash[BROKEN_KEY].get(selected.impl.name)
    if broken:
        test = Subject(
            selected.impl, selected.selector, run_seed(request.config), request.node.nodeid
        )
        pytest.fail(f"{broken}\nreproduce: {test.reproducer()}", pytrace=False)
    selected.impl.take_output()  # what it printed before this test is not this test's
    return selected


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    return run_seed(request.config)


@pytest.fixture
def subject(impl: Selected, seed: int, request: pytest.FixtureRequest) -> Subject:
    """The implementation under test, bound to this test's random stream and reproducer."""
    return Subject(impl.impl, impl.selector, seed, request.node.nodeid, hypothesis_options(request))


def hypothesis_options(request: pytest.FixtureRequest) -> str:
    """The hypothesis options a rerun needs, when not the defaults (property-based tests draw
    their cases inside the test, so any test may depend on them)."""
    if settings is None:
        return ""
    options = []
    if settings._current_profile != "ci":
        options.append(f"--hypothesis-profile {settings._current_profile}")
    seed = request.config.getoption("hypothesis_seed", None)
    if seed is not None:
        options.append(f"--hypothesis-seed {seed}")
    return " ".join(options)


def item_claims(item: pytest.Item) -> list[str]:
    return [claim for marker in item.iter_markers("claim") for claim in marker.args]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    catalogue = load_catalogue()
    problems = []
    xdist_loaded = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if CONFORMANCE_DIR not in Path(item.path).parents:
            continue
        claims = item_claims(item)
        if not claims:
            problems.append(f"{item.nodeid}: no @pytest.mark.claim(...) marker")
        problems += [f"{item.nodeid}: unknown claim {c!r}" for c in claims if c not in catalogue]
        subject = item.callspec.params["impl"].impl.name if _has_impl(item) else MATHEMATICS
        if xdist_loaded:
            # With --dist loadgroup, one worker runs all of an implementation's tests. Without
            # xdist the marker is unknown, and --strict-markers would make it an error.
            item.add_marker(pytest.mark.xdist_group(subject))
        item.user_properties.append(("attnspec_subject", subject))
        item.user_properties.append(("attnspec_claims", ",".join(claims)))
    if problems:
        raise pytest.UsageError(
            "attnspec: badly marked conformance tests:\n  " + "\n  ".join(problems)
        )

    fold_broken_implementations(config, items)
    patterns = claim_patterns(config)
    if patterns:
        keep, drop = [], []
        for item in items:
            claims = item_claims(item)
            wanted = any(fnmatch.fnmatchcase(c, p) for c in claims for p in patterns)
            (keep if wanted or not claims else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep


def fold_broken_implementations(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An implementation whose first call breaks the contract (returns a list, None, a wrong
    shape) would fail every test the same way: it fails one test per claim, saying so once, and
    its other tests are deselected. The first call is the same in every process, so serial and
    parallel runs agree."""
    broken: dict[str, str] = config.stash[BROKEN_KEY]
    for selected in config.stash[SELECTION_KEY]:
        if selected.skip_reason:
            continue
        failure = preflight_failure(selected.impl)
        if failure:
            broken[selected.impl.name] = failure
    if not broken:
        return
    keep, drop, claims_kept = [], [], set()
    for item in items:
        name = item.callspec.params["impl"].impl.name if _has_impl(item) else None
        if name not in broken:
            keep.append(item)
            continue
        new_claims = {(name, c) for c in item_claims(item)} - claims_kept
        if new_claims:
            claims_kept |= new_claims
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _distributed(config: pytest.Config) -> bool:
    """Whether this run hands its tests to pytest-xdist workers."""
    return config.pluginmanager.hasplugin("xdist") and bool(
        getattr(config.option, "tx", None) or getattr(config.option, "numprocesses", None)
    )


def _has_impl(item: pytest.Item) -> bool:
    return hasattr(item, "callspec") and "impl" in item.callspec.params


def _property(report: pytest.TestReport, key: str) -> str | None:
    return next((value for name, value in report.user_properties if name == key), None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report: pytest.TestReport = yield
    subject = getattr(item, "funcargs", {}).get("subject")
    selected = item.callspec.params.get("impl") if _has_impl(item) else None
    if report.when == "call" and selected is not None and not isinstance(selected, str):
        output = selected.impl.take_output()
        if output and report.failed:
            report.sections.append(
                (f"output of {selected.impl.name} (its worker's stdout and stderr)", output)
            )
    if call.excinfo is not None and isinstance(
        call.excinfo.value, ImplementationRaised | ImplementationBroke | ImplementationDied
    ):
        # The implementation's failure, not the judge's: its words and how to reproduce them,
        # without the judge's frames.
        error = call.excinfo.value
        text = str(error)
        if isinstance(error, ImplementationRaised) and error.trace:
            text += "\n" + error.trace.rstrip()
        if subject is not None:
            text += f"\nreproduce: {subject.reproducer()}"
        report.longrepr = text
    if report.when == "call" and getattr(subject, "worst_budget_fraction", None) is not None:
        report.user_properties.append(("attnspec_budget_fraction", subject.worst_budget_fraction))
    if report.when == "call" and getattr(subject, "conventions", None):
        followed = ",".join(
            f"{name}={value}" for name, value in sorted(subject.conventions.items())
        )
        report.user_properties.append(("attnspec_conventions", followed))
    if report.when != "call" or not report.failed or not item_claims(item):
        return report
    notes = getattr(call.excinfo.value, "__notes__", None) if call.excinfo else None
    if notes:
        # A message-only failure does not print the exception's notes, where hypothesis puts
        # the falsifying example and its @reproduce_failure blob.
        report.sections.append(("exception notes (hypothesis)", "\n".join(notes)))
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

    def __init__(self, config: pytest.Config):
        self.config = config
        self.ledger: Ledger = config.stash[LEDGER_KEY]

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
        fraction = _property(report, "attnspec_budget_fraction")
        message = report.longreprtext if outcome in ("failed", "unmet") else ""
        self.ledger.record(
            subject, [c for c in claims if c], outcome, report.nodeid, reason, fraction, message
        )
        for pair in filter(None, (_property(report, "attnspec_conventions") or "").split(",")):
            self.ledger.note_convention(subject, *pair.split("=", 1))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.ledger.implementations_checked() == 0 and self.ledger.implementation_records():
            # Every selected implementation was skipped: a green run here would claim conformance
            # that nothing showed.
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        json_path = self.config.getoption("report_json")
        html_path = self.config.getoption("report_html")
        if json_path is None and html_path is None:
            return
        report = build_report(
            self.ledger,
            self.config.stash[SELECTION_KEY],
            seed=run_seed(self.config),
            hypothesis_profile=settings._current_profile if settings is not None else None,
            exit_status=session.exitstatus,
            reported_env=REPORTED_ENV,
        )
        if json_path is not None:
            write_report(json_path, report)
        if html_path is not None:
            from conformance.report.html import write_html  # matplotlib only when asked for

            write_html(html_path, report)

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
