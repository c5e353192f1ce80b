"""The diagnosis of failed claims: the catalogue of mistakes (spec/mistakes/) against the zoo's
mutants, the localisation, the pooling of findings, and the screen a failing run prints."""

from __future__ import annotations

import inspect
import re
import shlex

import numpy as np
import pytest

from conformance.judge.diagnosis import (
    DIAGNOSED_WORK,
    conclude,
    describe_diagnosis,
    diagnose,
    locate,
    mismatch,
    spans,
    with_empty_rows,
    work_of,
)
from conformance.judge.harness import Case
from conformance.judge.mask_draws import IndexDraw, MaskDraw, PackedMaskDraw, TreeDraw
from conformance.judge.tolerance import compare_to_oracle
from conformance.judge.truth import CaseTruth, largest_finite
from conformance.report.verdicts import WIDTH, shell_lines
from spec.block_scaled import quantize_call
from spec.dtypes import UNIT_ROUNDOFF
from spec.formula import merge_states, page_pool, reference_attention
from spec.fp8 import numpy_dtype
from spec.masks import LISTED_KEYWORDS, MASK_CONVENTIONS
from spec.mistakes import MISTAKES, Family, find_mistake, of_family
from spec.mistakes.forward import Call, output_of
from spec.mistakes.gradients import GradientCall
from spec.mistakes.state import LseCall, MergeCall
from tests.suite_process import run_module
from tests.zoo import load_members
from tests.zoo.kill_matrix import Verdict, diagnosis_problems

MEMBERS = load_members()


def members_with(*families: Family) -> list[str]:
    """The zoo's members whose mistake is of ``families``."""
    names = {m.name for m in of_family(*families)}
    return sorted(name for name, member in MEMBERS.items() if member.mistake in names)


WITH_MISTAKE = members_with(Family.OUTPUT)
WITH_STATE_MISTAKE = members_with(Family.LSE, Family.MERGE)
WITH_GRADIENT_MISTAKE = members_with(Family.GRADIENT)


