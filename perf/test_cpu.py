"""CPU performance: the gates of gates.toml for the CPU, and a benchmark of each CPU built-in."""

from __future__ import annotations

import pytest

from perf.gates import load_gates
from perf.measure import available, gate_case, native_inputs, rate, shape_text, validate
from perf.timing import interleaved

pytestmark = pytest.mark.perf

CPU_GATES = [gate for gate in load_gates() if gate.device == "cpu"]
CPU_BUILTINS = ["numpy", "torch_eager", "torch_sdpa"]


@pytest.mark.parametrize("gate", CPU_GATES, ids=[gate.id for gate in CPU_GATES])
def test_cpu_gate(gate, perf_table):
    subject, baseline = available(gate.subject), available(gate.baseline)
    case = gate_case(gate)
    calls = {}
    for impl in (subject, baseline):
        arrays, native = native_inputs(impl, case)
        validate(impl, case, arrays, native)
        calls[impl.name] = lambda impl=impl, native=native: impl.attention(
            *native, causal=case.causal, scale=None
        )
    timings = interleaved(calls)
    ratio = timings[subject.name].median / timings[baseline.name].median
    verdict = "passes" if ratio <= gate.max_time_ratio else "FAILS"
    for name in calls:
        seconds = timings[name].median
        perf_table.append(
            (gate.id, name, shape_text(case), f"{seconds * 1e3:.1f} ms", rate(case, seconds), "")
        )
    perf_table.append(
        (gate.id, "ratio", "", "", "", f"{ratio:.2f} <= {gate.max_time_ratio:g}: {verdict}")
    )
    assert ratio <= gate.max_time_ratio, (
        f"{gate.id}: {subject.name} took {ratio:.2f}x {baseline.name}'s median time "
        f"({timings[subject.name].median * 1e3:.1f} ms vs "
        f"{timings[baseline.name].median * 1e3:.1f} ms), but the gate is "
        f"{gate.describe()}. Why this number: {gate.reason}"
    )


@pytest.mark.parametrize("name", CPU_BUILTINS)
def test_cpu_benchmark(name, benchmark, perf_table):
    """pytest-benchmark's timing of one built-in at the ANDREA layer shape (save and compare runs
    with --benchmark-autosave / --benchmark-compare)."""
    impl = available(name)
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
        ("benchmark", name, shape_text(case), f"{seconds * 1e3:.1f} ms", rate(case, seconds), "")
    )
