"""``--first-failure``: an implementation's verdict as soon as it FAILS, for loops where most
candidates are wrong.

The claims that most often fail run first: :data:`FAILURE_ORDER` ranks the MUST claims by how
many of the zoo's mutants each rejects (docs/zoo.md's kill matrix, which
``tests/test_first_failure.py`` holds this order to), so a wrong kernel meets the claim it most
likely breaks early. Once one of an implementation's tests fails a MUST claim in a process of the
run, its remaining tests there are not run: they are "not checked", with the reason, and its
verdict is FAILS already.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The MUST claims that reject a zoo mutant, most mutants first (ties in the catalogue's order).
FAILURE_ORDER = (
    "OUT-FORMULA", "OUT-WRITTEN", "MASK-PREFIX", "SOFTMAX-STABLE", "SCALE-FORMULA",
    "LAYOUT-STRIDES", "OUT-AFFINE", "SCORE-DOT", "OUT-MULTIHEAD", "SOFTMAX-ROWSUM", "EMPTY-KV",
    "MASK-ROW0", "MASK-FUTURE-INVARIANT", "SOFTMAX-MONOTONE", "BLOCK-SCALES", "BLOCK-ACCURACY",
    "OUT-CONVEX", "BLOCK-NAN", "MASK-ZERO", "CONTRACT-BATCH", "LSE-MERGE", "FP8-ACCURACY",
    "FP8-NAN", "FP8-SCALES", "WINDOW-BOUNDS", "PAD-KEYS", "PAGED-KV", "LSE-VALUE", "OUT-HEAD-SHAPE",
    "CONTRACT-DTYPE", "WINDOW-INVARIANT", "MASK-CUSTOM", "CASCADE-LEVELS", "BLOCK-MAGNITUDE",
    "SOFTMAX-NONNEG", "CONTRACT-DETERMINISM", "MASK-PACKED", "SPARSE-KEYS", "SPARSE-BLOCKS",
    "PAD-PACKED", "PAGED-UNREAD", "SINK-LOGIT", "SCORE-SHAPE", "GQA-GROUPS", "GQA-MQA",
    "MASK-CUSTOM-AS-CAUSAL", "MASK-TREE", "SOFTCAP", "ALIBI", "CHUNKED-LOCAL", "GRAD-WINDOW",
    "GRAD-SINK", "GRAD-SPARSE", "FP8-FORMAT", "OUT-GRAD", "MASK-CUSTOM-INVARIANT",
    "SPARSE-INVARIANT", "SPARSE-TOPK", "GRAD-GQA", "GRAD-PADDING", "GRAD-PACKED", "GRAD-SOFTCAP",
    "GRAD-ALIBI", "GRAD-CUSTOM-MASK", "BLOCK-PAGED",
)  # fmt: skip


def failure_rank(claims: list[str]) -> int:
    """Where a test with ``claims`` runs under --first-failure: the rank of its claim that
    fails most often; after every ranked claim where it has none."""
    ranks = [FAILURE_ORDER.index(claim) for claim in claims if claim in FAILURE_ORDER]
    return min(ranks, default=len(FAILURE_ORDER))


@dataclass
class FirstFailures:
    """What this process has seen fail: implementation -> (its claims, the test)."""

    seen: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)

    def note(self, implementation: str, claims: list[str], test: str) -> None:
        self.seen.setdefault(implementation, (tuple(claims), test))

    def why_not_judged(self, implementation: str) -> str | None:
        """The reason its next tests are not run, or None while it has failed nothing."""
        if implementation not in self.seen:
            return None
        claims, test = self.seen[implementation]
        return (
            f"not judged further: {implementation} already FAILS {', '.join(claims)} "
            f"({test}; --first-failure)"
        )
