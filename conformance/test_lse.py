"""Extensions, partial states: the log-sum-exp a kernel returns beside its output (LSE-VALUE),
and attention over keys split into parts, each part's state merged into the whole (LSE-MERGE),
by the suite's merge and by the one an implementation ships."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from conformance.bench.shapes import MLA_SCALE
from conformance.judge.assertions import assert_matches_oracle, assert_within_budget
from conformance.judge.diagnosis import diagnose_lse, diagnose_merge
from conformance.judge.harness import Case, packed_rows
from conformance.judge.mask_draws import MaskDraw
from conformance.judge.tables import SINKS, SLOPES
from conformance.judge.tolerance import compare_lse, compare_merged
from conformance.judge.tolerance import natural_lse as natural
from spec.dtypes import round_to
from spec.formula import accumulation_dtype, merge_states, naive_log_sum_exp
from spec.mistakes.state import LseCall, MergeCall

SHAPES = {
    "prefill": Case(batch=2, heads=4, tq=70, head_dim=16),
    "decode": Case(batch=1, heads=4, tq=1, tk=90, head_dim=16),
    "Tq<Tk": Case(batch=1, heads=4, tq=7, tk=48, head_dim=16),
    "non-causal": Case(batch=1, heads=4, tq=33, head_dim=16, causal=False),
}


def in_declared_base(subject, lse: np.ndarray) -> np.ndarray:
    return lse / math.log(2) if subject.client.capabilities.lse_base == "2" else lse


def assert_lse_matches(subject, case: Case, lse: np.ndarray, q, k, what: str = "lse") -> None:
    """``lse`` (as returned) is the oracle's log-sum-exp of each row within its budget."""
    __tracebackhide__ = True
    options = dict(causal=case.causal, scale=case.scale, **case.formula_variant)
    call = LseCall(q, k, options, subject.client.capabilities.lse_base)
    naive = naive_log_sum_exp(q, k, dtype=case.dtype, **options)
    comparison = compare_lse(natural(subject, lse), call.truth, naive, dtype=case.dtype)
    finding = None
    if not comparison.ok:
        finding = diagnose_lse(natural(subject, lse), call, case=case, comparison=comparison)
    assert_within_budget(subject, case, what, comparison, finding)


def assert_out_and_lse_match(subject, case: Case) -> None:
    """``case`` called with return_lse: its output and its log-sum-exp within their budgets."""
    __tracebackhide__ = True
    q, k, v = subject.inputs(case, spread=2.0)
    out, lse = subject.call_with_lse(case, q, k, v)
    assert_matches_oracle(subject, case, out, q, k, v)
    assert_lse_matches(subject, case, lse, q, k)


@pytest.mark.claim("LSE-VALUE")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_log_sum_exp_of_each_row(subject, dtype, shape):
    assert_out_and_lse_match(subject, subject.fit(SHAPES[shape].with_(dtype=dtype)))


# The features that change which scores a row sums (a window, a chunk, grouped heads, key lengths,
# pages) or the scores themselves (a softcap, ALiBi). With sinks the log-sum-exp is the scores'
# alone, the sink's logit not included (FlashAttention's softmax_lse beside learnable_sink), so
# that it merges with other parts' as any state does.
WITH_FEATURES = {
    "window": SHAPES["prefill"].with_(window=20),
    "chunk": SHAPES["prefill"].with_(chunk=32),
    "gqa": SHAPES["prefill"].with_(kv_heads=2),
    "softcap": SHAPES["prefill"].with_(softcap=2.0),
    "alibi": SHAPES["prefill"].with_(alibi_slopes=SLOPES),
    "sinks": SHAPES["prefill"].with_(sinks=SINKS),
    "key_lengths": SHAPES["decode"].with_(batch=2, key_lengths=(90, 37)),
    "paged": SHAPES["decode"].with_(batch=2, key_lengths=(90, 37), page_size=16),
    # MLA's absorbed decode: one key/value head, D = 576, Dv = 512, DeepSeek's explicit scale;
    # the log-sum-exp under the softmax's scale (TensorRT-LLM PR #19112: merged chunks off by 0.45)
    "mla": Case(
        batch=2, heads=16, kv_heads=1, tq=2, tk=160, head_dim=576, value_dim=512, scale=MLA_SCALE
    ),
    "explicit scale": SHAPES["prefill"].with_(scale=0.3),
    "custom mask": SHAPES["prefill"].with_(
        attn_mask=MaskDraw(0.3, per_head=True, own_key=True, seed=31)
    ),
    "softcap+sinks gqa window": SHAPES["prefill"].with_(
        kv_heads=2, window=40, softcap=2.0, sinks=SINKS
    ),
}


