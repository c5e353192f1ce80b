"""``attnspec.judge``: the verdict from Python, for a loop that generates kernels and rewards them.

It is ``attnspec run`` (the same confined workers, the same isolated judge that imports nothing
of the candidate's directory, the same JSON report), returned as typed objects whose fields are
the report's (``conformance/report/json_report.py``), and, where asked, ``attnspec bench``'s
speed verdict against a baseline::

    import attnspec

    verdict = attnspec.judge("candidates/k17.py:attention", first_failure=True)
    reward = 1.0 if verdict.conforms else 0.0

Nothing the candidate prints or raises reaches the caller but through the verdict; a selector
that names nothing is a ValueError, and a run that ends without a report a RuntimeError that
carries its output.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from conformance.bench.cli import BenchUsageError, run_bench
from conformance.cli import PYTEST_USAGE_ERROR, build_parser, run_judge
from conformance.run.commands import absolute_selector


@dataclass(frozen=True)
class FirstFailure:
    test: str
    message: str
    reproducer: str | None


@dataclass(frozen=True)
class ClaimResult:
    """One claim of one implementation: the report's ``claims[CLAIM_ID]``."""

    id: str
    level: str | None
    verdict: str  # met, FAILED, unmet, not checked
    passed: int
    failed: int
    unmet: int
    skipped: int
    worst_budget_fraction: float | None
    failing_tests: tuple[str, ...]
    skip_reasons: tuple[str, ...]
    first_failure: FirstFailure | None
    diagnosis: tuple[dict, ...]


@dataclass(frozen=True)
class SubjectResult:
    """One implementation's verdict: the report's ``subjects[i]``."""

    name: str
    selector: str | None
    version: str | None
    verdict: str  # conforms, FAILS, NOT RUN
    sandbox: str | None
    broken: str | None
    skip_reason: str | None
    claims: dict[str, ClaimResult]
    worst_budget_fraction_by_dtype: dict[str, float]

    @property
    def conforms(self) -> bool:
        return self.verdict == "conforms"

    @property
    def failed_claims(self) -> list[str]:
        return [claim.id for claim in self.claims.values() if claim.verdict == "FAILED"]


@dataclass(frozen=True)
class BenchResult:
    """``attnspec bench``'s verdict at one shape: its exit status (0 passes, 1 FAILS or not
    credible, 3 inconclusive), the medians in seconds, the ratio with its interval, and what
    went wrong."""

    status: int
    shape: str
    seconds: dict[str, float]
    credible: dict[str, bool]
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    gate: str | None
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    """A run's verdict: every implementation judged, what the workers were given, the bench's
    where asked, pytest's exit status, what the run printed and how long it took."""

    exit_status: int
    subjects: dict[str, SubjectResult]
    workers: dict
    seconds: float
    output: str
    bench: BenchResult | None = None
    report: dict = field(default_factory=dict, repr=False)  # the JSON report itself

    @property
    def conforms(self) -> bool:
        """Every implementation judged conforms (and, where a bench ran, its verdict passed)."""
        judged = [s for s in self.subjects.values() if s.selector is not None]
        speed = self.bench is None or self.bench.status == 0
        return bool(judged) and all(s.conforms for s in judged) and speed

    def __getitem__(self, name: str) -> SubjectResult:
        """An implementation's verdict by its name, or by the selector it was judged by (a
        file's path as given, relative or not)."""
        if name in self.subjects:
            return self.subjects[name]
        return self.subjects[absolute_selector(name)]


def claim_result(claim_id: str, entry: dict) -> ClaimResult:
    first = entry.get("first_failure")
    return ClaimResult(
        id=claim_id,
        level=entry.get("level"),
        verdict=entry["verdict"],
        passed=entry["passed"],
        failed=entry["failed"],
        unmet=entry["unmet"],
        skipped=entry["skipped"],
        worst_budget_fraction=entry.get("worst_budget_fraction"),
        failing_tests=tuple(entry.get("failing_tests", ())),
        skip_reasons=tuple(entry.get("skip_reasons", ())),
        first_failure=FirstFailure(first["test"], first["message"], first.get("reproducer"))
        if first
        else None,
        diagnosis=tuple(entry.get("diagnosis", ())),
    )


def subject_result(entry: dict) -> SubjectResult:
    return SubjectResult(
        name=entry["name"],
        selector=entry.get("selector"),
        version=entry.get("version"),
        verdict=entry["verdict"],
        sandbox=entry.get("sandbox"),
        broken=entry.get("broken"),
        skip_reason=entry.get("skip_reason"),
        claims={cid: claim_result(cid, c) for cid, c in entry.get("claims", {}).items()},
        worst_budget_fraction_by_dtype=dict(entry.get("worst_budget_fraction_by_dtype", {})),
    )


