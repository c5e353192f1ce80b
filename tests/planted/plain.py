"""Plain callables (the --impl contract): a correct one, and ones that break the contract itself.

Implementations with numerical or masking bugs live in the zoo (``tests/zoo``)."""

from __future__ import annotations

from impls.contract import validate_inputs
from tests.zoo.formula import attend


def correct(q, k, v, *, causal=True, scale=None):
    """A correct plain implementation: the suite must accept it."""
    validate_inputs(q, k, v, causal=causal, scale=scale)
    return attend(q, k, v, causal=causal, scale=scale)


def returns_a_list(q, k, v, *, causal=True, scale=None):
    """Returns a nested list instead of an array."""
    return correct(q, k, v, causal=causal, scale=scale).tolist()


def wrong_signature(q, k):
    """Takes no v and no keywords."""
    return q


NOT_CALLABLE = 42
