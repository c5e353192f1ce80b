"""The run's settings: attnspec's options (conformance/run/options.py) read once into one
:class:`RunSettings` that every hook and fixture shares."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance.run.memory_watch import MEMORY_BOUND
from conformance.run.options import DEFAULT_SEED, SEED_VAR, seed_value
from conformance.run.selection import ENV_VAR
from conformance.run.worker_clients import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_IMPL_BUDGET,
    WorkerSetup,
    bounds_given,
    format_bytes,
)
from impls.sandbox import (
    NAMESPACE_NAMES,
    WORKER_VARIABLES,
    Confinement,
    expected_confinement,
)

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
    first_failure: bool
    truth_cache: bool
    worker_setup: WorkerSetup
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
            first_failure=config.getoption("first_failure"),
            truth_cache=not config.getoption("no_truth_cache"),
            worker_setup=worker_setup(config),
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

    def workers_plain(self) -> dict:
        """What the workers were given, for the JSON report (how far they were confined is the
        report's to add: it knows what the fork servers saw)."""
        setup = self.worker_setup
        bounded = setup.memory_bytes is not None and self.sandbox
        return {
            "memory_bytes": setup.memory_bytes if self.sandbox else None,
            "memory_bound": MEMORY_BOUND if bounded else None,
            "disk_bytes": setup.disk_bytes if self.sandbox else None,
            "tasks": setup.tasks if self.sandbox else None,
            "namespaces": list(NAMESPACE_NAMES) if self.sandbox else [],
            "impl_budget_seconds": setup.budget_seconds,
            "variables": [*WORKER_VARIABLES, *setup.pass_env] if self.sandbox else ["(all)"],
            "impl_paths": list(setup.impl_paths),
        }

    def workers_line(self) -> str:
        """The report header's line on what a worker gets."""
        setup = self.worker_setup
        if not self.sandbox:
            return "attnspec: workers get the judge's whole environment, no memory bound"
        memory = format_bytes(setup.memory_bytes) if setup.memory_bytes else "no bound"
        budget = f"{setup.budget_seconds:g} s" if setup.budget_seconds else "no budget"
        passed = f", and {', '.join(setup.pass_env)} (--pass-env)" if setup.pass_env else ""
        if setup.memory_bytes:
            memory += f" ({MEMORY_BOUND})"
        disk = f"a scratch tmpfs of {format_bytes(setup.disk_bytes)}" if setup.disk_bytes else (
            "no disk bound"
        )  # fmt: skip
        tasks = f"{setup.tasks} processes and threads" if setup.tasks else "no bound on tasks"
        return (
            f"attnspec: workers: memory {memory}, {disk}, {tasks}, calls {budget} per "
            "implementation, their own "
            f"{', '.join(NAMESPACE_NAMES)} namespaces (no network, a /dev/shm and a /proc of "
            "their own), "
            f"of the environment PATH, the loader's, CUDA's, thread and locale variables{passed}"
        )

    def call_deadline(self) -> str:
        """The call deadline in words, for the report header."""
        if self.call_timeout:
            return f"{self.call_timeout:g} s (--call-timeout)"
        return f"as each declares, else {DEFAULT_CALL_TIMEOUT:g} s"


def worker_setup(config: pytest.Config) -> WorkerSetup:
    """What the run's workers are given: --impl-path's directories and those of selectors that
    name a file, --pass-env, --worker-memory and --impl-budget (0: none)."""
    paths = list(config.getoption("impl_path") or ())
    for value in config.getoption("impl") or ():
        for selector in value.split(","):
            file = file_of_selector(selector.strip())
            if file is not None:
                paths.append(str(file.parent))
    budget = config.getoption("impl_budget")
    return WorkerSetup(
        impl_paths=tuple(dict.fromkeys(paths)),
        pass_env=tuple(config.getoption("pass_env") or ()),
        budget_seconds=DEFAULT_IMPL_BUDGET if budget is None else (budget or None),
        **bounds_given(config.getoption),
    )


def file_of_selector(selector: str) -> Path | None:
    """The file a selector such as ``./mykernel.py:attention`` names, or None for a module's."""
    module, _, _ = selector.partition(":")
    return Path(module).resolve() if module.endswith(".py") else None


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
