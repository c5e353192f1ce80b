"""How a test's custom mask is drawn: a recipe a case holds, the mask drawn for the case's shape.

A case is frozen and hashable and is fitted to what a kernel declares (its lengths may change),
so it holds the recipe, not the array; :meth:`MaskDraw.array` draws the same mask for the same
recipe and shape every time. Reports name the recipe ("attn_mask=<30% per item, seed 1>").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec.masks import visible_keys

PATTERNS = ("random", "causal", "all")


@dataclass(frozen=True)
class MaskDraw:
    density: float = 0.5  # the chance that a query sees a key, drawn key by key ("random")
    per_item: bool = True  # a mask per batch item, else one shared (broadcast over B)
    per_head: bool = False  # a mask per query head, else one shared (broadcast over H)
    blind_rows: int = 0  # rows that see no key at all, spread over the rows
    hidden_keys: int = 0  # keys no row sees, spread over the keys
    # every row sees the key at its own position (or the last): no row is left without a key
    own_key: bool = False
    pattern: str = "random"  # "causal": the causal mask itself; "all": every key
    seed: int = 0

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern={self.pattern!r}, but should be one of {PATTERNS}")
        if not 0.0 <= self.density <= 1.0:
            raise ValueError(f"density={self.density}, but should lie in [0, 1]")

    def array(self, batch: int, heads: int, tq: int, tk: int) -> np.ndarray:
        """The boolean mask, (B or 1, H or 1, Tq, Tk), True where the query may see the key."""
        shape = (batch if self.per_item else 1, heads if self.per_head else 1, tq, tk)
        if self.pattern == "causal":
            mask = np.broadcast_to(visible_keys(tq, tk, causal=True), shape).copy()
        elif self.pattern == "all":
            mask = np.ones(shape, bool)
        else:
            rng = np.random.default_rng([self.seed, *shape])
            mask = rng.random(shape) < self.density
        if self.own_key:
            rows = np.arange(tq)
            mask[..., rows, np.minimum(rows + tk - tq, tk - 1)] = True
        if self.blind_rows:
            mask[..., spread(tq, self.blind_rows), :] = False
        if self.hidden_keys:
            mask[..., spread(tk, self.hidden_keys)] = False
        return mask

    def __str__(self) -> str:
        what = {"causal": "the causal mask", "all": "every key"}.get(
            self.pattern, f"{self.density:.0%}"
        )
        spans = [w for w, on in (("per item", self.per_item), ("per head", self.per_head)) if on]
        extras = [f"{n} {w}" for n, w in ((self.blind_rows, "blind rows"),
                                         (self.hidden_keys, "hidden keys")) if n]  # fmt: skip
        extras += ["each row's own key"] if self.own_key else []
        seed = [f"seed {self.seed}"] if self.pattern == "random" else []
        return f"<{', '.join([what, *spans, *extras, *seed])}>"


def spread(count: int, chosen: int) -> np.ndarray:
    """``chosen`` of ``count`` indices, evenly spread and the last one included."""
    return np.unique(np.linspace(count - 1, 0, min(chosen, count)).round().astype(int))
