"""Extensions, sliding windows: a left window w, bottom-right aligned (WINDOW-BOUNDS,
WINDOW-INVARIANT)."""

from __future__ import annotations

import pytest

from conformance.judge.assertions import assert_identical, assert_matches_oracle
from conformance.judge.harness import Case

WINDOW_CASES = [
    Case(batch=2, heads=2, tq=70, head_dim=16, window=9),
    Case(batch=1, heads=2, tq=1, tk=90, head_dim=32, window=16),  # decode, cache > window
    Case(batch=1, heads=2, tq=7, tk=48, head_dim=16, window=5),  # chunked prefill, Tq < Tk
    Case(batch=1, heads=2, tq=40, head_dim=16, window=0),  # each row sees itself only
    Case(batch=1, heads=2, tq=24, head_dim=16, window=64),  # wider than the sequence: causal
    Case(batch=1, heads=2, tq=30, head_dim=16, window=1),  # each row sees itself and one before
]
WINDOW_IDS = ["prefill", "decode", "Tq<Tk", "w=0", "w>T", "w=1"]


@pytest.mark.claim("WINDOW-BOUNDS")
@pytest.mark.parametrize("case", WINDOW_CASES, ids=WINDOW_IDS)
def test_query_at_p_sees_keys_p_minus_w_to_p(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case, spread=1.5)
    assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("WINDOW-INVARIANT")
@pytest.mark.parametrize("case", WINDOW_CASES[:3], ids=WINDOW_IDS[:3])
def test_keys_outside_the_window_have_no_influence(subject, dtype, case):
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case)
    # Checked rows first..last; a row i sits at absolute position i + Tk - Tq.
    first, last = case.tq // 2, (3 * case.tq) // 4
    offset = case.tk - case.tq
    before = first + offset - case.window  # keys j < before: behind every checked row's window
    after = last + offset + 1  # keys j >= after: in every checked row's future
    assert before > 0, f"{case.describe()} leaves no key behind the window"
    clean = subject.call(case, q, k, v)[..., first : last + 1, :]
    fresh = subject.inputs(case, spread=3.0)  # other finite values for the same places
    changed_k, changed_v = k.copy(), v.copy()
    for changed, new in ((changed_k, fresh[1]), (changed_v, fresh[2])):
        changed[..., :before, :] = new[..., :before, :]
        changed[..., after:, :] = new[..., after:, :]
    rows = subject.call(case, q, changed_k, changed_v)[..., first : last + 1, :]
    # Bit for bit: the same shape and call, only keys the checked rows never read changed.
    assert_identical(
        subject,
        case,
        f"rows {first}..{last} with keys and values at j < {before} and j >= {after} changed",
        rows,
        clean,
    )
