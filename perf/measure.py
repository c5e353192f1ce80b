"""Shared steps of the performance tests: inputs, validation before timing, table rows."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import compare_to_oracle
from conformance.run.worker_clients import ImplementationClient, open_clients
from impls.registry import RegistryError, resolve
from conformance.bench.gates import Gate
from conformance.bench.timing import SETTLE_SECONDS, attention_flops, interleaved
from perf.worker_timing import BATCH, WorkerClock

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
    gate: Gate, perf_table: list, *, timer=None, unit: str = "GFLOP/s", repeats: int = 21
) -> float:
    """Validate the gate's subject and baseline, time them interleaved, add the rows to the
    table and fail unless the subject's median time is within the gate's ratio; the ratio.
    Without a ``timer``, each is timed in its own worker, the worker's clock checked against the
    judge's (perf/worker_timing.py); a CUDA event timer times them in this process."""
    in_workers = timer is None
    find = in_worker if in_workers else available
    subject, baseline = find(gate.subject), find(gate.baseline)
    case = gate_case(gate)
    calls = {}
    for impl in (subject, baseline):
        arrays, native = native_inputs(impl, case)
        validate(impl, case, arrays, native)
        if in_workers:
            calls[impl.name] = WorkerClock(impl, native, case.causal, SETTLE_SECONDS)
        else:
            calls[impl.name] = lambda impl=impl, native=native: impl.attention(
                *native, causal=case.causal, scale=None
            )
    if in_workers:  # a batch of calls a round, about as many calls in all
        rounds = -(-repeats // BATCH)
        timings = interleaved(calls, timer=WorkerClock.timed, repeats=rounds, warmup=1)
    else:
        timings = interleaved(calls, timer=timer, repeats=repeats)
    for clock in calls.values() if in_workers else ():
        problem = clock.contradiction()
        if problem:  # require_timing puts it in the table where timings only report
            require_timing(False, f"{gate.id}: {problem}", perf_table)
    ratio = timings[subject.name].median / timings[baseline.name].median
    verdict = "passes" if ratio <= gate.max_time_ratio else "FAILS"
    for name in calls:
        seconds = timings[name].median
        perf_table.append(
            (gate.id, name, shape_text(case), milliseconds(seconds), rate(case, seconds, unit), "")
        )
    perf_table.append(
        (gate.id, "ratio", "", "", "", f"{ratio:.2f} <= {gate.max_time_ratio:g}: {verdict}")
    )
    require_timing(
        ratio <= gate.max_time_ratio,
        f"{gate.id}: {subject.name} took {ratio:.2f}x {baseline.name}'s median time "
        f"({milliseconds(timings[subject.name].median)} vs "
        f"{milliseconds(timings[baseline.name].median)}), but the gate is "
        f"{gate.describe()}. Why this number: {gate.reason}",
        perf_table,
    )
    return ratio


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