def planted_future(k: np.ndarray, value: float) -> np.ndarray:
    """k with every key after the first quarter set to ``value``: scores far above the rest."""
    k = k.copy()
    k[..., k.shape[-2] // 4 :, :] = value
    return k


# (B, H, Hkv, Tq, Tk, D, Dv), the extensions' keywords, and what is done to the inputs
CASES = [
    ((2, 4, 4, 70, 70, 16, 16), {}, None),
    ((2, 4, 4, 5, 150, 40, 24), {}, None),
    ((1, 3, 3, 1, 17, 32, 32), {}, None),
    ((2, 6, 2, 9, 20, 16, 16), {"enable_gqa": True}, None),
    ((2, 4, 1, 9, 20, 16, 16), {"enable_gqa": True}, None),
    ((2, 2, 2, 12, 30, 16, 16), {"window": 5}, None),
    ((3, 2, 2, 6, 20, 16, 16), {"key_lengths": (20, 9, 14)}, None),
    ((3, 2, 2, 6, 20, 16, 16), {"key_lengths": (20, 9, 14)}, "nan padding"),
    ((1, 2, 2, 12, 19, 16, 16), {"cu_seqlens_q": (0, 5, 12), "cu_seqlens_k": (0, 9, 19)}, None),
    ((2, 2, 2, 1, 1, 8, 8), {}, None),
    ((1, 2, 2, 4, 4, 8, 8), {"scale": 0.3}, None),
    ((1, 2, 2, 8, 8, 8, 8), {}, "large scores"),
    ((1, 2, 2, 40, 40, 16, 16), {}, "huge future"),
    ((1, 2, 2, 8, 8, 16, 16), {}, "far below zero"),
    ((1, 2, 2, 9, 9, 8, 8), {"causal": False}, None),
    # the score modifiers, each where its mistakes show: scores above the cap, decoding with a
    # cache for ALiBi's and the chunks' alignment, sinks comparable to the scores
    ((1, 2, 2, 7, 48, 16, 16), {"softcap": 2.0}, "large scores"),
    ((1, 2, 2, 7, 48, 16, 16), {"alibi_slopes": (1.0, 0.25)}, None),
    ((1, 2, 2, 7, 48, 16, 16), {"sinks": (0.5, 2.0)}, None),
    ((1, 2, 2, 7, 48, 16, 16), {"sinks": (0.5, -np.inf)}, None),  # a head without a sink
    ((1, 2, 2, 7, 48, 16, 16), {"chunk": 16}, None),
    ((1, 2, 2, 40, 40, 16, 16), {"chunk": 16}, None),
    # a paged cache: items of 40 and 21 keys in pages of 8, the second's last page part full
    ((2, 2, 2, 5, 40, 16, 16), {"key_lengths": (40, 21), "page_size": 8}, None),
    # and groups of 3 query heads over each key/value head
    ((2, 6, 2, 1, 40, 16, 16), {"key_lengths": (40, 21), "page_size": 8, "enable_gqa": True}, None),
    # which keys a query sees, listed: a mask per item and head, a draft tree, indices
    ((2, 4, 4, 12, 30, 16, 16), {"attn_mask": MaskDraw(0.4, per_head=True, own_key=True,
                                                       seed=1).array(2, 4, 12, 30)}, None),
    ((2, 2, 2, 7, 40, 16, 16), {"tree_mask": TreeDraw("binary").array(7)}, None),
    ((2, 4, 2, 9, 40, 16, 16), {"enable_gqa": True, "kv_indices": IndexDraw(
        keys=12, empty=0.3, duplicates=2, seed=1).array(2, 2, 9, 40)}, None),
    ((2, 4, 2, 9, 40, 16, 16), {"enable_gqa": True, "topk_length": (12, 5), "kv_indices": IndexDraw(
        keys=12, seed=2).array(2, 2, 9, 40)}, None),
    # blocks of 16 keys over 40 (the last holds 8), a block listed twice
    ((2, 4, 2, 9, 40, 16, 16), {"enable_gqa": True, "kv_block_size": 16, "kv_indices": IndexDraw(
        keys=3, empty=0.2, duplicates=1, seed=3).array(2, 2, 9, 3)}, None),
    # a bit-packed mask over two packed sequences, two spare bytes after each block
    ((1, 2, 2, 31, 47, 16, 16), {"cu_seqlens_q": (0, 13, 31), "cu_seqlens_k": (0, 21, 47),
                                 **PackedMaskDraw(MaskDraw(0.5, seed=3), spare=2).for_case(Case(
                                     heads=2, tq=31, tk=47, cu_seqlens_q=(0, 13, 31),
                                     cu_seqlens_k=(0, 21, 47)))}, None),
]  # fmt: skip


def inputs(shape, treatment, rng):
    batch, heads, kv_heads, tq, tk, d, dv = shape
    q = rng.standard_normal((batch, heads, tq, d))
    k = rng.standard_normal((batch, kv_heads, tk, d))
    v = rng.standard_normal((batch, kv_heads, tk, dv))
    if treatment == "large scores":
        q, k = 30 * q, 30 * k
    elif treatment == "huge future":
        k = planted_future(k, 1e4)  # scores of +-1e4 where q's sum is positive or negative
    elif treatment == "far below zero":  # every score near -2^20, as SOFTMAX-STABLE plants them
        q[..., 0], k[..., 0] = 1.0, -(2.0**20) * np.sqrt(d)
    return q, k, v


@pytest.mark.parametrize("name", WITH_MISTAKE)
def test_each_mutant_with_a_mistake_is_that_mistakes_variant(name):
    """Wherever the zoo mutant is wrong, the catalogue's variant computes what it computes: the
    variant is the bug, not a lookalike (precision mistakes aside: their variant is a budget)."""
    member = MEMBERS[name]
    mistake = find_mistake(member.mistake)
    if mistake.precision is not None:
        pytest.skip(f"{mistake.name} is the formula held to {mistake.precision}'s budget")
    parameters = inspect.signature(member.fn).parameters
    rng = np.random.default_rng(0)
    compared = 0
    for shape, options, treatment in CASES:
        options = dict(options)
        causal = options.pop("causal", True)
        scale = options.pop("scale", None)
        gqa = options.pop("enable_gqa", False)
        if any(keyword not in parameters for keyword in options) or (
            gqa and "enable_gqa" not in parameters
        ):
            continue
        # the convention the member declares for what it is given (duplicates counted or not):
        # the truth's and the variant's, not a keyword of the call
        declared = {name: getattr(member.fn, name) for name in MASK_CONVENTIONS
                    if hasattr(member.fn, name) and "kv_indices" in options}  # fmt: skip
        q, k, v = inputs(shape, treatment, rng)
        if treatment == "nan padding":
            for b, length in enumerate(options["key_lengths"]):
                v[b, :, length:] = np.nan
        dtype = "float32" if mistake.name.endswith("float16") else "float64"
        call = Call.of(q, k, v, dtype=dtype, causal=causal, scale=scale, **options, **declared)
        if not mistake.shows(call):
            continue
        extra = {"enable_gqa": True} if gqa else {}
        inputs_ = [x.astype(dtype) for x in (q, k, v)]
        dense_options = {name: value for name, value in options.items() if name != "page_size"}
        if "page_size" in options:  # k and v as the worker lays them out: pools, one table
            lengths, size = options["key_lengths"], options["page_size"]
            (inputs_[1], table), (inputs_[2], _) = (
                page_pool(x, lengths, size, np.random.default_rng(1)) for x in inputs_[1:]
            )
            extra["block_table"] = table
        with np.errstate(all="ignore"):
            got = np.asarray(
                member.fn(*inputs_, causal=causal, scale=scale, **options, **extra), np.float64
            )
            truth = reference_attention(q, k, v, causal=causal, scale=scale, **dense_options,
                                        **declared)  # fmt: skip
            variant = output_of(mistake, q, k, v, dtype=dtype, causal=causal, scale=scale,
                                **options, **declared)  # fmt: skip
        if set(options) & set(LISTED_KEYWORDS):  # rows a variant leaves no key: zeros, declared
            variant = with_empty_rows(variant, got, "zeros")
        # a 1e-10 relative error is the epsilon's whole bug; the others are off by far more
        tolerance = 1e-13 if mistake.name == "softmax-epsilon-in-denominator" else 1e-4
        # Mutant and variant evaluate one formula in the same dtype, but through other code (other
        # BLAS kernels, other SIMD paths on another CPU): each score may differ by u|s|, which
        # exp() makes a relative error of its weight. Where that noise reaches the tolerance the
        # case cannot tell the bug from rounding: scores of 1e4 in float32, where two correct
        # evaluations differ by 6e-4 on an AVX2 machine, more than the float16 mistakes' bugs.
        largest_score = CaseTruth(q, k, v).largest_score(scale)
        noise = 4 * UNIT_ROUNDOFF[dtype] * (1 + largest_score) * largest_finite(v)
        if noise > tolerance:
            continue  # the dtype's own rounding hides the bug here
        if got.shape == truth.shape and mismatch(got, truth).max() <= tolerance:
            continue  # right on this case: it says nothing of the bug
        compared += 1
        assert variant.shape == got.shape, (name, shape, options)
        assert mismatch(got, variant).max() <= tolerance * max(1.0, largest_finite(got)), (
            f"{name} and the variant {mistake.name} differ by {mismatch(got, variant).max():.3g} "
            f"at {shape} {options} {treatment or ''}"
        )
    assert compared, f"no case shows {name}'s bug: add one to CASES"


@pytest.mark.parametrize("name", WITH_STATE_MISTAKE)
def test_each_mutant_with_a_state_mistake_is_that_mistakes_variant(name):
    """The zoo's log-sum-exp and merge mutants compute their state mistake's variant, as the judge
    compares it (a log-sum-exp in the natural base, a merge's lse in the declared one), on inputs
    where the bug shows."""
    member = MEMBERS[name]
    mistake = find_mistake(member.mistake)
    base = getattr(member.fn, "lse_base", "e")
    rng = np.random.default_rng(0)
    tolerance = 1e-9
    if mistake.family == Family.LSE and member.family == "block scaled":
        # its bug is in its block-scaled path: an MXFP8 call, its float32 log-sum-exp held to
        # float32's rounding of it
        block = quantize_call(*(rng.standard_normal((2, 3, 32, 32)) for _ in range(3)),
                              "mx_attention", "mxfp8_e4m3")  # fmt: skip
        options = {"causal": True, "scale": None}
        stored = [x.astype(numpy_dtype("float8_e4m3fn")) for x in (block.q, block.k, block.v)]
        _, lse = member.fn(*stored, return_lse=True, **options, **block.keywords)
        got = [lse.astype(np.float64)]
        call = LseCall(*block.dequantized()[:2], options, base)
        variant, truth = [mistake.variant(call)], [call.truth]
        tolerance = 1e-5
    elif mistake.family == Family.LSE:
        q, k, v = (rng.standard_normal((2, 3, 20, 16)) for _ in range(3))  # three heads
        options = {"causal": True, "scale": None}
        if "sinks" in inspect.signature(member.fn).parameters:
            options["sinks"] = (0.5, 2.0, -np.inf)
        if not mistake.shows(LseCall(q, k, options, base)):  # a mistake of an explicit scale
            options["scale"] = 0.3
        _, lse = member.fn(q, k, v, return_lse=True, **options)
        got = [lse * np.log(2) if base == "2" else lse]
        call = LseCall(q, k, options, base)
        variant, truth = [mistake.variant(call)], [call.truth]
    else:
        outputs = rng.standard_normal((3, 2, 3, 5, 8))  # (P, B, H, Tq, Dv)
        lses = 1000.0 + 3.0 * rng.standard_normal((3, 2, 3, 5))  # (P, B, H, Tq)
        outputs[1], lses[1] = np.nan, -np.inf  # a part that saw no key
        outputs[:, 0, :, -1], lses[:, 0, :, -1] = np.nan, -np.inf  # rows that no part saw
        call = MergeCall(outputs, lses, base)
        with np.errstate(all="ignore"):
            got = member.fn.merge_states(outputs, lses)
        variant, truth = mistake.variant(call), merge_states(outputs, lses, base)
    assert mistake.shows(call), name
    shown = [mismatch(answer, right).max() > 1e-3 for answer, right in zip(got, truth, strict=True)]
    assert any(shown), f"{name}: its bug does not show on these inputs"
    for part, (answer, expected) in enumerate(zip(got, variant, strict=True)):
        off = mismatch(answer, expected).max()
        assert off <= tolerance * max(1.0, largest_finite(answer)), (
            f"{name} and the variant {mistake.name} differ by {off:.3g} in part {part}"
        )


# A backward call on which each feature's bug shows, by the keyword a member declares: two items
# of 70 keys (not a multiple of 64), the second with none where key lengths are declared.
GRADIENT_OPTIONS = {
    "enable_gqa": {},
    "window": {"window": 8},
    "key_lengths": {"key_lengths": (70, 0)},
    "cu_seqlens_q": {"cu_seqlens_q": (0, 1, 30, 40), "cu_seqlens_k": (0, 1, 60, 70)},
    "softcap": {"softcap": 2.0},
    "alibi_slopes": {"alibi_slopes": (1.0, 0.5, 0.25, 0.125)},
    "sinks": {"sinks": (0.5, 2.0, -1.0, -np.inf)},
}


@pytest.mark.parametrize("name", WITH_GRADIENT_MISTAKE)
def test_each_backward_mutant_is_its_mistakes_variant(name):
    """The zoo's backward mutants compute their gradient mistake's variant (in float64, to
    rounding), on a call where the bug shows: the diagnosis names what each one is."""
    member = MEMBERS[name]
    mistake = find_mistake(member.mistake)
    declared = inspect.signature(member.fn).parameters
    options = {"causal": True, "scale": None}
    for keyword, more in GRADIENT_OPTIONS.items():
        if keyword in declared:
            options |= more
    packed = "cu_seqlens_q" in options
    batch, kv_heads = (1 if packed else 2), (2 if "enable_gqa" in declared else 4)
    # which keys each row sees, listed: per head, some rows and keys left out; the sparse call
    # without the causal mask, which would hide the last key (where a wrapped -1 lands)
    if "attn_mask" in declared:
        options["attn_mask"] = MaskDraw(0.3, per_head=True, blind_rows=3, hidden_keys=5,
                                        seed=1).array(batch, 4, 40, 70)  # fmt: skip
    if "kv_indices" in declared:
        options["kv_indices"] = IndexDraw(keys=16, empty=0.2, duplicates=2, blind_rows=2,
                                          seed=1).array(batch, kv_heads, 40, 70)  # fmt: skip
        options["causal"] = False
    rng = np.random.default_rng(0)
    q, grad_out = (rng.standard_normal((batch, 4, 40, 16)) for _ in range(2))
    k, v = (rng.standard_normal((batch, kv_heads, 70, 16)) for _ in range(2))
    with np.errstate(all="ignore"):
        answer = member.fn.vjp(q, k, v, grad_out, **options)
    got = dict(zip(("q", "k", "v", "sinks"), answer, strict=False))
    call = GradientCall(q, k, v, grad_out, options)
    assert mistake.shows(call), name
    with np.errstate(all="ignore"):
        variant = mistake.variant(call)
    assert set(got) == set(variant) == set(call.truth), (name, set(got), set(variant))
    shown = [mismatch(variant[n], call.truth[n]).max() > 1e-6 for n in call.truth]
    assert any(shown), f"{name}: its bug does not show on these inputs"
    for part, answer in got.items():
        off = mismatch(answer, variant[part]).max()
        assert off <= 1e-9 * max(1.0, largest_finite(answer)), (
            f"{name} and the variant {mistake.name} differ by {off:.3g} in d{part}"
        )


def test_every_mistake_has_a_name_a_sentence_and_a_hint():
    for name, mistake in MISTAKES.items():
        assert mistake.family in Family, name
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), name
        assert mistake.text, name
        assert mistake.hint not in ("", mistake.text), name
    with pytest.raises(ValueError, match="mistake 'no-such-mistake', but should be one of"):
        find_mistake("no-such-mistake")


