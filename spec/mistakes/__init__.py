"""The mistakes attention kernels make: one record of one shape each, in one registry.

A failed claim says *that* a kernel is wrong; the judge names *why* by computing each mistake's
variant on the failing inputs and reporting those the answer matches within the budget it failed
against (``conformance/judge/diagnosis.py``, one match-or-refute loop for every family). Each
mistake is a :class:`Mistake`: a stable name, one sentence on what it is, a hint on where it
usually comes from, its family, its variant (the family's truth with that one step changed) and
``shows(call)``, which says cheaply whether the variant can differ from the truth on a call: a
variant that cannot differ proves nothing and is not computed.

A family says what the mistake is a mistake of, and so which call its variant takes and what it
gives; a module each:

| family | module | call | the variant gives |
| --- | --- | --- | --- |
| output | forward | q, k, v (float64) and a forward.Call | the output (B, H, Tq, Dv) |
| lse | state | state.LseCall | the natural log-sum-exp (B, H, Tq) |
| merge | state | state.MergeCall | the merged (out, lse), lse in the declared base |
| gradient | gradients | gradients.GradientCall | {"q", "k", "v"[, "sinks"]} |
| fp8 | fp8 | fp8.Fp8Call | the output, in the declared arithmetic |
| block | block_scaled | spec.block_scaled.BlockCall | the output, in the declared arithmetic |
"""

from __future__ import annotations

# Every family's module registers its mistakes as it is imported.
from spec.mistakes import block_scaled, forward, fp8, gradients, state  # noqa: F401
from spec.mistakes.registry import MISTAKES, Family, Mistake, find_mistake, mistake, of_family

__all__ = ["MISTAKES", "Family", "Mistake", "find_mistake", "mistake", "of_family"]
