"""The same verdicts on any CPU: the suite on the NumPy built-ins and the zoo's correct variants,
and the diagnosis and tolerance tests, run as this machine computes and again as narrower x86-64
machines do.

A verdict that holds only on the CPU where the suite was written is a false FAIL for whoever has
another: a correct kernel once failed a MUST claim on an AVX2 machine because a test asked for bit
identity between calls of different shapes, which BLAS blocks and sums in other orders there.
NumPy dispatches its loops by CPU feature groups at run time and honours
``$NPY_DISABLE_CPU_FEATURES``; OpenBLAS picks its kernels by ``$OPENBLAS_CORETYPE``. Switching
both down makes this machine compute as an AVX2 machine and as an AVX one would:

    python -m tests.cpu_paths            # tox -e cpu-paths

It exits 1 when a configuration's verdict on any (implementation, claim) differs from the native
run's, when a correct member does not conform, or when a diagnosis or tolerance test fails there.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from tests.suite_process import run_module, run_suite
from tests.zoo import load_members

BUILTINS = ("numpy_reference", "numpy_flash", "numpy")
# The project's tests whose premises a machine's rounding could decide: which mistake explains a
# failure, and which kernels a budget lets through.
PREMISE_TESTS = ("tests/test_diagnosis.py", "tests/test_tolerance.py")

# NumPy 2.4's dispatch targets above the x86-64-v2 baseline: X86_V3 is the AVX2 group, X86_V4
# and the AVX512_* groups the AVX-512 ones. OpenBLAS's Haswell kernels use AVX2 and FMA, its
# Sandybridge ones AVX alone.
AVX512_GROUPS = "X86_V4 AVX512_ICL AVX512_SPR"
CONFIGURATIONS: dict[str, dict[str, str | None]] = {
    "native": {},
    "AVX2 machine": {
        "NPY_DISABLE_CPU_FEATURES": AVX512_GROUPS,
        "OPENBLAS_CORETYPE": "Haswell",
    },
    "AVX machine": {
        "NPY_DISABLE_CPU_FEATURES": f"X86_V3 {AVX512_GROUPS}",
        "OPENBLAS_CORETYPE": "Sandybridge",
    },
}


def numpy_dispatch() -> str:
    """The dispatch targets NumPy uses in this process, after $NPY_DISABLE_CPU_FEATURES."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return " ".join(group for group in __cpu_dispatch__ if __cpu_features__[group]) or "baseline"


def blas_kernels() -> str:
    """The BLAS this process's NumPy calls and the kernels it chose, as threadpoolctl reads them
    (``openblas Haswell``)."""
    from threadpoolctl import threadpool_info

    found = [
        f"{pool.get('internal_api', '?')} {pool.get('architecture') or ''}".strip()
        for pool in threadpool_info()
        if pool.get("user_api") == "blas"
    ]
    return ", ".join(found) or "no BLAS that threadpoolctl knows"


def how_this_machine_computes() -> str:
    """One line for a failed premise: the BLAS kernels and NumPy's dispatch in this process."""
    return f"BLAS {blas_kernels()}; NumPy dispatch {numpy_dispatch()}"


def premise(holds: bool, what: str) -> None:
    """Asserts a test's premise, which is no claim of the suite's: where it fails, one line says
    which premise and how this machine computes, so that a reader tells a premise that holds only
    on some CPUs from a broken check."""
    assert holds, f"premise failed: {what} [{how_this_machine_computes()}]"


def judged_members() -> list[str]:
    """The selectors judged in every configuration: the built-ins and each correct variant."""
    correct = [m.selector for m in load_members().values() if m.correct]
    return [*BUILTINS, *correct]


def verdicts_of(report: dict) -> dict[tuple[str, str], str]:
    """{(implementation, claim): verdict} of a JSON report."""
    return {
        (subject["name"], claim): entry["verdict"]
        for subject in report["subjects"]
        if subject["selector"] is not None
        for claim, entry in subject["claims"].items()
    }


