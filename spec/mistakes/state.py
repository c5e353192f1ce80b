"""The mistakes of kernels that return their softmax state: a log-sum-exp beside the output
(LSE-VALUE) and a merge of partial states (LSE-MERGE), each a variant of the formula
(:func:`spec.formula.reference_log_sum_exp`, :func:`spec.formula.merge_states`).

They are the lse and merge families of :mod:`spec.mistakes`: a kernel whose log-sum-exp is off while
its output is right has one of these, and ``conformance/judge/diagnosis.py`` names those a
failing log-sum-exp or merge matches within the budget it failed against. A variant gives what
the judge compares: the log-sum-exp in the natural base (the judge converts a declared base 2),
and a merge's (out, lse) with its lse in the declared base.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from spec.formula import reference_log_sum_exp, reference_masked_scores
from spec.mistakes.registry import Family, mistake


@dataclass(frozen=True)
class LseCall:
    """A call whose log-sum-exp is judged: its float64 q and k, its options (causal, scale and
    the features' keywords), and the base the implementation declares."""

    q: np.ndarray
    k: np.ndarray
    options: dict = field(hash=False)
    base: str = "e"

    @cached_property
    def truth(self) -> np.ndarray:
        """The oracle's natural log-sum-exp, (B, H, Tq)."""
        return reference_log_sum_exp(self.q, self.k, **self.options)

    @property
    def split(self) -> bool:
        """Whether its rows are padded items or packed sequences, each over its own keys."""
        return any(self.options.get(name) is not None for name in ("query_lengths", "cu_seqlens_q"))


@dataclass(frozen=True)
class MergeCall:
    """A shipped merge's inputs: outputs (P, B, H, Tq, Dv) and lses (P, B, H, Tq) in ``base``."""

    outputs: np.ndarray
    lses: np.ndarray
    base: str = "e"


def state_mistake(name: str, text: str, hint: str, of: Family, shows: Callable):
    """Register the decorated variant as the state mistake ``name`` of ``of``: Family.LSE (a
    returned log-sum-exp's) or Family.MERGE (a shipped merge's)."""
    return mistake(of, name, text, hint, shows)


# --- the log-sum-exp -----------------------------------------------------------------------------


@state_mistake(
    "lse-other-base",
    "the log-sum-exp in the other base than the one declared (log2 of the sum declared "
    "natural, or the natural one declared base 2)",
    "a kernel computing with exp2 returns its running max and sum as they are, in base 2",
    "lse",
    lambda call: True,
)
def _lse_other_base(call: LseCall) -> np.ndarray:
    # declared e, returned log2: truth / ln 2; declared 2, returned natural: the judge's
    # conversion multiplies it by ln 2 once more
    return call.truth / math.log(2) if call.base == "e" else call.truth * math.log(2)


@state_mistake(
    "lse-with-sink",
    "the sink's logit included in the log-sum-exp: log(sum_j exp(x_j) + exp(s_h))",
    "the state taken after the sink joined the running sum, where it should be before",
    "lse",
    lambda call: any(np.isfinite(s) for s in call.options.get("sinks") or ()),
)
def _lse_with_sink(call: LseCall) -> np.ndarray:
    sinks = np.asarray(call.options["sinks"], np.float64)[:, None]  # (H, 1)
    return np.logaddexp(call.truth, sinks)


@state_mistake(
    "lse-max-not-added-back",
    "log(sum_j exp(x_j - m)) returned without the row max m added back",
    "the running sum's log returned where the running max plus it belongs",
    "lse",
    lambda call: not call.split,
)
def _lse_max_not_added(call: LseCall) -> np.ndarray:
    options = {name: value for name, value in call.options.items() if name != "sinks"}
    top = reference_masked_scores(call.q, call.k, **options).max(axis=-1)  # (B, H, Tq)
    return call.truth - np.where(np.isneginf(top), 0.0, top)


@state_mistake(
    "lse-unscaled",
    "the log-sum-exp of q k^T before the softmax scale",
    "the scale folded into the exponent of the output's weights only",
    "lse",
    lambda call: call.options.get("scale") != 1.0 and not call.options.get("softcap"),
)
def _lse_unscaled(call: LseCall) -> np.ndarray:
    return reference_log_sum_exp(call.q, call.k, **{**call.options, "scale": 1.0})


@state_mistake(
    "lse-default-scale",
    "the log-sum-exp under the default scale 1/sqrt(D), not the call's own",
    "the row max exported under another scale than the softmax's (TensorRT-LLM PR #19112: MLA's "
    "scale, 1/sqrt(192) times mscale^2, against 1/sqrt(576))",
    "lse",
    lambda call: (
        call.options.get("scale") is not None
        and not math.isclose(call.options["scale"], call.q.shape[-1] ** -0.5)
        and not call.options.get("softcap")
    ),
)
def _lse_default_scale(call: LseCall) -> np.ndarray:
    return reference_log_sum_exp(call.q, call.k, **{**call.options, "scale": None})


@state_mistake(
    "lse-keeps-p-offset",
    "the log-sum-exp of P's sum at P's FP8 scale of 2^8 (ln 2^8 too large), where the output "
    "divides the 2^8 out",
    "the row sum of the P * 2^8 that an FP8 P v product takes, logged as it is",
    "lse",
    lambda call: True,
)
def _lse_keeps_p_offset(call: LseCall) -> np.ndarray:
    return call.truth + 8 * math.log(2)


# --- the merge -----------------------------------------------------------------------------------


def merge_with(
    call: MergeCall,
    *,
    base: str | None = None,
    subtract_max: bool = True,
    skip_empty: bool = True,
    guard_unseen_rows: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """spec.formula.merge_states in float64 with one step switched: the exponential of ``base``
    (the call's by default), the largest lse subtracted first, parts that saw no key skipped, a
    row no part saw (its largest lse -inf) kept from -inf - (-inf)."""
    base = base or call.base
    outputs, lses = np.asarray(call.outputs, np.float64), np.asarray(call.lses, np.float64)
    top = lses.max(axis=0) if subtract_max else np.zeros(lses.shape[1:])
    if guard_unseen_rows:
        top = np.where(np.isneginf(top), 0.0, top)
    with np.errstate(all="ignore"):
        weights = np.exp2(lses - top) if base == "2" else np.exp(lses - top)  # (P, B, H, Tq)
        parts = weights[..., None] * outputs
        if skip_empty:
            parts = np.where(weights[..., None] > 0, parts, 0.0)
        total = weights.sum(axis=0)  # (B, H, Tq)
        out = parts.sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]
        lse = top + (np.log2(total) if base == "2" else np.log(total))
    return out, lse


@state_mistake(
    "merge-other-base",
    "the parts weighed with the other base's exponential than their lses are in",
    "exp where the lses are log2 of their sums (or exp2 where they are natural)",
    "merge",
    lambda call: True,
)
def _merge_other_base(call: MergeCall):
    return merge_with(call, base="e" if call.base == "2" else "2")


@state_mistake(
    "merge-no-max-subtraction",
    "the parts weighed by exp(lse_i) itself, the largest lse not subtracted first",
    "the weights' exponential taken of the lses as they are: it overflows past 88 in float32",
    "merge",
    lambda call: bool(np.nanmax(np.where(np.isfinite(call.lses), call.lses, np.nan)) > 80),
)
def _merge_no_max(call: MergeCall):
    return merge_with(call, subtract_max=False)


@state_mistake(
    "merge-empty-part-nan",
    "a part that saw no key (lse -inf) weighed in: its weight 0 times the NaN it holds is NaN",
    "every part multiplied in, where an empty split should be skipped",
    "merge",
    lambda call: bool(np.isneginf(call.lses).any()),
)
def _merge_empty_part(call: MergeCall):
    return merge_with(call, skip_empty=False)


@state_mistake(
    "merge-unseen-row-nan",
    "a row that no part saw (every lse -inf) merged as NaN: its largest lse is -inf, and "
    "-inf - (-inf) is NaN",
    "the largest lse subtracted unguarded; right wherever one part saw a key (FlashInfer #4975)",
    "merge",
    lambda call: bool(np.isneginf(np.asarray(call.lses)).all(axis=0).any()),
)
def _merge_unseen_row(call: MergeCall):
    return merge_with(call, guard_unseen_rows=False)
