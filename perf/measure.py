"""Shared steps of the performance tests: inputs, validation before timing, table rows."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conformance.bench.cli import machine_for as bench_machine_for
from conformance.bench.gates import Gate
from conformance.bench.measure import INCONCLUSIVE, PASSES, WrongAnswer, bench_shape
from conformance.bench.roofline import Machine
from conformance.bench.timing import attention_flops
from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import compare_to_oracle
from conformance.run.worker_clients import ImplementationClient, open_clients
from impls.registry import RegistryError, resolve

WORKER_CLIENTS: list[ImplementationClient] = []  # closed when the run ends (perf/conftest.py)


def in_worker(name: str) -> ImplementationClient:
    """The implementation called ``name`` behind a confined worker of its own (what the CPU gates
    time, so that it cannot touch the judge's clock), or a skip naming why it cannot run here."""
    try:
        [client] = open_clients([name])
    except RegistryError as exc:
        pytest.skip(f"{name} is not available: {exc}")
    reason = client.unavailable_reason()
    if reason:
        client.close()
        pytest.skip(f"{name} cannot run here: {reason}")
    WORKER_CLIENTS.append(client)
    return client


def close_worker_clients() -> None:
    while WORKER_CLIENTS:
        WORKER_CLIENTS.pop().close()


def available(name: str):
    """The implementation called ``name`` in this process (the GPU measurements, whose CUDA
    events must share its context), or a skip naming why it cannot run here."""
    try:
        impl = resolve(name)
    except RegistryError as exc:
        pytest.skip(f"{name} is not available: {exc}")
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(f"{name} cannot run here: {reason}")
    return impl


def gate_case(gate: Gate) -> Case:
    return Case(
        batch=gate.batch,
        heads=gate.heads,
        tq=gate.t,
        head_dim=gate.head_dim,
        dtype=gate.dtype,
        causal=gate.causal,
    )


def native_inputs(impl, case: Case, seed: int = 0):
    """(float64 q, k, v) and the implementation's own arrays of them."""
    subject = Subject(impl, impl.name, seed, test_id="perf")
    q, k, v = subject.inputs(case)
    return (q, k, v), subject.to_native(case, q, k, v)


def validate(impl, case: Case, arrays, native, *, heads_checked: int | None = None) -> float:
    """Fail before any timing unless the output is within its tolerance budget; the budget
    fraction used. ``heads_checked=n`` judges only the first n heads of the first batch entry
    against the float64 oracle, where the whole output would take the oracle minutes."""
    out = np.asarray(
        impl.to_numpy(impl.attention(*native, causal=case.causal, scale=case.scale)), np.float64
    )
    if heads_checked is not None:
        out = out[:1, :heads_checked]  # (1, n, Tq, Dv)
        arrays = [a[:1, :heads_checked] for a in arrays]
    comparison = compare_to_oracle(out, *arrays, dtype=case.dtype, causal=case.causal)
    if not comparison.ok:
        pytest.fail(
            f"{impl.name} is wrong at the timed shape, so it is not timed: {comparison.describe()}"
        )
    return comparison.budget_fraction


def check_gate(
    gate: Gate, perf_table: list, *, repeats: int = 21, unit: str = "GFLOP/s"
) -> float | None:
    """The gate measured as ``attnspec bench --gates`` measures it (conformance.bench: each side
    in its worker, fresh inputs every call, answers checked, the worker's clock checked by the
    judge's and the roofline), its rows added to the table; fails where the subject is wrong,
    the gate FAILS or a timing is not credible, skips where the ratio's interval straddles the
    gate. The ratio, where there is one."""
    subject, baseline = in_worker(gate.subject), in_worker(gate.baseline)
    shape = gate.shape()
    machine = machine_for(subject.device, gate.dtype)
    try:
        result = bench_shape(
            subject, baseline, shape, gate.dtype, machine, rounds=repeats,
            causal=gate.causal, max_ratio=gate.max_time_ratio,
        )  # fmt: skip
    except WrongAnswer as exc:
        pytest.fail(f"{gate.id}: {exc}", pytrace=False)
    case = gate_case(gate)
    for side in result.sides:
        perf_table.append(
            (gate.id, side.name, shape_text(case), milliseconds(side.median),
             rate(case, side.median, unit), f"{side.fraction_of_bound:.2f} of the roofline"),
        )  # fmt: skip
    for side in result.sides:
        if side.why_not:  # require_timing puts it in the table where timings only report
            require_timing(False, f"{gate.id}: {side.why_not}", perf_table)
    if result.ratio is None:
        return None
    r = result.ratio
    perf_table.append(
        (gate.id, "ratio", "", "", "", f"{r.median:.2f} [{r.low:.2f}, {r.high:.2f}] <= "
         f"{gate.max_time_ratio:g}: {result.verdict}"),
    )  # fmt: skip
    if result.verdict == INCONCLUSIVE:
        pytest.skip(
            f"{gate.id}: inconclusive: the ratio's 95% interval [{r.low:.2f}, {r.high:.2f}] "
            f"straddles the gate's {gate.max_time_ratio:g} (a noisy machine)"
        )
    require_timing(
        result.verdict == PASSES,
        f"{gate.id}: {subject.name} took {r.median:.2f}x {baseline.name}'s median time "
        f"(95% interval {r.low:.2f}-{r.high:.2f}), but the gate is {gate.describe()}. Why this "
        f"number: {gate.reason}",
        perf_table,
    )
    return r.median


MACHINES: dict[tuple[str, str], Machine] = {}  # measured once per run


def machine_for(device: str, dtype: str) -> Machine:
    if (device, dtype) not in MACHINES:
        MACHINES[device, dtype] = bench_machine_for(device, dtype)
    return MACHINES[device, dtype]


REPORT_ONLY_VAR = "ATTNSPEC_TIMINGS"  # "report": a missed gate is reported, not a failure


def timings_report_only() -> bool:
    return os.environ.get(REPORT_ONLY_VAR, "") == "report"


def require_timing(ok: bool, message: str, perf_table: list) -> None:
    """Fail with ``message`` unless ``ok``; where timings only report (the README's test
    command on a shared machine, where a timing says nothing about the project), put the miss
    in the table, loudly, instead."""
    if ok:
        return
    if timings_report_only():
        perf_table.append(("MISSED", "", "", "", "", f"{message} ({REPORT_ONLY_VAR}=report)"))
        return
    pytest.fail(message, pytrace=False)


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


def shape_text(case: Case) -> str:
    return (
        f"B={case.batch} H={case.heads} T={case.tq} D={case.head_dim} {case.dtype}"
        f"{' causal' if case.causal else ''}"
    )


def flop_rate(case: Case, seconds: float) -> float:
    """FLOP/s of one attention call of ``case`` taking ``seconds``."""
    flops = attention_flops(case.batch, case.heads, case.tq, case.tk, case.head_dim, case.causal)
    return flops / seconds


def rate(case: Case, seconds: float, unit: str = "GFLOP/s") -> str:
    scale = {"GFLOP/s": 1e9, "TFLOP/s": 1e12}[unit]
    return f"{flop_rate(case, seconds) / scale:.1f} {unit}"