@pytest.mark.claim("LSE-VALUE")
@pytest.mark.parametrize("features", list(WITH_FEATURES))
def test_the_log_sum_exp_with_other_features(subject, dtype, features):
    assert_out_and_lse_match(subject, subject.fit(WITH_FEATURES[features].with_(dtype=dtype)))


# Padded query rows and packed sequences: each item's or sequence's rows have the log-sum-exp of
# their own keys, packed as varlen kernels return it ((1, H, total)); a padded row's is not
# compared. (A packed sequence with no key: EMPTY-KV's tests.)
SPLIT_ROWS = {
    "query_lengths": Case(
        batch=3, heads=4, tq=24, head_dim=16, query_lengths=(24, 9, 1), key_lengths=(24, 9, 3)
    ),
    "packed": Case(
        batch=1, heads=4, tq=34, tk=41, head_dim=16, cu_seqlens_q=(0, 24, 33, 34),
        cu_seqlens_k=(0, 24, 40, 41),
    ),
}  # fmt: skip


@pytest.mark.claim("LSE-VALUE")
@pytest.mark.parametrize("split", list(SPLIT_ROWS))
def test_the_log_sum_exp_of_padded_items_and_packed_sequences(subject, dtype, split):
    case = subject.fit(SPLIT_ROWS[split].with_(dtype=dtype))
    q, k, v = subject.inputs(case, spread=2.0)
    out, lse = subject.call_with_lse(case, q, k, v)
    if case.query_lengths is not None:  # each item's valid rows, packed: the padded ones left out
        out, q, k, v, offsets = packed_rows(case, out, q, k, v)
        lse = np.concatenate(
            [lse[b : b + 1, :, :n] for b, n in enumerate(case.query_lengths)], axis=-1
        )  # (1, H, sum of Lq_b)
        case = case.with_(
            batch=1, tq=q.shape[-2], tk=k.shape[-2], query_lengths=None, key_lengths=None,
            **offsets,
        )  # fmt: skip
    assert_matches_oracle(subject, case, out, q, k, v)
    assert_lse_matches(subject, case, lse, q, k)


# Splits of the keys into parts, as split-KV kernels make them: FlashDecoding's parts of a cache
# for one query, and chunked prefill's cached prefix (seen whole by every new row) and new keys.
SPLITS = {
    "decode": (Case(batch=2, heads=4, tq=1, tk=150, head_dim=16), (0, 64, 128, 150)),
    "prefill": (Case(batch=1, heads=4, tq=8, tk=100, head_dim=16), (0, 92, 100)),
}


def part_case(case: Case, start: int, stop: int) -> Case:
    """The call over keys start..stop - 1 alone: without the causal mask where every query row
    sits past the part, with it (bottom-right, as the whole) where the part ends the keys."""
    assert stop == case.tk or stop <= case.tk - case.tq, (start, stop)
    return case.with_(tk=stop - start, causal=case.causal and stop == case.tk)


@pytest.mark.claim("LSE-MERGE")
@pytest.mark.parametrize("split", list(SPLITS))
def test_parts_over_split_keys_merge_into_the_whole(subject, dtype, split):
    whole, bounds = SPLITS[split]
    case = subject.fit(whole.with_(dtype=dtype))
    q, k, v = subject.inputs(case, spread=2.0)
    outputs, lses = [], []
    for start, stop in itertools.pairwise(bounds):
        out, lse = subject.call_with_lse(
            part_case(case, start, stop), q, k[..., start:stop, :], v[..., start:stop, :]
        )
        outputs.append(out)
        lses.append(natural(subject, lse))
    merged, merged_lse = merge_states(np.stack(outputs), np.stack(lses))
    assert_matches_oracle(subject, case, merged, q, k, v, what="merged out")
    assert_lse_matches(subject, case, in_declared_base(subject, merged_lse), q, k, "merged lse")