def test_every_mistake_of_the_issue_list_is_catalogued():
    assert {
        "mask-top-left", "mask-missing", "mask-excludes-diagonal", "mask-one-ahead",
        "scale-value-dim", "scale-model-width", "scale-one-over-d", "scale-missing", "scale-twice",
        "scale-explicit-ignored", "softmax-over-queries", "softmax-no-max-subtraction",
        "mask-fill-minus-1e4", "mask-fill-minus-1e9", "max-before-masking",
        "probabilities-in-float16", "row-sum-in-float16", "gqa-heads-modulo", "window-of-w-keys",
        "padding-unmasked", "values-of-head-0", "keys-of-item-0",
        "online-softmax-stale-accumulator-64", "last-key-tile-dropped-64",
    } <= {m.name for m in of_family(Family.OUTPUT)}  # fmt: skip


def test_locate_names_where_the_error_is_and_nothing_else():
    case = Case(batch=2, heads=3, tq=128, tk=200, head_dim=8, dtype="float32")
    truth = np.zeros(case.out_shape)
    out = truth.copy()
    out[1, 2, 64:100, :] = 1.0  # item 1, head 2, rows 64..99, every column
    out[1, 2, 70, 3] = np.nan
    where = locate(out, truth, 1e-6, case)
    assert "batch items 1 of 2" in where
    assert "heads 2 of 3" in where
    assert "query rows 64-99 of 128 (from row 64, a multiple of 64)" in where
    assert "1 NaN" in where
    assert "at Tq=128 < Tk=200, float32" in where
    assert "columns" not in where.replace("every one of 8 columns", "")
    assert spans([0, 1, 2, 5, 7, 8, 10, 12, 14]) == "0-2, 5, 7-8, 10, ..."


