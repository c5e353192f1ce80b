"""Triton kernels under the interpreter: the GPU their host code asks about stands in as named,
and decides the path judged; a bfloat16 failure there says that the interpreter's tl.dot is
the cause."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.suite_process import ROOT, run_suite

pytestmark = [
    pytest.mark.optional_libraries,
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
        reason="needs triton and torch",
    ),
]
INTERPRETER = {"TRITON_INTERPRET": "1"}

ASKED = """
from impls.triton_host import install_stand_in
device = install_stand_in("H100")
import torch, triton
print(device.describe())
print(torch.cuda.get_device_capability(), torch.cuda.get_device_properties(0).multi_processor_count)
print(triton.runtime.driver.active.get_current_target().arch)
print(triton.runtime.driver.active.utils.get_device_properties(0)["multiprocessor_count"])
"""


def test_the_host_code_is_answered_as_the_stand_in_would():
    result = subprocess.run(
        [sys.executable, "-c", ASKED], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, **INTERPRETER},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:4] == [
        "the interpreter standing in for an NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)",
        "(9, 0) 132",
        "90",
        "132",
    ]


def test_the_path_judged_is_the_stand_ins():
    """A kernel that splits its keys on more than 100 SMs, wrongly: judged as on an A100 it
    fails, as on an L4 it conforms, and the report names the GPU each stood in for."""
    verdicts = {}
    for name in ("SplitOnManySMs", "SplitOnManySMsAsL4"):
        result = run_suite(
            "--impl", f"tests.planted.triton_split:{name}", "--claims", "SCORE-DOT",
            env_overrides=INTERPRETER,  # not -q: the header names each implementation's version
        )  # fmt: skip
        verdicts[name] = result
    a100, l4 = verdicts["SplitOnManySMs"], verdicts["SplitOnManySMsAsL4"]
    assert a100.returncode == 1, a100.stdout[-3000:] + a100.stderr[-2000:]
    assert l4.returncode == 0, l4.stdout[-3000:] + l4.stderr[-2000:]
    assert "standing in for an NVIDIA A100-SXM4-80GB (sm_80, 108 SMs)" in a100.stdout
    assert "standing in for an NVIDIA L4 (sm_89, 58 SMs)" in l4.stdout


def test_a_bfloat16_failure_under_the_interpreter_names_its_cause():
    result = run_suite(
        "--impl", "tests.planted.triton_bfloat16:DeclaresBfloat16", "--claims", "SCORE-DOT",
        "-q", env_overrides=INTERPRETER,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    text = " ".join(result.stdout.split())
    assert "multiplies bfloat16 tl.dot operands as raw bits (triton-lang/triton#11584)" in text
    assert "bfloat16" in text
