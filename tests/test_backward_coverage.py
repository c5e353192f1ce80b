"""Every gradient claim has a self-attention case (Tq = Tk): a kernel declaring no cross_length,
as most training kernels, once had its backward judged by MASK-GRAD's zeros alone."""

from __future__ import annotations

from conformance.judge.tables import BACKWARD_CASES, GRADIENT_CASES
from tests.suite_process import run_suite


def test_every_gradient_claim_has_a_self_attention_case():
    cases = [(mark.args[0], param.values[0]) for param in BACKWARD_CASES for mark in param.marks]
    cases += [("OUT-GRAD", case) for case, _ in GRADIENT_CASES.values()]
    claims = {claim for claim, _ in cases}
    with_self_attention = {claim for claim, case in cases if case.tq == case.tk}
    assert claims - with_self_attention == set()


def test_a_backward_wrong_only_at_tq_equal_tk_fails_out_grad():
    result = run_suite(
        "--impl", "tests.planted.backward_paths:SelfAttentionDqUnscaled",
        "--claims", "OUT-GRAD,MASK-GRAD,GRAD-ALIBI", "-q",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    assert "FAILED MUST OUT-GRAD" in result.stdout, result.stdout[-4000:]
    assert "FAILED MUST GRAD-ALIBI" in result.stdout, result.stdout[-4000:]
    assert "FAILED MUST MASK-GRAD" not in result.stdout, result.stdout[-4000:]