def finding(test, matched=(), refuted=(), tq=1, tk=17):
    return {
        "test": test, "matched": {name: 0.1 for name in matched}, "refuted": list(refuted),
        "where": f"somewhere in {test}", "tq": tq, "tk": tk, "dtype": "float32",
        "fraction_of_budget": 5.0, "case": "",
    }  # fmt: skip


def test_a_mistake_is_named_only_where_it_explains_every_failure():
    both = [finding("t1", ["mask-top-left", "scale-missing"]), finding("t2", ["mask-top-left"])]
    assert [d["name"] for d in conclude(both)] == ["mask-top-left", "scale-missing"]
    refuted = [*both, finding("t3", ["mask-top-left"], refuted=["scale-missing"])]
    assert [d["name"] for d in conclude(refuted)] == ["mask-top-left"]
    # refuted by another claim's findings of the same implementation: not named here either
    assert conclude(both, refuted={"mask-top-left", "scale-missing"})[0]["kind"] == "where"
    # the exact variant wins over a precision one; of precision ones, the finest
    precise = [finding("t1", ["float16-inside", "float32-inside"])]
    assert [d["name"] for d in conclude(precise)] == ["float32-inside"]
    assert [d["name"] for d in conclude([finding("t1", ["float32-inside", "mask-one-ahead"])])] == [
        "mask-one-ahead"
    ]


