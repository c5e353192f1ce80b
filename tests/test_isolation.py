"""Nothing an implementation does - crash, hang, raise, print, patch a module - loses or changes
the verdict, for itself or for any other implementation in the run: serial, under xdist, and
through ``attnspec run`` with its defaults."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.run.memory_watch import processes_of
from impls.numpy_vectorised import NumpyVectorised
from spec.catalogue import load_catalogue
from tests.suite_process import ROOT, run_module, run_suite

CRASHING = "tests.planted.crashing"
MEDDLING = "tests.planted.meddling"
MISBEHAVING = [
    f"{CRASHING}:segfaults",
    f"{CRASHING}:exits",
    f"{CRASHING}:sys_exits",
    f"{CRASHING}:hangs",
    f"{MEDDLING}:raises_unittest_skip",
    f"{MEDDLING}:raises_pytest_skip",
    f"{MEDDLING}:raises_keyboard_interrupt",
    f"{MEDDLING}:patches_the_suite",
    f"{MEDDLING}:patches_pytest_fail",
    f"{MEDDLING}:registers_a_plugin",
    f"{MEDDLING}:changes_global_state",
    f"{MEDDLING}:prints_ten_megabytes",
    f"{MEDDLING}:forges_an_answer",
]
# What numpy meets when judged alone: every claim on implementations but the SHOULD it does not
# meet (a dense A @ V spreads a future NaN), the two that need autograd, and the extensions of
# the features it does not declare.
NUMPY_NOT_MET = {
    "MASK-NONFINITE": "unmet",
    "MASK-NONFINITE-VALUES": "unmet",
    "MASK-GRAD": "not checked",
    "OUT-GRAD": "not checked",
    # numpy declares no backward: no gradient claim is checked on it
    **{claim.id: "not checked" for claim in load_catalogue() if claim.group == "gradients"},
    **{
        claim.id: "not checked"
        for claim in load_catalogue()
        if not all(NumpyVectorised.capabilities.declares(flag) for flag in claim.needs)
    },
}
# The verdicts profile: failing implementations' hypothesis failures are not shrunk to minimal
# examples, which no assertion in this module reads.
VERDICTS_ONLY = ("--hypothesis-profile", "verdicts")
# One line per failure, with its sections (an implementation's output among them): pytest's long
# form looks up each failure's teardown among every report, about half a minute over the serial
# run's 2000 failures.
PYTEST = ("pytest", "conformance", "-p", "no:cacheprovider", "--tb=line", *VERDICTS_ONLY)
MODES = {
    "serial": PYTEST,
    "xdist": (*PYTEST, "-n", "2"),
    "attnspec run": ("conformance", "run", "--profile", "verdicts"),
}
# The serial run judges every claim; the other two drive the same workers through other front
# ends, so a few claims with several tests each (enough for a worker to die three times) show
# that those front ends keep the verdicts too, in a quarter of the time.
CLAIMS_OF_MODE = {
    "serial": None,
    "xdist": "OUT-FORMULA,MASK-FUTURE-INVARIANT,SOFTMAX-ROWSUM,CONTRACT-DETERMINISM",
    "attnspec run": "OUT-FORMULA,MASK-FUTURE-INVARIANT,SOFTMAX-ROWSUM,CONTRACT-DETERMINISM",
}


@pytest.mark.parametrize("mode", list(MODES))
def test_misbehaving_implementations_fail_and_spare_the_others(mode, tmp_path):
    report_path = tmp_path / "report.json"
    module, *args = MODES[mode]
    claims = CLAIMS_OF_MODE[mode]
    started = time.monotonic()
    run = run_module(
        module,
        *args,
        *(["--claims", claims] if claims else []),
        "--impl",
        ",".join(["numpy", *MISBEHAVING]),
        "--report-json",
        str(report_path),
        *(["--", "--call-timeout", "5"] if mode == "attnspec run" else ["--call-timeout", "5"]),
        timeout=900,
    )
    elapsed = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-5000:]
    assert "INTERNALERROR" not in output
    verdicts = {s["name"]: s for s in json.loads(report_path.read_text())["subjects"]}
    expected = {
        claim.id: NUMPY_NOT_MET.get(claim.id, "met")
        for claim in load_catalogue()
        if claim.checked_on in ("implementations", "both")
        and (claims is None or claim.id in claims.split(","))
    }
    numpy_claims = {c: e["verdict"] for c, e in verdicts["numpy"]["claims"].items()}
    assert numpy_claims == expected
    for name in MISBEHAVING:
        assert verdicts[name]["verdict"] == "FAILS", (name, verdicts[name])
    assert f"{CRASHING}:segfaults ended its worker process" in output
    assert "SIGSEGV" in output
    assert f"{CRASHING}:exits ended its worker process" in output
    assert "exited with status 3" in output
    assert f"{CRASHING}:hangs did not return from attention() within 5 s: it hangs" in output
    assert "not called again after its worker died 3 times in a row" in output
    # the verdict per implementation wraps its messages at 100 columns
    assert "raised unittest.case.SkipTest: not applicable" in " ".join(output.split())
    assert "raised KeyboardInterrupt" in output
    assert "raised SystemExit: 0" in output
    # The suite's own report grows with its claims; what must stay out is the printer's 10 MB.
    printed = sum(len(run_of_x) for run_of_x in re.findall(r"x{64,}", output))
    assert printed < 1_000_000, f"{printed} of the 10 MB printed by an implementation were shown"
    if mode != "attnspec run":  # which prints the matrix, not pytest's per-test sections
        assert (
            f"output of {MEDDLING}:prints_ten_megabytes (its worker's stdout and stderr)" in output
        )
        assert "bytes not shown ...]" in output
    assert elapsed < 600


def test_the_judge_never_imports_the_implementations_module(tmp_path):
    """A module that patches the suite at import time changes nothing: it is imported in its
    worker only."""
    (tmp_path / "patches_on_import.py").write_text(
        "import conformance.judge.tolerance as t\n"
        "t.Comparison.ok = property(lambda self: True)\n"
        "import numpy as np\n"
        "def attention(q, k, v, *, causal=True, scale=None):\n"
        "    return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)\n"
    )
    run = run_suite(
        "--impl",
        "patches_on_import:attention",
        "--claims",
        "OUT-FORMULA",
        *VERDICTS_ONLY,
        env_overrides={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert "patches_on_import:attention  FAILS" in run.stdout


def test_in_process_mode_says_so_in_the_header():
    run = run_suite("--impl", "numpy", "--claims", "SCORE-SHAPE", "--in-process")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "IN THE JUDGE'S PROCESS (--in-process)" in run.stdout


def test_a_bad_claims_pattern_is_a_usage_error_under_xdist_too(suite):
    run = suite("--impl", "numpy", "--claims", "CONTRACT-DET*,NOPE", "-n", "2")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "--claims: NOPE matches no claim" in run.stderr
    assert "INTERNALERROR" not in run.stdout + run.stderr


# Where the line between judge and judged could change what an implementation gets: the arrays
# it is handed and returns (their dtypes, layouts, the memory behind them) and its errors.
CROSSING_CLAIMS = "OUT-FORMULA,MASK-*,CONTRACT-*,LAYOUT-STRIDES,OUT-WRITTEN"


def test_workers_and_in_process_give_the_same_verdicts(tmp_path):
    """The line between judge and judged changes where implementations run, not what they get."""
    verdicts = {}
    for mode in ("workers", "in-process"):
        report_path = tmp_path / f"{mode}.json"
        run = run_suite(
            "-n",
            "2",
            "--impl",
            "numpy,tests.zoo.mutants:mask_off_by_one",  # a built-in that conforms, a mutant
            "--claims",
            CROSSING_CLAIMS,
            *VERDICTS_ONLY,
            "--report-json",
            str(report_path),
            *(["--in-process"] if mode == "in-process" else []),
        )
        assert run.returncode == 1, run.stdout[-3000:]
        verdicts[mode] = {
            s["name"]: {c: e["verdict"] for c, e in s["claims"].items()}
            for s in json.loads(report_path.read_text())["subjects"]
        }
    assert verdicts["workers"] == verdicts["in-process"]


LEFT_BEHIND = "attnspec-*"  # the workers' output files and the shared truth's directory


@pytest.mark.parametrize(
    ("impls", "extra", "exit_code"),
    [
        ("numpy,no_such_impl", (), 4),
        ("numpy,dies_on_import:attention", (), 4),
        (f"numpy,{CRASHING}:segfaults", ("-n", "2"), 1),
    ],
    ids=["resolves-to-nothing", "dies-while-resolved", "crashes-under-xdist"],
)
def test_a_run_leaves_nothing_in_the_temporary_directory(tmp_path, impls, extra, exit_code):
    """Whatever the implementations did, the run removes what it wrote under TMPDIR: a suite run
    in CI after CI must not fill the disk, one selector that failed to resolve at a time."""
    (tmp_path / "dies_on_import.py").write_text("import os\nos._exit(3)\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    run = run_suite(
        "--impl", impls, "--claims", "OUT-FORMULA", *extra,
        env_overrides={"PYTHONPATH": str(tmp_path), "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert run.returncode == exit_code, run.stdout[-3000:] + run.stderr[-3000:]
    assert not sorted(scratch.glob(LEFT_BEHIND)), f"left behind: {sorted(scratch.glob('*'))}"


def _running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (not zombies)."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z":
            running.append(pid)
    return running


@pytest.mark.skipif(sys.platform != "linux", reason="the fork server and /proc are Linux's")
def test_a_judge_killed_outright_leaves_no_worker_and_the_next_run_removes_its_files(tmp_path):
    """SIGKILL to a judge's process group while its worker hangs in a call: the fork server dies
    with the judge, with no chance to end its workers, and the worker dies with the fork server
    (PR_SET_PDEATHSIG), so no hanging worker stays; the
    judge's directory (its truth, the worker's scratch and output) stays, and the next run
    removes it. Before, each killed judge left its scratch directories, output files and truth
    in /tmp, and a hanging worker ran on."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environ = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(scratch))
    judge = subprocess.Popen(
        [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider",
         "--impl", f"{CRASHING}:hangs", "--claims", "OUT-FORMULA", "--call-timeout", "300"],
        cwd=ROOT, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    # the judge, its fork server and the worker (its relay, its PID namespace's first process)
    while len(processes_of(judge.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # in its call
    started = [pid for pid in processes_of(judge.pid) if pid != judge.pid]
    assert len(started) >= 2, started
    os.killpg(judge.pid, signal.SIGKILL)  # as a CI runner cancels a job: its fork server too
    judge.wait()
    left = sorted(scratch.glob("attnspec-judge-*"))
    assert [path.name.split("-")[2] for path in left] == [str(judge.pid)], left
    while _running(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(started) == [], "the hanging worker outlived its judge"
    run = run_suite(
        "--impl", "numpy", "--claims", "SCORE-SHAPE", env_overrides={"TMPDIR": str(scratch)}
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert not sorted(scratch.glob("attnspec-*")), sorted(scratch.glob("*"))
