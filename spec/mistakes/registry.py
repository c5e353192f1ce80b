"""The one record of a mistake and the one registry every family's module fills (the package's
docstring says what a mistake and a family are)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    OUTPUT = "output"
    LSE = "lse"
    MERGE = "merge"
    GRADIENT = "gradient"
    FP8 = "fp8"
    BLOCK = "block"


@dataclass(frozen=True)
class Mistake:
    name: str  # stable: reports, the zoo and the README use it
    family: Family
    text: str  # what the mistake is, in one sentence
    hint: str  # where it usually comes from
    variant: Callable  # the family's call -> what the judge compares (the table above)
    shows: Callable  # the family's call -> whether the variant can differ from the truth
    # The output's only: the formula itself computed in this coarser dtype (no variant: the
    # answer matches where it lies within that dtype's budget of the truth)
    precision: str | None = None
    # the output's: applied to each padded item or packed sequence alone, as the formula is
    per_sequence: bool = True
    # the output's: the score modifier (spec.features) whose mistake it is; its variant models
    # every modifier, where the others apply to calls without one
    modifier: str | None = None


MISTAKES: dict[str, Mistake] = {}


def mistake(family: Family, name: str, text: str, hint: str, shows: Callable, **options):
    """Register the decorated variant as ``family``'s mistake ``name``."""

    def register(variant):
        if name in MISTAKES:
            raise ValueError(f"mistake {name!r} registered twice")
        MISTAKES[name] = Mistake(name, Family(family), text, hint, variant, shows, **options)
        return variant

    return register


def of_family(*families: Family) -> list[Mistake]:
    """The mistakes of ``families``, in the order they were registered."""
    return [m for m in MISTAKES.values() if m.family in families]


def find_mistake(name: str) -> Mistake:
    """The mistake called ``name``, of any family, or a ValueError naming every known one."""
    if name not in MISTAKES:
        raise ValueError(f"mistake {name!r}, but should be one of {', '.join(MISTAKES)}")
    return MISTAKES[name]