def test_where_nothing_matches_the_claim_says_where_and_what_its_failures_share():
    located = conclude([finding("t1", tq=1, tk=17), finding("t2", tq=1, tk=40)])
    assert [d["name"] for d in located] == ["where", "pattern"]
    assert located[0]["text"] == "somewhere in t1"
    assert located[1]["text"] == "all 2 failing comparisons have Tq = 1 and dtype float32"


def test_a_call_too_large_to_try_the_catalogue_on_says_so():
    """A call past DIAGNOSED_WORK gets no variant computed: its diagnosis says the catalogue was
    not tried, never that no mistake matches."""
    untried = {**finding("t1"), "tried": False}
    assert "not tried on a call this large" in describe_diagnosis(conclude([untried]))
    assert "no catalogued mistake matches" in describe_diagnosis(conclude([finding("t1")]))
    # one finding tried among untried ones: what it says (nothing matched there) holds
    assert "no catalogued mistake" in describe_diagnosis(conclude([untried, finding("t2")]))
    case = Case(heads=2, tq=512, head_dim=64, dtype="float32")
    assert work_of(case) > DIAGNOSED_WORK
    q, k, v = (np.ones(shape) for shape in (case.q_shape, case.k_shape, case.v_shape))
    truth = np.ones(case.out_shape)
    comparison = compare_to_oracle(truth + 1.0, q, k, v, dtype="float32", truth=truth)
    found = diagnose(truth + 1.0, q, k, v, case=case, comparison=comparison, truth=truth)
    assert found["tried"] is False, found
    assert not found["matched"], found


