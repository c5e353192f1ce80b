"""How a backward pass is judged: one call of the implementation's vjp on a case, its gradients'
shapes, the gradients that must be exactly 0 (keys no row reads, rows that see no key), then
each gradient against the float64 backward (spec.formula.reference_feature_vjp) within its
budget (conformance.judge.tolerance.compare_gradients), a failure diagnosed among the backward's
mistakes (spec.mistakes.gradients).

Every gradient test goes through :func:`assert_gradients_match`: a feature's gradient claim is
a case in ``conformance/test_gradients.py``'s table, not a test of its own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance.judge.assertions import assert_within_budget, fail, with_diagnosis
from conformance.judge.diagnosis import diagnose_gradients
from conformance.judge.harness import Case, Subject
from conformance.judge.regimes import choices_of_call, regimes_of_backward
from conformance.judge.tolerance import compare_gradients
from conformance.run.worker_clients import ImplementationBroke
from spec.dtypes import round_to
from spec.formula import keys_read_and_blind_rows
from spec.mistakes.gradients import GradientCall


def gradient_shapes(case: Case) -> dict[str, tuple[int, ...]]:
    """What a backward of ``case`` returns, in order: dq, dk, dv like q, k, v; dsinks (H,)."""
    shapes = {"q": case.q_shape, "k": case.k_shape, "v": case.v_shape}
    if case.sinks is not None:
        shapes["sinks"] = (case.heads,)
    return shapes


def backward(subject: Subject, case: Case, q, k, v, grad_out, grad_lse=None) -> dict:
    """The implementation's gradients of ``case`` at float64 q, k, v (exact in its dtype), as
    float64 arrays {"q", "k", "v"[, "sinks"]}; ``grad_lse`` as the implementation takes it, in
    its declared base. Skips, naming what is missing, where it declares no backward or not
    what the case needs."""
    subject.require(case, autograd=True)
    if subject.notes_regimes:
        subject.notes.note_regimes(
            regimes_of_backward(case, q, k) | choices_of_call(case, "backward")
        )
    extra = [] if grad_lse is None else [grad_lse]
    natives = subject.to_native(case, q, k, v, grad_out, *extra)
    answer = subject.client.vjp(
        *natives[:4],
        causal=case.causal,
        scale=case.scale,
        grad_lse=natives[4] if extra else None,
        # the call's keywords, as the forward gets them: not the declared conventions the
        # truth reads (sparse_duplicates), which are no keyword of the implementation's
        **case.variant,
    )
    grads = {}
    for (name, shape), grad in zip(gradient_shapes(case).items(), answer, strict=True):
        array = subject.client.to_numpy(grad)
        if array.shape != shape:
            raise ImplementationBroke(
                f"{subject.name}'s vjp returned d{name} of shape {array.shape}, but should "
                f"return {shape} [{case.describe()}]"
            )
        grads[name] = array.astype(np.float64)
    return grads


def judged_gradients(subject: Subject, case: Case, *, spread: float = 1.0):
    """The backward of ``case`` (with its lse's gradient too where ``case.return_lse``) on q, k, v
    of standard deviation ``spread``, a random grad_out (and grad_lse), judged: (grads, the
    comparisons {"dq": ...}, the GradientCall the oracle saw)."""
    q, k, v = subject.inputs(case, spread=spread)
    grad_out = round_to(subject.rng.standard_normal(case.out_shape), case.dtype)
    grad_lse = None
    if case.return_lse:
        grad_lse = round_to(subject.rng.standard_normal(case.q_shape[:-1]), case.dtype)
    plain = case.with_(return_lse=None)  # the lse is not returned: its gradient is taken
    grads = backward(subject, plain, q, k, v, grad_out, grad_lse)
    options = dict(causal=case.causal, scale=case.scale, **plain.formula_variant)
    if grad_lse is not None:  # the oracle's loss takes the natural lse: lse_2 = lse / ln 2
        declared_base_2 = subject.client.capabilities.lse_base == "2"
        options["grad_lse"] = grad_lse / math.log(2) if declared_base_2 else grad_lse
    comparisons = compare_gradients(grads, q, k, v, grad_out, dtype=case.dtype, **options)
    return grads, comparisons, GradientCall(q, k, v, grad_out, options)


def assert_gradients_match(subject: Subject, case: Case, *, spread: float = 1.0) -> None:
    """:func:`judged_gradients` held to the claims: exact zeros where no gradient flows, every
    gradient within its budget, a failure diagnosed."""
    __tracebackhide__ = True
    grads, comparisons, call = judged_gradients(subject, case, spread=spread)
    finding = None
    if not all(comparison.ok for comparison in comparisons.values()):
        finding = diagnose_gradients(grads, call, case=case, comparisons=comparisons)
    assert_no_gradient_where_none_flows(subject, case.with_(return_lse=None), grads, finding)
    for name, comparison in comparisons.items():
        assert_within_budget(subject, case, name, comparison, finding)


def assert_no_gradient_where_none_flows(subject, case: Case, grads: dict, finding) -> None:
    """dk and dv exactly 0 at keys no row reads (padding, outside every row's window or chunk,
    the future of every row), dq exactly 0 on rows that see no key: never NaN, never a
    rounding's leftover."""
    __tracebackhide__ = True
    read, blind = keys_read_and_blind_rows(case.tq, case.tk, causal=case.causal,
                                           heads=case.heads, **case.formula_variant)  # fmt: skip
    unread = ~read_by_kv_heads(read, case.key_value_heads)  # (B or 1, Hkv or 1, Tk)
    where = {
        "dk": (grads["k"], unread, "keys that no row reads"),
        "dv": (grads["v"], unread, "keys that no row reads"),
        "dq": (grads["q"], blind, "rows that see no key"),  # (B or 1, H or 1, Tq)
    }
    for name, (grad, none_flows, what) in where.items():
        there = grad[np.broadcast_to(none_flows, grad.shape[:-1])]
        if np.any(there != 0):
            fail(
                subject,
                case,
                with_diagnosis(
                    subject,
                    f"{name} at {what} has {np.count_nonzero(there != 0)} entries not 0 "
                    f"({np.count_nonzero(np.isnan(there))} NaN, largest "
                    f"{np.nanmax(np.abs(there), initial=0.0):.3g}), but no gradient flows there",
                    finding,
                ),
            )


def read_by_kv_heads(read: np.ndarray, kv_heads: int) -> np.ndarray:
    """Which keys each key/value head's group of query heads reads, from which keys each query
    head reads, (B or 1, H or 1, Tk): a key of head h' is read where any head of its group
    reads it."""
    heads = read.shape[1]
    if heads == 1:
        return read
    return read.reshape(read.shape[0], kv_heads, heads // kv_heads, -1).any(axis=2)


def undefined_gradient(subject, case: Case) -> str | None:
    """Why ``case`` has no gradient for the implementation, or None: rows that see no key, where
    it declares NaN for them (Capabilities.empty_rows = "nan"), make its loss NaN."""
    if subject.client.capabilities.empty_rows != "nan":
        return None
    plain = case.with_(return_lse=None)
    _, blind = keys_read_and_blind_rows(plain.tq, plain.tk, causal=plain.causal,
                                        heads=plain.heads, **plain.formula_variant)  # fmt: skip
    if not blind.any():
        return None
    return (
        f"{subject.name} declares NaN for rows that see no key (empty_rows='nan'): their loss "
        "is NaN and their gradient undefined"
    )


def assert_backward_of(subject, case: Case, spread: float = 1.0) -> None:
    """The gradients of ``case`` fitted to the implementation: the claim's check."""
    __tracebackhide__ = True
    case = subject.fit(case)
    subject.require(case, autograd=True)
    undefined = undefined_gradient(subject, case)
    if undefined:
        pytest.skip(undefined)
    assert_gradients_match(subject, case, spread=spread)
