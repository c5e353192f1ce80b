"""The case tables that tests run and tools read: the gradient claims' cases (OUT-GRAD's and
each feature's), and the per-head parameters of the score modifiers. Here, not in a test module,
so that ``python -m conformance.survey`` draws the same cases the tests draw without importing a
test (tests/test_layout.py holds that no product module does).
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.harness import Case
from conformance.judge.mask_draws import IndexDraw, MaskDraw

# Steeper than ALiBi's 2^(-8h/H) for H = 4, so that the bias outweighs the scores within a few
# keys: a wrong sign or a wrong query position changes the output, not only its last digits.
SLOPES = (1.0, 0.5, 0.25, 0.125)
# Comparable to unit scores; the last head has no sink (-inf): there it is plain attention.
SINKS = (0.5, 2.0, -1.0, -np.inf)


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
    # blocks of 32 keys, the last one partial (70 = 2 * 32 + 6), a block listed twice
    row(
        "GRAD-SPARSE",
        Case(
            heads=4,
            kv_heads=2,
            tq=70,
            head_dim=16,
            kv_block_size=32,
            kv_indices=IndexDraw(keys=3, empty=0.2, duplicates=1, seed=43),
        ),
        id="sparse-blocks",
    ),
]


# The backward's regimes of the plain formula (spec.regimes.BACKWARD_REGIMES): keys not a
# multiple of a tile and above one, many tiles, scores far from zero
# (FlashAttention's bwd_overflow lengths), with and without the mask, Tq < Tk and Tq = Tk.
GRADIENT_CASES = {
    "causal": (Case(batch=2, heads=2, tq=37, tk=53, head_dim=16), 1.0),
    "non-causal": (Case(batch=2, heads=2, tq=37, tk=53, head_dim=16, causal=False), 1.0),
    "Tk=203": (Case(batch=2, heads=2, tq=113, tk=203, head_dim=16), 1.0),
    "Tk=1023": (Case(heads=1, tq=17, tk=1023, head_dim=16), 1.0),
    "far-scores": (Case(heads=2, tq=5, tk=17, head_dim=16), 4.0),
    # Tq = Tk: self-attention, the one call a training kernel declaring no cross_length is given
    "self-attention": (Case(batch=2, heads=2, tq=53, head_dim=16), 1.0),
    "self-attention-T=203": (Case(heads=2, tq=203, head_dim=16), 1.0),
}
