"""Running the conformance suite in a subprocess, as a user would, for the project's own tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_suite(
    *args: str, timeout: float = 600, env_overrides: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess:
    """``python -m pytest conformance ARGS`` from the repository root, output captured; a
    variable overridden with None is removed from its environment."""
    return run_module(
        "pytest", "conformance", "-p", "no:cacheprovider", *args, timeout=timeout, env=env_overrides
    )


def run_attnspec(*args: str) -> subprocess.CompletedProcess:
    """The ``attnspec`` command with ARGS (``python -m conformance``), from the repository root."""
    return run_module("conformance", *args)


def run_module(
    module: str, *args: str, timeout: float = 600, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` from the repository root, output captured; a variable set to
    None in ``env`` is removed from its environment."""
    merged = dict(os.environ) | (env or {})
    environ = {name: value for name, value in merged.items() if value is not None}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    environ.pop("ATTNSPEC_IMPL", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
