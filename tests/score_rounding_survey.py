"""Why the float32 floor carries the scores' rounding: correct float32 kernels that only sum their
dot products in another order, and kernels whose scores are a few ulps off, judged with and
without that term, over many inputs of SOFTMAX-STABLE's large-score case (docs/tolerance.md).

    python -m tests.score_rounding_survey            # 50 inputs per size, about a minute

Each row: a kernel at one size of the largest score, its worst budget fraction over the inputs
and on how many it failed, under the floor without the term (the rule before it) and with it.
PyTorch's SDPA joins the kernels where torch is installed.
"""

from __future__ import annotations

import argparse

import numpy as np

from conformance.judge.tolerance import compare, compare_to_oracle
from conformance.judge.truth import CaseTruth, largest_finite
from conformance.report.tables import text_table
from spec.dtypes import UNIT_ROUNDOFF, round_to
from spec.formula import reference_scores

SIZES = (1e2, 1e4, 3e4)  # the largest scaled score; SOFTMAX-STABLE's float32 cases reach 1e4
U32 = UNIT_ROUNDOFF["float32"]


def inputs_with_scores_up_to(largest: float, seed: int, head_dim: int = 16):
    """SOFTMAX-STABLE's large-score case: q, k, v of (1, 2, 33, head_dim) in float32, q and k
    scaled alike so that the largest scaled score is about ``largest``."""
    rng = np.random.default_rng(seed)
    shape = (1, 2, 33, head_dim)
    q, k, v = (round_to(rng.standard_normal(shape), "float32") for _ in range(3))
    factor = np.sqrt(largest / np.abs(reference_scores(q, k)).max())
    return round_to(q * factor, "float32"), round_to(k * factor, "float32"), v


def float32_scores(q, k, order: str) -> np.ndarray:
    """q k^T / sqrt(D) in float32, every product and sum rounded to float32 by NumPy itself (no
    BLAS: the same on any CPU), its D terms added ``"forwards"`` (from the first component to the
    last, as a plain loop does), ``"backwards"`` (from the last to the first) or ``"pairwise"``
    (in pairs, then the pairs in pairs, as a reduction across a warp does; D a power of two).
    (B, H, Tq, Tk)."""
    q, k = np.asarray(q, np.float32), np.asarray(k, np.float32)
    terms = q[..., :, None, :] * k[..., None, :, :]  # (B, H, Tq, Tk, D)
    if order == "pairwise":
        while terms.shape[-1] > 1:
            terms = terms[..., 0::2] + terms[..., 1::2]  # (B, H, Tq, Tk, D / 2)
        scores = terms[..., 0]
    else:
        components = range(terms.shape[-1])
        scores = np.zeros(terms.shape[:-1], np.float32)  # (B, H, Tq, Tk)
        for d in reversed(components) if order == "backwards" else components:
            scores += terms[..., d]
    return scores * np.float32(q.shape[-1] ** -0.5)


def causal_attention(scores: np.ndarray, v) -> np.ndarray:
    """softmax(causal mask(scores)) V in float32 (float64 scores: in float64), each sum a plain
    loop over the keys and each exponential rounded from float64's, so that no BLAS kernel nor
    NumPy's SIMD dispatch decides how it rounds: the same on every CPU."""
    dtype = scores.dtype.type
    tokens = scores.shape[-1]
    scores = np.where(np.triu(np.ones((tokens, tokens), bool), 1), -np.inf, scores)
    shifted = scores - scores.max(-1, keepdims=True)
    weights = np.exp(shifted.astype(np.float64)).astype(dtype)  # (B, H, Tq, Tk)
    total = np.zeros(weights.shape[:-1], dtype)  # (B, H, Tq)
    for key in range(tokens):
        total += weights[..., key]
    weights = weights / total[..., None]
    v = np.asarray(v, dtype)
    out = np.zeros((*weights.shape[:-1], v.shape[-1]), dtype)  # (B, H, Tq, D)
    for key in range(tokens):
        out += weights[..., key, None] * v[..., key, None, :]
    return out


def scores_off_by(q, k, relative: float, seed: int) -> np.ndarray:
    """The exact scores, each off by ``relative`` of its size, with random signs."""
    scores = reference_scores(q, k)
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=scores.shape)
    return scores * (1 + relative * signs)


def kernels(torch=None) -> dict:
    """Name -> kernel(q, k, v, seed) returning its output."""
    found = {
        "float32, pairwise sums": lambda q, k, v, _: causal_attention(
            float32_scores(q, k, "pairwise"), v
        ),
        "float32, backwards sums": lambda q, k, v, _: causal_attention(
            float32_scores(q, k, "backwards"), v
        ),
        "scores 4 ulps (8u) off": lambda q, k, v, seed: causal_attention(
            scores_off_by(q, k, 8 * U32, seed), v
        ),
        "scores 16 ulps (32u) off": lambda q, k, v, seed: causal_attention(
            scores_off_by(q, k, 32 * U32, seed), v
        ),
    }
    if torch is not None:

        def sdpa(q, k, v, _):
            tq, tk, tv = (torch.tensor(np.asarray(x, np.float32)) for x in (q, k, v))
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
            return out.double().numpy()

        found["torch_sdpa (PyTorch's CPU SDPA)"] = sdpa
    return found


def budget_fractions(out, q, k, v, baseline=None) -> tuple[float, float]:
    """``out``'s budget fraction without the scores' rounding in the floor, and with it: against
    the suite's naive baseline, or ``baseline`` where the caller rounds one itself."""
    if baseline is None:
        judged = compare_to_oracle(out, q, k, v, dtype="float32")
    else:
        case = CaseTruth(q, k, v)
        judged = compare(
            out, case.attention(), baseline, dtype="float32", magnitude=largest_finite(v),
            max_score=case.largest_score(None), score_rounding=case.score_rounding,
        )  # fmt: skip
    return judged.max_abs / (judged.allowed - judged.score_floor), judged.budget_fraction


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.score_rounding_survey", description=__doc__
    )
    parser.add_argument(
        "--inputs", type=int, default=50, metavar="N",
        help="inputs per size of the largest score (default 50)",
    )  # fmt: skip
    options = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    rows = [("kernel", "largest score", "without: max", "fails", "with: max", "fails")]
    for name, kernel in kernels(torch).items():
        for largest in SIZES:
            fractions = np.array(
                [
                    budget_fractions(kernel(q, k, v, seed), q, k, v)
                    for seed in range(options.inputs)
                    for q, k, v in [inputs_with_scores_up_to(largest, seed)]
                ]
            )  # (inputs, 2)
            without, with_term = fractions.T
            rows.append(
                (
                    name, f"{largest:g}",
                    f"{without.max():.2f}", f"{int((without > 1).sum())}/{options.inputs}",
                    f"{with_term.max():.2f}", f"{int((with_term > 1).sum())}/{options.inputs}",
                )
            )  # fmt: skip
    print("\n".join(text_table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