def test_a_planted_wrong_diagnosis_is_reported():
    """The diagnosis matrix's check (tests/test_zoo.py) on a mutant diagnosed wrongly, not
    diagnosed, and a correct variant diagnosed at all."""
    top_left = MEMBERS["top_left_alignment"]
    evidence = [("OUT-FORMULA", "test_x", 0.1)]
    wrong = Verdict(top_left, {"OUT-FORMULA": ["test_x"]}, 30, {}, {"mask-one-ahead": evidence})
    assert diagnosis_problems(wrong) == [
        "not diagnosed as mask-top-left",
        "wrongly diagnosed as mask-one-ahead",
    ]
    right = Verdict(top_left, {"OUT-FORMULA": ["test_x"]}, 30, {}, {"mask-top-left": evidence})
    assert diagnosis_problems(right) == []
    correct = MEMBERS["fill_minus_1e9"]
    assert diagnosis_problems(Verdict(correct, {}, 30, {}, {}, ["OUT-FORMULA"]))


@pytest.mark.parametrize("width_of_id", [20, 95, 240])
def test_a_wrapped_reproducer_is_the_same_command(width_of_id):
    test_id = "conformance.test_output::test_formula[" + "x" * width_of_id + "]"
    command = f"python -m pytest --pyargs {shlex.quote(test_id)} --impl pkg.mod:attention"
    lines = shell_lines(command, "    reproduce: ", "      ")
    assert all(len(line) <= WIDTH for line in lines), lines
    pasted = "\n".join(lines).removeprefix("    reproduce: ")
    assert shlex.split(pasted.replace("\\\n", "")) == shlex.split(command)


