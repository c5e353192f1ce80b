"""Parallel and distributed runs give the serial run's verdicts; hypothesis failures reproduce."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.run import threads
from tests.made_once import made_once, session_directory
from tests.suite_process import ROOT

SELECTION = (
    "--impl",
    "numpy,tests.zoo.mutants:mask_off_by_one,tests.zoo.mutants:stale_accumulator",
    "--claims",
    "MASK-*,SOFTMAX-*,OUT-FORMULA",
    # the mutants' failures unshrunk: which claims fail is compared, not the smallest example
    "--hypothesis-profile",
    "verdicts",
)


def verdicts(report_path) -> dict:
    report = json.loads(report_path.read_text())
    return {
        subject["name"]: {claim: entry["verdict"] for claim, entry in subject["claims"].items()}
        for subject in report["subjects"]
    }


@pytest.fixture(scope="module")
def serial_verdicts(tmp_path_factory):
    from tests.suite_process import run_suite

    def run_serially(path: Path) -> None:
        run = run_suite(*SELECTION, "--report-json", str(path), "-q", "--tb=no")
        assert run.returncode == 1, run.stdout[-2000:]  # the two mutants fail

    # Under xdist every worker holding one of these tests asks for the serial run: the first runs
    # it for all.
    shared = session_directory(tmp_path_factory) / "parallel-serial-report.json"
    return verdicts(made_once(shared, run_serially))


@pytest.mark.parametrize(
    "distribution",
    [("-n", "2"), ("--dist", "loadgroup", "-n", "2"), ("--dist", "load", "--tx", "2*popen")],
    ids=["n2", "loadgroup", "two-popen-gateways"],
)
def test_distributed_run_gives_the_serial_verdicts(suite, serial_verdicts, tmp_path, distribution):
    path = tmp_path / "report.json"
    # Started as a user would, with no thread counts set (the xdist run of these tests sets them
    # for its own workers); the header, which -q leaves out, says what the run set.
    run = suite(
        *SELECTION, *distribution, "--report-json", str(path), "--tb=no",
        env_overrides=dict.fromkeys(threads.THREAD_VARIABLES),
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert verdicts(path) == serial_verdicts
    assert "FAILED" in serial_verdicts["tests.zoo.mutants:mask_off_by_one"].values()
    # Each process got its share of the cores: the report records every thread variable.
    recorded = json.loads(path.read_text())["environment"]["env"]
    assert set(threads.THREAD_VARIABLES) <= set(recorded), recorded
    assert "attnspec: 2 xdist workers on" in run.stdout, run.stdout[:3000]


def test_a_distributed_run_shares_the_cores_and_keeps_what_the_user_set(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    environ = {"OMP_NUM_THREADS": "3"}
    assert threads.share_cores(2, environ) == {"OPENBLAS_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}
    assert environ["OMP_NUM_THREADS"] == "3"
    assert threads.share_cores(16, {}) == dict.fromkeys(threads.THREAD_VARIABLES, "1")
    with pytest.raises(ValueError, match="processes=0, but should be >= 1"):
        threads.share_cores(0, {})


def test_hypothesis_seed_reproduces_a_failure_exactly(suite):
    args = (
        "--impl",
        "tests.zoo.mutants:scale_from_padded_head_dim",
        "-k",
        "test_formula_on_generated_cases and float64",
        "--hypothesis-profile",
        "dev",
        "--hypothesis-seed",
        "4242",
    )
    first, second = suite(*args), suite(*args)
    assert first.returncode == second.returncode == 1, first.stdout[-2000:]
    assert "hypothesis profile dev, --hypothesis-seed 4242" in first.stdout  # the header
    assert "--attnspec-seed 20261129 --hypothesis-profile dev --hypothesis-seed 4242" in (
        first.stdout  # the reproducer
    )
    # The falsifying example and its reproduction blob, as hypothesis words them (which changes
    # between its versions), from the failure report's notes section.
    notes = [
        re.findall(r"exception notes \(hypothesis\) -+\n(.*?)\n=+ ", run.stdout, re.S)
        for run in (first, second)
    ]
    assert notes[0], first.stdout[-3000:]
    assert "case=Case(" in notes[0][0]
    assert notes[0] == notes[1]


SHARED_RUN = """
import os, sys, time
from pathlib import Path
from tests.zoo.kill_matrix import run_once_shared

def compute():
    with open(sys.argv[2], "a") as calls:
        calls.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # long enough for the other processes to ask meanwhile
    return {"computed_by": os.getpid()}

print(run_once_shared(Path(sys.argv[1]), compute)["computed_by"])
"""


def test_the_zoo_runs_once_however_xdist_spreads_its_tests(tmp_path):
    """Three processes ask for the shared record at once (as xdist workers holding zoo tests
    do): one computes it, all three read the same."""
    record, calls = tmp_path / "zoo-run.json", tmp_path / "calls"
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    asking = [
        subprocess.Popen(
            [sys.executable, "-c", SHARED_RUN, str(record), str(calls)],
            cwd=ROOT,
            env=environ,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    answers = {process.communicate(timeout=60)[0].strip() for process in asking}
    computed = calls.read_text().split()
    assert len(computed) == 1, f"the record was computed {len(computed)} times, but should be once"
    assert answers == set(computed), f"the processes read {answers}, computed by {computed}"


def test_a_random_seed_is_drawn_once_for_the_run_and_named_in_every_reproducer(suite):
    """--attnspec-seed random, for judging a kernel as a reward: a fresh seed each run, the same
    in every xdist worker, printed in the header and in each reproducer."""
    seeds = []
    for _ in range(2):
        run = suite(
            "--impl",
            "tests.zoo.mutants:top_left_alignment",
            "--claims",
            "OUT-FORMULA",
            "--attnspec-seed",
            "random",
            "-n",
            "2",
            "--hypothesis-profile",
            "verdicts",
        )
        assert run.returncode == 1, run.stdout[-3000:]
        (seed,) = re.findall(r"^attnspec: \d+ claims .*, seed (\d+),", run.stdout, re.MULTILINE)
        reproduced = set(re.findall(r"--attnspec-seed (\d+)", run.stdout))
        assert reproduced == {seed}, reproduced
        seeds.append(seed)
    assert seeds[0] != seeds[1]
