"""CPU performance: the gates of gates.toml for the CPU, and a benchmark of each CPU built-in."""

from __future__ import annotations

import pytest

from conformance.bench.gates import load_gates
from perf.measure import (
    check_gate,
    gate_case,
    in_worker,
    milliseconds,
    native_inputs,
    rate,
    shape_text,
    validate,
)

pytestmark = pytest.mark.perf

CPU_GATES = [gate for gate in load_gates() if gate.device == "cpu"]
CPU_BUILTINS = ["numpy", "numpy_flash", "torch_eager", "torch_sdpa"]
# A shared CPU drifts over tens of seconds: more rounds spread each median over a longer window,
# so that one slow stretch moves it less.
CPU_GATE_REPEATS = 41


@pytest.mark.parametrize("gate", CPU_GATES, ids=[gate.id for gate in CPU_GATES])
def test_cpu_gate(gate, perf_table):
    check_gate(gate, perf_table, repeats=CPU_GATE_REPEATS)


@pytest.mark.parametrize("name", CPU_BUILTINS)
def test_cpu_benchmark(name, benchmark, perf_table):
    """pytest-benchmark's timing of one built-in at the ANDREA layer shape (save and compare runs
    with --benchmark-autosave / --benchmark-compare)."""
    impl = in_worker(name)  # timed by the judge's clock, through the worker's line
    case = gate_case(CPU_GATES[0])
    arrays, native = native_inputs(impl, case)
    validate(impl, case, arrays, native)
    benchmark.pedantic(
        impl.attention,
        args=native,
        kwargs={"causal": True, "scale": None},
        rounds=7,
        warmup_rounds=1,
    )
    seconds = benchmark.stats.stats.median
    perf_table.append(
        ("benchmark", name, shape_text(case), milliseconds(seconds), rate(case, seconds), "")
    )
