"""A call's damage stays in that call: the preflight runs in a worker of its own, and a worker is
restarted after a call that may have broken it (a raise from inside its array library, a broken
contract, non-finite output for finite inputs) and after a failed test."""

from __future__ import annotations

import re

import numpy as np

from conformance.run.worker_clients import library_of_innermost_frame, worker_left_suspect
from impls.messages import Answered, Broke, Call, InputArray, OutputArray, Raised
from tests.suite_process import run_suite


def failed_tests(stdout: str, name: str) -> set[str]:
    return {
        test.replace(name, "IMPL")
        for test in re.findall(r"^FAILED (\S+)", stdout, flags=re.MULTILINE)
    }


def test_a_kernel_that_corrupts_its_worker_gets_the_verdicts_of_one_that_does_not():
    """Once, the preflight's call at T = 16 corrupted the worker every test then ran in, and
    claims whose tests pass in a clean process failed with the corruption's nonsense."""
    runs = {
        name: run_suite("--impl", f"tests.planted.corrupting:{name}", "-q", "-rf")
        for name in ("wrong_at_16", "corrupts_its_worker_at_16")
    }
    for result in runs.values():
        assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    clean, corrupting = (
        failed_tests(result.stdout, f"tests.planted.corrupting:{name}")
        for name, result in runs.items()
    )
    assert clean, runs["wrong_at_16"].stdout[-3000:]
    assert corrupting == clean, runs["corrupts_its_worker_at_16"].stdout[-5000:]
    assert "empty() takes 1 positional argument" not in runs["corrupts_its_worker_at_16"].stdout
    assert "for finite inputs: its worker was restarted" in runs["corrupts_its_worker_at_16"].stdout


def call_of(*arrays: np.ndarray, op: str = "attention") -> Call:
    return Call(op, tuple(InputArray(a, "float32") for a in arrays), {})


def answer_of(array: np.ndarray) -> Answered:
    return Answered((OutputArray(array, "float32", "cpu", "cpu"),))


def test_what_leaves_a_worker_suspect():
    finite, with_nan = np.ones((1, 1, 2, 2)), np.full((1, 1, 2, 2), np.nan)
    assert worker_left_suspect(call_of(finite, finite, finite), answer_of(finite)) is None
    assert worker_left_suspect(call_of(finite, finite, finite), answer_of(with_nan)) == (
        "returned 4 non-finite values in output 0 for finite inputs"
    )
    # NaN in, NaN out: what the claims on non-finite inputs judge, not a broken process
    assert worker_left_suspect(call_of(with_nan, finite, finite), answer_of(with_nan)) is None
    assert worker_left_suspect(call_of(finite), Broke("a list")) == "broke the contract"
    own = 'Traceback:\n  File "/home/me/mykernel.py", line 3, in attention\n'
    library = own + '  File "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", line 9\n'
    assert worker_left_suspect(call_of(finite), Raised("ValueError", "no", own)) is None
    assert worker_left_suspect(call_of(finite), Raised("RuntimeError", "illegal", library)) == (
        "raised RuntimeError from inside torch"
    )
    assert library_of_innermost_frame(library) == "torch"
    assert library_of_innermost_frame(own) is None
