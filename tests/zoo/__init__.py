"""The zoo: broken implementations the suite must reject and unusual correct ones it must accept.

Every member is a plain callable (the ``--impl`` contract) registered with :func:`mutant` or
:func:`correct_variant`; ``tests/test_zoo.py`` runs the conformance suite on all of them and
holds the suite to its verdicts. Registration wraps each member so that it first validates its
inputs as the built-ins do: a mutant must be caught for its own bug, not for a missing check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from impls.block_scaled_calls import checked_block_call, is_block_scaled_call
from impls.contract import PlainCallable, validate_inputs
from impls.fp8_calls import checked_scales, is_fp8_call
from spec.mistakes import find_mistake

FAMILIES = (
    "scaling",
    "masking",
    "softmax",
    "tiling",
    "layout",
    "dtype",
    "edge case",
    # the extensions: attention as kernels ship it
    "grouped heads",
    "window",
    "padding",
    "strides",
    "score modifiers",
    "partial states",
    "paged caches",
    "memory",
    "stress",
    "backward",
    "fp8",
    "block scaled",
)


@dataclass(frozen=True)
class Member:
    name: str
    module: str
    fn: Callable
    correct: bool
    family: str | None = None  # mutants only
    caught_by: str | None = None  # the claim whose tests this bug breaks, mutants only
    hidden_at_easy_shape: bool = False  # output within budget at EASY_SHAPE (test_zoo checks it)
    # reads memory it never wrote: which claims besides caught_by fail varies from run to run
    reads_fresh_memory: bool = False
    # the catalogued mistake (spec.mistakes, spec.mistakes.state) its failures must be diagnosed
    # as, where its bug is a variant of the formula; None: a bug no variant expresses (it gets a
    # localisation)
    mistake: str | None = None
    # mistakes whose variants equal ``mistake``'s on every case this bug fails (named with it)
    alike: tuple[str, ...] = ()
    # correct variants only: the claim IDs a variant whose road leaves the formula's in one place
    # alone is judged on in the project's tests (tests.zoo.member_claims), where judging it on
    # every claim would judge again a path other members own; None: every claim (the full
    # matrix, python -m tests.zoo.kill_matrix, judges every member on every claim)
    judged_on: tuple[str, ...] | None = None

    @property
    def selector(self) -> str:
        return f"{self.module}:{self.name}"

    @property
    def doc(self) -> str:
        return " ".join((self.fn.__doc__ or "").split())


MEMBERS: dict[str, Member] = {}


def _validating(fn: Callable) -> Callable:
    # The signature the suite reads is fn's (functools.wraps), so a member declares the
    # extensions it implements by naming their keywords, as any plain callable does.
    @functools.wraps(fn)
    def member(q, k, v, *, causal=True, scale=None, **variant):
        # as numpy's block-scaled and FP8 paths check their calls
        low_precision = {name: value for name, value in variant.items() if name != "enable_gqa"}
        if is_block_scaled_call(variant):
            checked_block_call(declared(fn), q, k, v, causal, scale, low_precision)
            return fn(q, k, v, causal=causal, scale=scale, **variant)
        if is_fp8_call(q, k, v, variant):
            checked_scales(declared(fn), q, k, v, causal, scale, low_precision)
            return fn(q, k, v, causal=causal, scale=scale, **variant)
        # what validate_inputs does not take: PyTorch's flag and the request for a second output
        checked = {
            name: value
            for name, value in variant.items()
            if name not in ("enable_gqa", "return_lse")
        }
        gqa = variant.get("enable_gqa", False)
        validate_inputs(q, k, v, causal=causal, scale=scale, gqa=gqa, **checked)
        return fn(q, k, v, causal=causal, scale=scale, **variant)

    return member


@functools.cache
def declared(fn: Callable):
    """What ``fn`` declares, as the suite reads it."""
    return PlainCallable(fn, fn.__name__).capabilities


def _register(member: Member) -> None:
    if member.name in MEMBERS:
        raise ValueError(f"zoo member {member.name!r} registered twice")
    if not (member.fn.__doc__ or "").strip():
        raise ValueError(f"zoo member {member.name!r} has no docstring saying what it is")
    MEMBERS[member.name] = member


def mutant(
    family: str,
    caught_by: str,
    *,
    hidden_at_easy_shape: bool = False,
    reads_fresh_memory: bool = False,
    mistake: str | None = None,
    alike: tuple[str, ...] = (),
):
    """Register a broken implementation: which family of bug, the claim expected to catch it and
    the catalogued mistake its failures must be diagnosed as, if any."""
    if family not in FAMILIES:
        raise ValueError(f"family={family!r}, but should be one of {FAMILIES}")
    for name in (mistake, *alike) if mistake else alike:
        find_mistake(name)  # a ValueError naming the known ones

    def register(fn: Callable) -> Callable:
        fn = _validating(fn)
        _register(
            Member(
                fn.__name__,
                fn.__module__,
                fn,
                False,
                family,
                caught_by,
                hidden_at_easy_shape,
                reads_fresh_memory,
                mistake,
                alike,
            )
        )
        return fn

    return register


def correct_variant(fn: Callable | None = None, *, judged_on: tuple[str, ...] | None = None):
    """Register an unusual but correct implementation: it must pass every MUST claim (those of
    ``judged_on`` in the project's tests, where its road differs only there)."""

    def register(fn: Callable) -> Callable:
        fn = _validating(fn)
        _register(Member(fn.__name__, fn.__module__, fn, True, judged_on=judged_on))
        return fn

    return register if fn is None else register(fn)


def load_members() -> dict[str, Member]:
    """Every member, mutants and correct variants, by name."""
    from tests.zoo import (  # noqa: F401  (importing registers them)
        backward,
        block_scaled,
        caches,
        correct,
        extensions,
        fp8,
        masks,
        modifiers,
        mutants,
        states,
    )

    return MEMBERS
