"""Extensions, score modifiers: a softcap on the scores (SOFTCAP), ALiBi's distance bias (ALIBI),
a sink logit in each row's denominator (SINK-LOGIT), and attention within chunks
(CHUNKED-LOCAL). Each is compared with the formula (spec/formula.py) where it matters: scores
well above the cap, distances long enough for the bias to dominate, sinks comparable to the
scores, rows at chunk boundaries; in prefill, in decoding against a longer cache and with
Tq < Tk, where a bottom-right alignment and a top-left one part."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.judge.assertions import assert_matches_oracle
from conformance.judge.harness import Case
from conformance.judge.tables import SINKS, SLOPES

HEADS = 4  # the per-head parameters below have one value each
SHAPES = {
    "prefill": Case(batch=2, heads=HEADS, tq=70, head_dim=16),
    "decode": Case(batch=1, heads=HEADS, tq=1, tk=90, head_dim=16),
    "Tq<Tk": Case(batch=1, heads=HEADS, tq=7, tk=48, head_dim=16),
    "non-causal": Case(batch=1, heads=HEADS, tq=33, head_dim=16, causal=False),
}


def check_formula(subject, dtype, case: Case, spread: float = 1.0) -> None:
    case = subject.fit(case.with_(dtype=dtype))
    q, k, v = subject.inputs(case, spread=spread)
    assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)


@pytest.mark.claim("SOFTCAP")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_scaled_scores_are_capped_before_the_mask(subject, dtype, shape):
    # Spread 3 at D = 16: scaled scores of about 9 against a cap of 2, deep in tanh's saturation,
    # where capping before the scale, after the mask, or not at all all differ from the formula.
    check_formula(subject, dtype, SHAPES[shape].with_(softcap=2.0), spread=3.0)


@pytest.mark.claim("ALIBI")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_scores_get_minus_slope_times_distance(subject, dtype, shape):
    check_formula(subject, dtype, SHAPES[shape].with_(alibi_slopes=SLOPES))


@pytest.mark.claim("SINK-LOGIT")
@pytest.mark.parametrize("shape", ["prefill", "decode", "Tq<Tk", "non-causal"])
def test_sink_logits_join_each_denominator_alone(subject, dtype, shape):
    check_formula(subject, dtype, SHAPES[shape].with_(sinks=SINKS))


# A sink far above its head's scores takes nearly all of each row's weight (the running maximum
# must start from it, or exp overflows); one far below vanishes beside them.
FAR_SINKS = (40.0, -40.0, 0.5, -np.inf)


@pytest.mark.claim("SINK-LOGIT")
@pytest.mark.parametrize("shape", ["prefill", "decode"])
def test_sinks_far_above_and_below_the_scores(subject, dtype, shape):
    check_formula(subject, dtype, SHAPES[shape].with_(sinks=FAR_SINKS))


CHUNK_CASES = {
    # chunk boundaries at 32 and 64 inside the sequence, the last chunk partial
    "prefill": Case(batch=2, heads=HEADS, tq=100, head_dim=16, chunk=32),
    # position 89: its chunk holds keys 64..89 of the cache
    "decode": Case(batch=1, heads=HEADS, tq=1, tk=90, head_dim=16, chunk=32),
    # positions 41..47 in the chunk of keys 32..47
    "Tq<Tk": Case(batch=1, heads=HEADS, tq=7, tk=48, head_dim=16, chunk=16),
    "C=1": Case(batch=1, heads=HEADS, tq=20, head_dim=16, chunk=1),  # each row sees itself
    "C>T": Case(batch=1, heads=HEADS, tq=40, head_dim=16, chunk=128),  # plain causal attention
}


@pytest.mark.claim("CHUNKED-LOCAL")
@pytest.mark.parametrize("shape", list(CHUNK_CASES))
def test_queries_see_their_own_chunk_only(subject, dtype, shape):
    check_formula(subject, dtype, CHUNK_CASES[shape], spread=1.5)


# The modifiers together and with the features they meet in a serving kernel: each in its place
# (the softcap before ALiBi's bias, both before the mask; the sink after the last key), on grouped
# heads, under a window or within chunks, over items of their own key lengths.
COMBINED = {
    "softcap+alibi+sinks gqa window": Case(
        batch=2, heads=HEADS, kv_heads=2, tq=70, head_dim=16, window=24,
        softcap=2.0, alibi_slopes=SLOPES, sinks=SINKS,
    ),
    "softcap+alibi+sinks gqa key_lengths": Case(
        batch=2, heads=HEADS, kv_heads=2, tq=5, tk=60, head_dim=16, key_lengths=(60, 23),
        softcap=2.0, alibi_slopes=SLOPES, sinks=SINKS,
    ),
    "chunk+softcap+sinks key_lengths": Case(
        batch=2, heads=HEADS, tq=5, tk=90, head_dim=16, key_lengths=(90, 41), chunk=32,
        softcap=2.0, sinks=SINKS,
    ),
}  # fmt: skip


@pytest.mark.claim("SOFTCAP", "ALIBI", "SINK-LOGIT", "CHUNKED-LOCAL")
@pytest.mark.parametrize("combination", list(COMBINED))
def test_modifiers_combine_with_each_other_and_the_masks(subject, dtype, combination):
    check_formula(subject, dtype, COMBINED[combination], spread=2.0)
