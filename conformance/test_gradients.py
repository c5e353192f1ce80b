"""Extensions, the backward: the gradients of every feature a training kernel ships, each feature's
gradient claim a row of one table (a case costs one backward call per dtype), judged by
``conformance.judge.gradients``: exact zeros where no gradient flows, every gradient (and a
sink's own) within its budget of the float64 backward, a failure diagnosed among the backward's
mistakes. The document's own gradient claims (OUT-GRAD, MASK-GRAD) are in test_output.py and
test_mask.py; their cases go through the same judge.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import fail
from conformance.judge.gradients import assert_backward_of, backward
from conformance.judge.harness import Case
from conformance.judge.mask_draws import IndexDraw, MaskDraw
from conformance.test_modifiers import SINKS, SLOPES
from spec.dtypes import round_to


def row(claim: str, case: Case, spread: float = 1.0, id: str | None = None):
    return pytest.param(case, spread, marks=pytest.mark.claim(claim), id=id)


# Small heads (D = 16): what a backward gets wrong shows at any D. Lengths are the regimes of
# spec.regimes.BACKWARD_REGIMES: not multiples of 64, rows that see no key, groups of 3 and 7,
# packed sequences of one token and across a tile, scores far from zero. Every claim has a Tq = Tk
# case (self-attention: all a kernel declaring no cross_length is judged on) and, where its
# feature allows, a Tq < Tk one.
BACKWARD_CASES = [
    row("GRAD-GQA", Case(batch=2, heads=6, kv_heads=2, tq=37, tk=113, head_dim=16), id="group-3"),
    row("GRAD-GQA", Case(heads=7, kv_heads=1, tq=29, head_dim=16), id="group-7"),
    row("GRAD-WINDOW", Case(heads=2, tq=70, head_dim=16, window=16), id="window-16"),
    row("GRAD-WINDOW", Case(heads=2, tq=24, tk=40, head_dim=16, window=0), id="window-0"),
    row(
        "GRAD-PADDING",
        Case(batch=2, heads=2, tq=16, tk=203, head_dim=16, key_lengths=(203, 70)),
        id="key-lengths-203-70",
    ),
    row(
        "GRAD-PADDING",
        Case(batch=2, heads=2, tq=8, tk=40, head_dim=16, key_lengths=(40, 0)),
        id="key-length-0",
    ),
    row(
        "GRAD-PADDING",
        Case(batch=2, heads=2, tq=40, head_dim=16, key_lengths=(40, 0)),
        id="self-attention-key-length-0",
    ),
    row(
        "GRAD-PACKED",
        Case(heads=2, tq=70, head_dim=16, cu_seqlens_q=(0, 1, 45, 70), cu_seqlens_k=(0, 1, 45, 70)),
        id="self-attention-lengths-1-44-25",
    ),
    row(
        "GRAD-PACKED",
        Case(
            heads=2,
            tq=70,
            tk=117,
            head_dim=16,
            cu_seqlens_q=(0, 1, 45, 70),
            cu_seqlens_k=(0, 1, 90, 117),
        ),
        id="lengths-1-89-27",
    ),
    row(
        "GRAD-SOFTCAP",
        Case(heads=2, tq=48, head_dim=16, softcap=5.0),
        spread=3.0,
        id="far-above-the-cap",
    ),
    row("GRAD-ALIBI", Case(heads=4, tq=40, tk=56, head_dim=16, alibi_slopes=SLOPES), id="alibi"),
    row(
        "GRAD-ALIBI",
        Case(heads=4, tq=56, head_dim=16, alibi_slopes=SLOPES),
        id="self-attention-alibi",
    ),
    row("GRAD-SINK", Case(heads=4, tq=40, head_dim=16, sinks=SINKS), id="sinks"),
    row(
        "GRAD-LSE",
        Case(batch=2, heads=2, tq=37, tk=53, head_dim=16, return_lse=True),
        spread=2.0,
        id="lse",
    ),
    row(
        "GRAD-LSE",
        Case(heads=4, tq=40, head_dim=16, sinks=SINKS, window=8, return_lse=True),
        id="lse-sinks-window",
    ),
    row("GRAD-CHUNKED", Case(heads=2, tq=70, head_dim=16, chunk=32), id="chunk-32"),
    row(
        "GRAD-CUSTOM-MASK",
        Case(
            batch=2,
            heads=2,
            tq=70,
            head_dim=16,
            attn_mask=MaskDraw(0.3, per_head=True, blind_rows=3, hidden_keys=5, seed=21),
        ),
        id="custom-mask",
    ),
    row(
        "GRAD-CUSTOM-MASK",
        Case(
            heads=4,
            kv_heads=2,
            tq=9,
            tk=80,
            head_dim=16,
            causal=False,
            attn_mask=MaskDraw(0.1, per_head=True, seed=22),
        ),
        id="custom-mask-grouped-sparse",
    ),
    # keys listed by several rows and heads, twice in a row, empty slots, rows listing none
    row(
        "GRAD-SPARSE",
        Case(
            batch=2,
            heads=4,
            kv_heads=2,
            tq=70,
            head_dim=16,
            kv_indices=IndexDraw(
                keys=24, empty=0.2, duplicates=3, blind_rows=3, unlisted_keys=7, seed=41
            ),
        ),
        id="sparse",
    ),
    row(
        "GRAD-SPARSE",
        Case(
            batch=1,
            heads=8,
            kv_heads=1,
            tq=4,
            tk=150,
            head_dim=64,
            causal=False,
            kv_indices=IndexDraw(keys=32, empty=0.1, duplicates=4, seed=42),
        ),
        id="sparse-decode-one-kv-head",
    ),
]


@pytest.mark.parametrize(("case", "spread"), BACKWARD_CASES)
def test_gradients_of_each_feature(subject, dtype, case, spread):
    assert_backward_of(subject, case.with_(dtype=dtype), spread)


@pytest.mark.claim("GRAD-DETERMINISM")
def test_repeated_backward_passes_are_bit_identical(subject, dtype):
    case = subject.fit(
        Case(batch=2, heads=4, tq=70, tk=113, head_dim=16, dtype=dtype)
    )  # several key tiles summed into each dq row, several query blocks into dk and dv
    subject.require(case, autograd=True)
    q, k, v = subject.inputs(case)
    grad_out = round_to(subject.rng.standard_normal(case.out_shape), dtype)
    first = backward(subject, case, q, k, v, grad_out)
    for repeat in range(1, 4):
        again = backward(subject, case, q, k, v, grad_out)
        for name, grad in first.items():
            differ = ~((again[name] == grad) | (np.isnan(again[name]) & np.isnan(grad)))
            if differ.any():
                fail(
                    subject,
                    case,
                    f"d{name} of call {repeat + 1} differs from call 1's in "
                    f"{np.count_nonzero(differ)} entries (largest by "
                    f"{np.nanmax(np.abs(again[name] - grad)):.3g}), but repeated backward "
                    "passes should be bit-identical",
                )