# Cascades: levels of keys, each earlier level shared by more requests, as a serving engine lays
# out a system prompt, a few-shot block and each request's own tokens. (level sizes, queries)
CASCADES = {
    "prefix+suffix prefill": ((96, 24), 24),
    "three levels decode": ((128, 40, 9), 1),
}


@pytest.mark.claim("CASCADE-LEVELS")
@pytest.mark.parametrize("cascade", list(CASCADES))
def test_a_cascade_of_levels_merges_into_causal_attention(subject, dtype, cascade):
    levels, queries = CASCADES[cascade]
    whole = subject.fit(Case(batch=3, heads=4, tq=queries, tk=sum(levels), head_dim=16,
                             dtype=dtype))  # fmt: skip
    q, k, v = subject.inputs(whole, spread=2.0)
    bounds = np.cumsum((0, *levels))
    shared = bounds[-2]  # every level but the last is shared by all three requests
    k[:, :, :shared], v[:, :, :shared] = k[:1, :, :shared], v[:1, :, :shared]
    outputs, lses = [], []
    for level, (start, stop) in enumerate(itertools.pairwise(bounds)):
        last = level == len(levels) - 1
        part = whole.with_(tk=int(stop - start), causal=last)
        keys, values = k[..., start:stop, :], v[..., start:stop, :]
        out, lse = subject.call_with_lse(part, q, keys, values)
        # each level's own answer first: a wrong level is named as the mistake it makes
        assert_matches_oracle(subject, part, out, q, keys, values, what=f"level {level}'s out")
        outputs.append(out)
        lses.append(lse)
    if subject.client.capabilities.merges_states:
        merged, _ = subject.merge(whole, np.stack(outputs), np.stack(lses))
    else:
        merged, _ = merge_states(np.stack(outputs), np.stack([natural(subject, x) for x in lses]))
    assert_matches_oracle(subject, whole, merged, q, k, v, what="the cascade's merged out",
                          diagnosable=False)  # fmt: skip


def states(case: Case, rng: np.random.Generator, parts: int = 3):
    """Partial states to merge, exact in the case's dtype: outputs (P, B, H, Tq, Dv) and lses
    (P, B, H, Tq) near 1000 (item 0) and -1000 (the others), where exp overflows or underflows
    even in float64 unless the largest is subtracted first; part 1 saw no key (lse -inf) and
    holds NaN, as an empty split may; and in the last row of item 0 no part saw a key (a merge
    then owes 0 with lse -inf, where an unguarded -inf - (-inf) gives NaN: FlashInfer #4975)."""
    outputs = round_to(rng.standard_normal((parts, *case.out_shape)), case.dtype)
    lses = 1000.0 + 3.0 * rng.standard_normal((parts, *case.q_shape[:-1]))  # (P, B, H, Tq)
    lses[:, 1:] -= 2000.0
    lses = round_to(lses, case.dtype)
    outputs[1], lses[1] = np.nan, -np.inf
    outputs[:, 0, :, -1], lses[:, 0, :, -1] = np.nan, -np.inf
    return outputs, lses


@pytest.mark.claim("LSE-MERGE")
def test_the_shipped_merge_skips_empty_parts_and_large_lses(subject, dtype):
    case = subject.fit(Case(batch=2, heads=4, tq=5, head_dim=16, dtype=dtype))
    outputs, lses = states(case, subject.rng)
    out, lse = subject.merge(case, outputs, lses)
    base = subject.client.capabilities.lse_base
    truth, truth_lse = merge_states(outputs, lses, base)
    naive, naive_lse = merge_states(outputs, lses, base, accumulation_dtype(case.dtype))
    comparison = compare_merged(
        out, truth, naive, outputs=outputs, natural_lses=natural(subject, lses), dtype=case.dtype
    )
    lse_comparison = compare_lse(
        natural(subject, lse),
        natural(subject, truth_lse),
        natural(subject, naive_lse),
        dtype=case.dtype,
    )
    finding = None
    if not (comparison.ok and lse_comparison.ok):
        finding = diagnose_merge(
            out, natural(subject, lse), MergeCall(outputs, lses, base), case=case,
            truth=(truth, natural(subject, truth_lse)), comparisons=(comparison, lse_comparison),
        )  # fmt: skip
    assert_within_budget(subject, case, "merge_states out", comparison, finding)
    assert_within_budget(subject, case, "merge_states lse", lse_comparison, finding)