def run_configuration(
    name: str, environ: dict[str, str | None], selectors: list[str], workers: int
) -> tuple[dict, list[str]]:
    """The suite's JSON report on ``selectors`` and the failures of :data:`PREMISE_TESTS`, both
    run with ``environ`` over this process's environment."""
    probe = run_module("tests.cpu_paths", "--probe", env=environ, timeout=60)
    if probe.returncode != 0:
        raise RuntimeError(f"{name}: NumPy does not start there: {probe.stderr[-800:]}")
    blas = environ.get("OPENBLAS_CORETYPE") or "the machine's"
    print(f"cpu-paths: {name}: NumPy's {probe.stdout.strip()}, {blas} OpenBLAS kernels", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.json"
        args = ["--impl", ",".join(selectors), "--report-json", str(report_path), "-q"]
        args += ["--tb=no", "-rN", "--hypothesis-profile", "verdicts", "-n", str(workers)]
        suite = run_suite(*args, timeout=1800, env_overrides=environ)
        if not report_path.exists():
            raise RuntimeError(
                f"{name}: the suite wrote no report (exit {suite.returncode}):\n"
                + (suite.stdout + suite.stderr)[-3000:]
            )
        report = json.loads(report_path.read_text(encoding="utf-8"))
    diagnosis = run_module(
        "pytest", *PREMISE_TESTS, "-q", "-p", "no:cacheprovider", "--tb=line",
        "-n", str(workers), env=environ, timeout=900,
    )  # fmt: skip
    failures = [line for line in diagnosis.stdout.splitlines() if line.startswith("FAILED")]
    if diagnosis.returncode not in (0, 1) or (diagnosis.returncode == 1 and not failures):
        failures.append(f"{' '.join(PREMISE_TESTS)} exited {diagnosis.returncode}")
    return report, failures


def problems_against_native(
    name: str, report: dict, native: dict[tuple[str, str], str], correct: set[str]
) -> list[str]:
    """How a configuration's verdicts differ from the native run's, and which correct member
    does not conform there."""
    problems = []
    verdicts = verdicts_of(report)
    for key in sorted(set(native) | set(verdicts)):
        here, there = verdicts.get(key, "absent"), native.get(key, "absent")
        if here != there:
            problems.append(f"{name}: {key[0]} {key[1]} is {here}, natively {there}")
    for subject in report["subjects"]:
        if subject["selector"] in correct and subject["verdict"] != "conforms":
            problems.append(f"{name}: correct {subject['name']} {subject['verdict']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cpu_paths", description=__doc__)
    parser.add_argument(
        "-n",
        dest="workers",
        type=int,
        default=2,
        metavar="N",
        help="pytest-xdist workers for each run (default: %(default)s)",
    )
    parser.add_argument(
        "--impl",
        metavar="SELECTOR[,SELECTOR...]",
        help="judge only these (default: the NumPy built-ins and every correct zoo variant)",
    )
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.probe:
        print(numpy_dispatch())
        return 0
    if options.workers < 1:
        parser.error(f"-n {options.workers}, but should be >= 1")
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        print(
            f"cpu-paths: NOT RUN: the configurations are x86-64's, and this is "
            f"{platform.machine()}; run it on an x86-64 machine"
        )
        return 1
    selectors = options.impl.split(",") if options.impl else judged_members()
    correct = {m.selector for m in load_members().values() if m.correct}
    correct |= set(BUILTINS)
    native: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    for name, environ in CONFIGURATIONS.items():
        started = time.perf_counter()
        report, failures = run_configuration(name, environ, selectors, options.workers)
        verdicts = verdicts_of(report)
        if not native:
            native = verdicts
        found = problems_against_native(name, report, native, correct)
        found += [f"{name}: {line}" for line in failures]
        problems += found
        seconds = time.perf_counter() - started
        print(
            f"cpu-paths: {name}: {len(verdicts)} verdicts on {len(selectors)} implementations, "
            f"{len(found)} problem(s), {seconds:.0f} s",
            flush=True,
        )
    for problem in problems:
        print(f"cpu-paths: {problem}")
    print(f"cpu-paths: {len(problems)} problem(s) in {len(CONFIGURATIONS)} configurations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
