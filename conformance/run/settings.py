"""The run's settings: attnspec's options (conformance/run/options.py) read once into one
:class:`RunSettings` that every hook and fixture shares."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance.run.options import DEFAULT_SEED, SEED_VAR, seed_value
from conformance.run.selection import ENV_VAR
from conformance.run.worker_clients import DEFAULT_CALL_TIMEOUT
from impls.sandbox import Confinement, expected_confinement

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
