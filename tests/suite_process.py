"""Running the conformance suite in a subprocess, as a user would, for the project's own tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_suite(
    *args: str, timeout: float = 600, env_overrides: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m pytest conformance ARGS`` from the repository root, output captured."""
    env = dict(os.environ) | (env_overrides or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("ATTNSPEC_IMPL", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
