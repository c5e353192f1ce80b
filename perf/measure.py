"""Shared steps of the performance tests: inputs, validation before timing, table rows."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.harness import Case, Subject
from conformance.tolerance import compare_to_oracle
from impls.registry import RegistryError, resolve
from perf.gates import Gate
from perf.timing import attention_flops


def available(name: str):
    """The implementation called ``name``, or a skip naming why it cannot run here."""
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


def validate(impl, case: Case, arrays, native) -> float:
    """Fail before any timing unless the output is within its tolerance budget; the budget
    fraction used."""
    out = impl.to_numpy(impl.attention(*native, causal=case.causal, scale=case.scale))
    comparison = compare_to_oracle(
        np.asarray(out, np.float64), *arrays, dtype=case.dtype, causal=case.causal
    )
    if not comparison.ok:
        pytest.fail(
            f"{impl.name} is wrong at the timed shape, so it is not timed: {comparison.describe()}"
        )
    return comparison.budget_fraction


def shape_text(case: Case) -> str:
    return (
        f"B={case.batch} H={case.heads} T={case.tq} D={case.head_dim} {case.dtype}"
        f"{' causal' if case.causal else ''}"
    )


def rate(case: Case, seconds: float, unit: str = "GFLOP/s") -> str:
    scale = {"GFLOP/s": 1e9, "TFLOP/s": 1e12}[unit]
    flops = attention_flops(case.batch, case.heads, case.tq, case.tk, case.head_dim, case.causal)
    return f"{flops / seconds / scale:.1f} {unit}"