CLASSIC = "tests.planted.classic"
THREE = f"{CLASSIC}:top_left_mask,{CLASSIC}:value_dim_scale,{CLASSIC}:unscaled_decode"


def test_three_classic_mistakes_fit_one_screen_each_named():
    """Three kernels with the mistakes new users make, judged together on every claim: their
    failures, the matrix aside, within 80 lines of at most 100 columns, each mistake named."""
    run = run_module("conformance", "run", "--impl", THREE)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    lines = run.stdout.splitlines()
    before_matrix = lines[: lines.index("attnspec: claim x implementation")]
    assert len(before_matrix) <= 80, "\n".join(before_matrix)
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert not too_wide, too_wide
    text = "\n".join(before_matrix)
    for kernel, mistake in (
        ("top_left_mask", "mask-top-left"),
        ("value_dim_scale", "scale-value-dim"),
        ("unscaled_decode", "scale-missing-at-decode"),
    ):
        block = text.split(f"{CLASSIC}:{kernel}", 1)[1].split(f"\n{CLASSIC}:", 1)[0]
        assert f"diagnosis: {mistake}: " in block, block
        assert "no catalogued mistake" not in block.split("MASK-PREFIX")[0], block
    assert "baseline err 0.000e+00" not in text
    assert "of budget [" not in text


def test_a_broken_first_call_is_said_once_and_undeclared_claims_are_not_checked():
    run = run_module("conformance", "run", "--impl", f"{CLASSIC}:wrong_shape")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    verdicts = run.stdout.split("attnspec: verdict per implementation", 1)[1]
    verdicts = verdicts.split("attnspec: claim x implementation", 1)[0]
    said = " ".join(verdicts.split())  # the message is wrapped at 100 columns
    assert said.count("returned shape (1, 16, 2, 16) at its first call") == 1, verdicts
    assert verdicts.count("reproduce: ") == 1, verdicts
    matrix = run.stdout.split("attnspec: claim x implementation", 1)[1]
    rows = {line.split()[0]: line for line in matrix.splitlines() if "(MUST)" in line}
    for claim in ("GQA-GROUPS", "WINDOW-BOUNDS", "PAD-KEYS", "MASK-GRAD"):
        assert "skip" in rows[claim], rows[claim]
        assert "FAIL" not in rows[claim], rows[claim]
    assert "FAIL" in rows["OUT-FORMULA"]
