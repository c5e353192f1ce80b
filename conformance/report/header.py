"""The report header: the claims, the seed, how implementations run, each implementation under
test with its version and capabilities, and every environment variable that can change a result."""

from __future__ import annotations

import os
import platform

from conformance.run.selection import Selected
from conformance.run.settings import REPORTED_ENV, RunSettings
from spec.catalogue import Catalogue


def header_lines(
    catalogue: Catalogue, settings: RunSettings, selection: list[Selected]
) -> list[str]:
    levels: dict[str, int] = {}
    for claim in catalogue:
        levels[claim.level] = levels.get(claim.level, 0) + 1
    lines = [
        f"attnspec: {len(catalogue)} claims ("
        + ", ".join(f"{n} {level}" for level, n in levels.items())
        + f"), seed {settings.seed}, python {platform.python_version()}",
    ]
    if settings.hypothesis_profile is not None:
        seed = settings.hypothesis_seed
        lines.append(
            f"attnspec: hypothesis profile {settings.hypothesis_profile}, "
            + (f"--hypothesis-seed {seed}" if seed is not None else "no --hypothesis-seed")
        )
    if settings.in_process:
        lines.append(
            "attnspec: implementations run IN THE JUDGE'S PROCESS (--in-process): a crash, hang "
            "or patched module can lose or change the verdict"
        )
    else:
        lines.append(
            "attnspec: each implementation runs in a worker process of its own; call deadline "
            + settings.call_deadline()
        )
    lines.append(f"attnspec: sandbox: {workers_confinement(settings, selection)}")
    if not settings.in_process:
        lines.append(settings.workers_line())
    lines.append(
        "attnspec: the float64 truth is computed once per inputs and shared"
        if settings.truth_cache
        else "attnspec: the float64 truth is computed in every test (--no-truth-cache)"
    )
    for selected in selection:
        client = selected.client
        status = f"SKIPPED: {selected.skip_reason}" if selected.skip_reason else "runs"
        lines.append(
            f"attnspec impl {client.name}: {client.version()}, {client.family} on "
            f"{client.device}; {client.capabilities.describe()}; {status}"
        )
    env = [f"{name}={os.environ[name]}" for name in REPORTED_ENV if name in os.environ]
    lines.append(
        "attnspec env: " + (" ".join(env) if env else "(none of " + ", ".join(REPORTED_ENV) + ")")
    )
    return lines


def workers_confinement(settings: RunSettings, selection: list[Selected]) -> str:
    """How far the run's workers were confined: as the fork server saw the first that was not
    fully, else as expected (no worker started yet, or every one fully)."""
    expected = settings.confinement().describe()
    if settings.in_process or not expected.startswith("full"):
        return expected
    seen = [s.client.sandbox for s in selection if not s.client.unavailable_reason()]
    return next((sandbox for sandbox in seen if not sandbox.startswith("full")), expected)
