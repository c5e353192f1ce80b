"""CPU performance: the gates of gates.toml for the CPU, and a benchmark of each CPU built-in."""

from __future__ import annotations

import json

import pytest

from conformance.bench.gates import load_gates
from conformance.bench.measure import bench_shape
from conformance.bench.shapes import NAMED_SHAPES
from perf.measure import (
    check_gate,
    gate_case,
    in_worker,
    machine_for,
    milliseconds,
    native_inputs,
    rate,
    require_timing,
    shape_text,
    validate,
)
from tests.suite_process import run_attnspec

pytestmark = pytest.mark.perf

CPU_GATES = [gate for gate in load_gates() if gate.device == "cpu"]
CPU_BUILTINS = ["numpy", "numpy_flash", "torch_eager", "torch_sdpa"]
# A shared CPU drifts over tens of seconds: more rounds spread each median over a longer window,
# so that one slow stretch moves it less.
CPU_GATE_REPEATS = 41


@pytest.mark.parametrize("gate", CPU_GATES, ids=[gate.id for gate in CPU_GATES])
def test_cpu_gate(gate, perf_table):
    check_gate(gate, perf_table, repeats=CPU_GATE_REPEATS)


def test_the_bench_command_measures_the_ratio_the_cpu_gate_does(perf_table, tmp_path):
    """``attnspec bench --impl numpy`` (torch_sdpa its default baseline, the ANDREA shape its
    default) and the CPU gate, measured one after the other in one run: their ratios' intervals
    overlap. A timing, so where timings only report a miss is put in the table."""
    [gate] = [g for g in CPU_GATES if (g.subject, g.baseline) == ("numpy", "torch_sdpa")]
    assert gate.shape().dims == NAMED_SHAPES["andrea"].dims  # the same shape, by two names
    report = tmp_path / "bench.json"
    run = run_attnspec("bench", "--impl", "numpy", "--report-json", str(report))
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 1: not credible on a busy machine
    [command] = json.loads(report.read_text())["results"]
    assert [side["name"] for side in command["implementations"]] == ["numpy", "torch_sdpa"]
    subject, baseline = in_worker("numpy"), in_worker("torch_sdpa")
    machine = machine_for("cpu", gate.dtype)
    gated = bench_shape(subject, baseline, gate.shape(), gate.dtype, machine, rounds=15)
    if command["ratio"] is None or gated.ratio is None:
        require_timing(False, f"a ratio not credible: {run.stdout} {gated.sides}", perf_table)
        return
    low, high = command["ratio"]["low"], command["ratio"]["high"]
    perf_table.append(
        ("bench vs gate", "numpy", shape_text(gate_case(gate)), "", "",
         f"attnspec bench {command['ratio']['median']:.2f} [{low:.2f}, {high:.2f}], the gate's "
         f"path {gated.ratio.median:.2f} [{gated.ratio.low:.2f}, {gated.ratio.high:.2f}]"),
    )  # fmt: skip
    require_timing(
        low <= gated.ratio.high and gated.ratio.low <= high,
        f"attnspec bench measured numpy at {command['ratio']['median']:.2f}x torch_sdpa "
        f"[{low:.2f}, {high:.2f}], the CPU gate's path {gated.ratio.median:.2f}x "
        f"[{gated.ratio.low:.2f}, {gated.ratio.high:.2f}] in the same run: no overlap",
        perf_table,
    )


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
