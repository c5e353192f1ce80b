"""The pytest wiring of attnspec (loaded by ``conftest.py``): hooks and fixtures that delegate.

``pytest_configure`` reads the options once into a :class:`Run` kept under one stash key; every
other hook hands it to the module that does the work: :mod:`conformance.run` (settings,
selection, collection, recording), :mod:`conformance.judge` (the first call's check, the subject
bound to a test) and :mod:`conformance.report` (header, JSON and HTML reports).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from conformance.bench.options import add_bench_options, is_bench_run
from conformance.judge.harness import Document, Subject
from conformance.judge.preflight import broken_implementations
from conformance.judge.truth import TRUTH
from conformance.report import summary_lines, write_reports
from conformance.report.header import header_lines
from conformance.run.collection import (
    CLAIM_MARKER,
    claims_of,
    fold_broken,
    inputs_id,
    is_attnspec_run,
    is_conformance_test,
    marking_problems,
    row_of,
    selected_of,
    split_by_claims,
    suite_test_id,
)
from conformance.run.first_failure import FirstFailures, failure_rank
from conformance.run.judge_files import judge_directory
from conformance.run.ledger import Ledger
from conformance.run.options import add_to_pytest
from conformance.run.profiles import active_profile
from conformance.run.provenance import foreign_code
from conformance.run.recording import (
    IMPLEMENTATION_FAILURES,
    NOTES_KEY,
    TestNotes,
    VerdictRecorder,
    complete_report,
    message_only_failure,
)
from conformance.run.selection import Selected, select
from conformance.run.settings import RunSettings
from conformance.run.threads import describe as describe_shared_cores
from conformance.run.threads import share_cores
from conformance.run.worker_clients import BrokenAtFirstCall, LayoutNotChecked
from impls.messages import Description
from impls.registry import RegistryError
from spec.catalogue import Catalogue, load_catalogue

DESCRIPTIONS_INPUT = "attnspec_descriptions"  # the controller's descriptions, for xdist workers
TRUTH_INPUT = "attnspec_truth"  # the controller's truth directory, for xdist workers
TRUTH_SECRET_INPUT = "attnspec_truth_secret"  # and the key its entries are sealed under
SEED_INPUT = "attnspec_seed"  # the controller's seed (drawn there for --attnspec-seed random)


@dataclass
class Run:
    """What one pytest process knows of the run."""

    settings: RunSettings
    catalogue: Catalogue
    selection: list[Selected]
    ledger: Ledger
    broken: dict[str, str] = field(default_factory=dict)  # name -> its first call's failure
    owns_truth: bool = False  # whether this process made TRUTH's directory (and removes it)
    threads_note: str | None = None  # the header's line when the run set thread counts
    first_failures: FirstFailures = field(default_factory=FirstFailures)  # --first-failure


RUN_KEY = pytest.StashKey[Run]()
OPTION_NAMES: list[str] = []  # attnspec's own options, as the command line spells them


def pytest_addoption(parser: pytest.Parser) -> None:
    OPTION_NAMES[:] = add_to_pytest(parser)
    add_bench_options(parser)


@pytest.hookimpl(tryfirst=True)  # before hypothesis's plugin loads the profile named
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{CLAIM_MARKER}(*ids): the catalogue claim(s) a conformance test checks"
    )
    if not is_attnspec_run(config, OPTION_NAMES):
        return  # another project's tests, in an environment where attnspec is installed
    if is_bench_run(config):
        return  # a bench (conformance.bench.in_pytest): it opens its own workers
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        # Failure messages print values, not NumPy 2's np.float64(...) reprs.
        np.set_printoptions(legacy="1.25")
    try:
        profile = active_profile(config.getoption("hypothesis_profile", None))
    except ValueError as exc:
        raise pytest.UsageError(f"attnspec: {exc}") from None
    settings = RunSettings.from_config(config, profile)
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:  # the controller's seed, which --attnspec-seed random drew
        settings = dataclasses.replace(settings, seed=worker_input[SEED_INPUT])
    confinement = settings.confinement()
    if settings.require_sandbox and confinement.level != "full":
        raise pytest.UsageError(
            f"attnspec: --require-sandbox, but workers would run {confinement.describe()}"
        )
    foreign = foreign_code(config) if settings.require_sandbox and worker_input is None else []
    if foreign:
        raise pytest.UsageError(
            "attnspec: --require-sandbox, but this pytest loaded code from outside the suite "
            f"before attnspec could stop it: {'; '.join(foreign)}. Judge untrusted code with "
            "`attnspec run --impl PATH.py:ATTR`, which loads none of it (docs/isolation.md)"
        )
    described = worker_input.get(DESCRIPTIONS_INPUT) if worker_input else None
    try:
        selection = select(
            settings.impl_options,
            in_process=settings.in_process,
            sandbox=settings.sandbox,
            call_timeout=settings.call_timeout,
            setup=settings.worker_setup,
            descriptions={
                selector: Description.from_plain(plain)
                for selector, plain in json.loads(described).items()
            }
            if described
            else None,
        )
    except RegistryError as exc:
        raise pytest.UsageError(f"attnspec: {exc}") from None
    unconfined = [s for s in selection if not s.client.sandbox.startswith("full")]
    if settings.require_sandbox and unconfined and worker_input is None:
        for selected in selection:
            selected.client.close()
        raise pytest.UsageError(
            "attnspec: --require-sandbox, but "
            + "; ".join(f"{s.client.name}'s worker ran {s.client.sandbox}" for s in unconfined)
        )
    catalogue = load_catalogue()
    ledger = Ledger(catalogue, [s.client.name for s in selection])
    ledger.unconfined = {
        s.client.name: s.client.sandbox
        for s in selection
        if not s.client.sandbox.startswith("full")
    }
    run = Run(settings, catalogue, selection, ledger)
    config.stash[RUN_KEY] = run
    if worker_input is not None:
        shared = worker_input.get(TRUTH_INPUT)
        TRUTH.directory = Path(shared) if shared else None
        TRUTH.secret = bytes.fromhex(worker_input[TRUTH_SECRET_INPUT])
    elif settings.truth_cache:
        TRUTH.directory = Path(tempfile.mkdtemp(prefix="truth-", dir=judge_directory()))
        run.owns_truth = True
    if worker_input is None:  # a plain run, or the xdist controller: it gathers the verdicts
        finish = partial(_write_reports, run)
        summarise = partial(summary_lines, run.ledger, run.selection, run.settings)
        config.pluginmanager.register(
            VerdictRecorder(run.ledger, finish, summarise), "attnspec-verdicts"
        )
        if _distributed(config):
            # The controller calls no implementation: its xdist workers start their own.
            for selected in selection:
                selected.client.channel.close()
            processes = _xdist_workers(config)
            chosen = share_cores(processes)
            if chosen:
                run.threads_note = describe_shared_cores(chosen, processes)
            config.pluginmanager.register(
                WorkerInputs(selection, settings.seed), "attnspec-worker-inputs"
            )


def _write_reports(run: Run, session: pytest.Session) -> None:
    write_reports(run.ledger, run.selection, run.settings, session.exitstatus)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    controller = getattr(config, "workerinput", None) is None
    if run is not None and run.ledger.records and controller and run.settings.report_html:
        terminalreporter.write_line(f"attnspec: HTML report written to {run.settings.report_html}")
    if run is not None and run.owns_truth and run.ledger.records:
        terminalreporter.write_line(
            f"attnspec: float64 truth: {TRUTH.entries()} entries, each computed once for the "
            f"{len(run.selection)} implementation(s) judged"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    for selected in run.selection if run else ():
        selected.client.close()
    if run is not None and run.owns_truth:
        shutil.rmtree(TRUTH.directory, ignore_errors=True)
        TRUTH.directory = None


class WorkerInputs:
    """On the xdist controller: hands each worker what the implementations declared, so that
    workers start an implementation's process only when they call it, and the directory of the
    run's shared truth."""

    def __init__(self, selection: list[Selected], seed: int):
        self.descriptions = json.dumps(
            {s.selector: s.client.description.as_plain() for s in selection}
        )
        self.seed = seed

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput[DESCRIPTIONS_INPUT] = self.descriptions
        node.workerinput[TRUTH_INPUT] = str(TRUTH.directory) if TRUTH.directory else ""
        node.workerinput[TRUTH_SECRET_INPUT] = TRUTH.secret.hex()
        node.workerinput[SEED_INPUT] = self.seed


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return []
    lines = header_lines(run.catalogue, run.settings, run.selection)
    return lines + ([run.threads_note] if run.threads_note else [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "selected" not in metafunc.fixturenames or RUN_KEY not in metafunc.config.stash:
        return
    selection = metafunc.config.stash[RUN_KEY].selection
    if "dtype" in metafunc.fixturenames:
        pairs = [(s, dtype) for s in selection for dtype in s.client.capabilities.dtypes]
        ids = [f"{s.client.name}-{dtype}" for s, dtype in pairs]
        metafunc.parametrize(["selected", "dtype"], pairs, indirect=["selected"], ids=ids)
    else:
        ids = [s.client.name for s in selection]
        metafunc.parametrize("selected", selection, indirect=True, ids=ids)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if is_bench_run(config) and any(map(is_conformance_test, items)):
        raise pytest.UsageError(
            "attnspec: a bench times an implementation, and judges nothing: run it alone, "
            "python -m pytest --pyargs conformance.bench.in_pytest --bench-impl SELECTOR"
        )
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return
    problems = marking_problems(items, run.catalogue)
    if problems:
        raise pytest.UsageError(
            "attnspec: badly marked conformance tests:\n  " + "\n  ".join(problems)
        )
    if config.pluginmanager.hasplugin("xdist"):
        # With --dist loadgroup, one worker runs all of an implementation's tests. Without
        # xdist the marker is unknown, and --strict-markers would make it an error.
        for item in filter(is_conformance_test, items):
            item.add_marker(pytest.mark.xdist_group(row_of(item)))
    run.broken.update(broken_implementations(run.selection))
    for selected in run.selection:
        # Each later call fails with the sentence, once the test has skipped what the
        # implementation does not declare: those claims are not checked, not failed.
        selected.client.broken = run.broken.get(selected.client.name)
    for split in (
        partial(fold_broken, broken=run.broken),
        partial(split_by_claims, patterns=run.settings.claim_patterns),
    ):
        items[:], dropped = split(items)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
    if run.settings.first_failure:
        items.sort(key=lambda item: failure_rank(claims_of(item)))


@pytest.fixture
def selected(request: pytest.FixtureRequest) -> Selected:
    """The implementation under test (parametrised over the selection)."""
    selected: Selected = request.param
    if selected.skip_reason:
        pytest.skip(selected.skip_reason)
    if selected.client.crashed:
        pytest.skip(f"{selected.client.name} {selected.client.crashed}")
    run = request.config.stash[RUN_KEY]
    if run.settings.first_failure and (
        why := run.first_failures.why_not_judged(selected.client.name)
    ):
        pytest.skip(why)
    selected.client.take_output()  # what it printed before this test is not this test's
    selected.client.take_restarts()  # nor the restarts of its worker
    return selected


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    return request.config.stash[RUN_KEY].settings.seed


@pytest.fixture
def subject(selected: Selected, request: pytest.FixtureRequest) -> Subject:
    """The implementation under test, bound to this test's claims, random stream and
    reproducer."""
    return _subject(selected, request)


@pytest.fixture
def document(request: pytest.FixtureRequest) -> Document:
    """The document itself, as the subject of a test of its mathematics."""
    return Document(suite_test_id(request.node), tuple(claims_of(request.node)), _notes(request))


def _subject(selected: Selected, request: pytest.FixtureRequest) -> Subject:
    settings = request.config.stash[RUN_KEY].settings
    return Subject(
        selected.client,
        selected.selector,
        settings.seed,
        suite_test_id(request.node),
        tuple(claims_of(request.node)),
        settings.rerun_options(),
        _notes(request),
        inputs_id(request.node),
        notes_regimes=settings.report_json is not None,
    )


def _notes(request: pytest.FixtureRequest) -> TestNotes:
    return request.node.stash.setdefault(NOTES_KEY, TestNotes())


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    try:
        return (yield)
    except LayoutNotChecked as unavailable:
        pytest.skip(f"not checked: {unavailable}")
    except IMPLEMENTATION_FAILURES as error:
        subject = pyfuncitem.funcargs.get("subject")
        if isinstance(error, BrokenAtFirstCall):
            pyfuncitem.stash.setdefault(NOTES_KEY, TestNotes()).broken = str(error)
        raise message_only_failure(error, subject.reproducer if subject else None) from None


@pytest.hookimpl(wrapper=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """At -qq (``attnspec run`` without -v) no letter per test: the verdict per implementation
    that closes the run is the answer, and a screen of dots only pushes it out of sight."""
    status = yield
    if status and RUN_KEY in config.stash and config.get_verbosity() <= -2:
        category, _, word = status
        return category, "", word
    return status


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report: pytest.TestReport = yield
    run = item.config.stash.get(RUN_KEY, None)
    if run is None:
        return report
    subject = getattr(item, "funcargs", {}).get("subject")
    selected = selected_of(item)
    output = selected.client.take_output() if report.when == "call" and selected else ""
    if report.when == "call" and selected:
        note_restarts(report, selected.client)
        if report.failed and interpreter_bfloat16(item):
            report.longrepr = f"{report.longreprtext}\n{INTERPRETER_BFLOAT16}"
    report = complete_report(
        item,
        call,
        report,
        run.catalogue,
        run.settings.fail_on_should,
        subject.reproducer if subject is not None else None,
        output,
    )
    if run.settings.first_failure and report.failed and selected is not None:
        run.first_failures.note(selected.client.name, claims_of(item), suite_test_id(item))
    return report


INTERPRETER_BFLOAT16 = (
    "note: TRITON_INTERPRET=1, and Triton's interpreter multiplies bfloat16 tl.dot operands as "
    "raw bits (triton-lang/triton#11584): a Triton kernel's bfloat16 answers are wrong here "
    "whatever the kernel. Judge bfloat16 on a GPU, or declare it there only."
)


def interpreter_bfloat16(item: pytest.Item) -> bool:
    """Whether ``item`` judged bfloat16 where Triton's interpreter runs the kernels."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("dtype") == "bfloat16" and os.environ.get("TRITON_INTERPRET") == "1"


def note_restarts(report: pytest.TestReport, client) -> None:
    """Say in a failed test's message where a call of it left the worker suspect (it was
    restarted before the next call: conformance.run.worker_clients.worker_left_suspect)."""
    restarts = client.take_restarts()
    if restarts and report.failed:
        report.longrepr = f"{report.longreprtext}\n" + "\n".join(restarts)


def _xdist_workers(config: pytest.Config) -> int:
    """How many xdist workers the run starts: one per --tx gateway (``2*popen`` is two), which
    is what xdist makes of -n N."""
    count = 0
    for spec in getattr(config.option, "tx", None) or []:
        times, star, _ = spec.partition("*")
        count += int(times) if star and times.isdigit() else 1
    return count or int(config.option.numprocesses)


def _distributed(config: pytest.Config) -> bool:
    """Whether this run hands its tests to pytest-xdist workers."""
    return config.pluginmanager.hasplugin("xdist") and bool(
        getattr(config.option, "tx", None) or getattr(config.option, "numprocesses", None)
    )