def _selectors(impl: str | os.PathLike | Sequence[str]) -> list[str]:
    if isinstance(impl, (str, os.PathLike)):
        impl = [os.fspath(impl)]
    found = [s.strip() for value in impl for s in str(value).split(",") if s.strip()]
    if not found:
        raise ValueError("attnspec.judge: give an implementation to judge (a selector or a file)")
    return [absolute_selector(selector) for selector in found]


def judge(
    impl: str | os.PathLike | Sequence[str],
    *,
    claims: str | Sequence[str] | None = None,
    seed: int | str = "random",
    first_failure: bool = False,
    require_sandbox: bool = True,
    workers: int | None = None,
    profile: str = "verdicts",
    worker_memory: str | None = None,
    call_timeout: float | None = None,
    impl_paths: Sequence[str | os.PathLike] = (),
    pass_env: Sequence[str] = (),
    bench: str | None = None,
    baseline: str | None = None,
    rounds: int = 15,
) -> Verdict:
    """Judge ``impl`` (a selector such as ``"path/to/kernel.py:attention"`` or
    ``"package.module:attr"``, or several) as ``attnspec run`` does, with the options of the same
    names; ``seed="random"`` by default, as a reward loop should (docs/isolation.md). With
    ``bench`` (a named shape such as ``"andrea"``, or ``"B,H,Hkv,Tq,Tk,D"``), the one
    implementation is also timed against ``baseline`` (default: the bench's) in ``rounds`` calls
    each, only where it conforms. Raises ValueError for options the suite refuses."""
    selectors = _selectors(impl)
    argv = ["run", "--impl", ",".join(selectors), "--seed", str(seed), "--profile", profile]
    if claims:
        argv += ["--claims", claims if isinstance(claims, str) else ",".join(claims)]
    argv += ["--first-failure"] * first_failure + ["--require-sandbox"] * require_sandbox
    argv += ["-n", str(workers)] if workers else []
    argv += ["--worker-memory", worker_memory] if worker_memory else []
    argv += ["--call-timeout", str(call_timeout)] if call_timeout else []
    argv += [arg for path in impl_paths for arg in ("--impl-path", os.fspath(path))]
    argv += [arg for name in pass_env for arg in ("--pass-env", name)]
    if bench is not None and len(selectors) != 1:
        raise ValueError(f"attnspec.judge: bench times one implementation, not {selectors}")
    try:
        options = build_parser().parse_args(argv)
    except SystemExit:
        raise ValueError(f"attnspec.judge: the suite refuses these options: {argv[1:]}") from None
    started = time.perf_counter()
    run = run_judge(options, capture=True)
    if run.status == PYTEST_USAGE_ERROR or run.report is None:
        tail = (run.output or "")[-3000:]
        error = ValueError if run.status == PYTEST_USAGE_ERROR else RuntimeError
        raise error(f"attnspec.judge: the run ended with status {run.status}: {tail}")
    subjects = {s["name"]: subject_result(s) for s in run.report["subjects"]}
    verdict = Verdict(
        exit_status=run.status,
        subjects=subjects,
        workers=run.report.get("workers", {}),
        seconds=time.perf_counter() - started,
        output=run.output or "",
        report=run.report,
    )
    judged = [s for s in subjects.values() if s.selector is not None]
    if bench is None or not judged or not all(s.conforms for s in judged):
        return verdict
    timed = bench_verdict(selectors[0], bench, baseline, rounds, impl_paths)
    return Verdict(**{**vars(verdict), "bench": timed, "seconds": time.perf_counter() - started})


def bench_verdict(
    selector: str, shape: str, baseline: str | None, rounds: int, impl_paths
) -> BenchResult:
    """``attnspec bench --impl selector --shape shape`` as a :class:`BenchResult`."""
    argv = ["bench", "--impl", selector, "--shape", shape, "--rounds", str(rounds)]
    argv += ["--baseline", baseline] if baseline else []
    searched = [*map(os.fspath, impl_paths), os.getcwd()]
    argv += [arg for path in searched for arg in ("--impl-path", path)]
    options: argparse.Namespace = build_parser().parse_args(argv)
    try:
        run = run_bench(options)
    except BenchUsageError as exc:
        raise ValueError(f"attnspec.judge: {exc}") from None
    [result] = run.results or [None]
    if result is None:
        return BenchResult(run.status, shape, {}, {}, None, None, None, None, tuple(run.problems))
    ratio = result.ratio
    return BenchResult(
        status=run.status,
        shape=result.shape.name,
        seconds={side.name: side.median for side in result.sides},
        credible={side.name: side.credible for side in result.sides},
        ratio=ratio.median if ratio else None,
        ratio_low=ratio.low if ratio else None,
        ratio_high=ratio.high if ratio else None,
        gate=result.verdict,
        problems=tuple(run.problems),
    )


__all__ = ["BenchResult", "ClaimResult", "SubjectResult", "Verdict", "judge"]
