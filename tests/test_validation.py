"""validate_inputs refuses the score modifiers' bad values with an error naming the argument, and
lets every good one through."""

from __future__ import annotations

import numpy as np
import pytest

from impls.validation import AttentionInputError, validate_inputs

Q = K = V = np.zeros((1, 4, 6, 8))  # (B, H, T, D): four heads, one value each below


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(softcap=0.0), "softcap=0.0, but should be finite and > 0"),
        (dict(softcap=-1.0), "softcap=-1.0, but should be finite and > 0"),
        (dict(softcap=np.inf), "softcap=inf, but should be finite and > 0"),
        (dict(softcap="2"), "softcap='2', but should be a positive number"),
        (dict(softcap=True), "softcap=True, but should be a positive number"),
        (dict(alibi_slopes=(1.0, 0.5)), r"alibi_slopes has shape \(2,\), but should be \(4,\)"),
        (dict(alibi_slopes=(1.0, 0.5, np.inf, 0.1)), "alibi_slopes=.*, but each should be finite$"),
        (dict(alibi_slopes=(1.0, -np.inf, 0, 0)), "alibi_slopes=.*, but each should be finite$"),
        (dict(sinks=(0.0, np.nan, 0.0, 0.0)), "sinks=.*, but each should be finite or -inf"),
        (dict(sinks=(0.0, np.inf, 0.0, 0.0)), "sinks=.*, but each should be finite or -inf"),
        (dict(sinks="abcd"), "sinks='abcd', but should be 4 numbers"),
        (dict(chunk=0), "chunk=0, but should be an integer >= 1"),
        (dict(chunk=2.5), "chunk=2.5, but should be an integer >= 1"),
        (dict(chunk=4, causal=False), "chunk=4 with causal=False"),
    ],
)
def test_a_bad_modifier_is_refused_by_name(options, message):
    causal = options.pop("causal", True)
    with pytest.raises(AttentionInputError, match=message):
        validate_inputs(Q, K, V, causal=causal, scale=None, **options)


@pytest.mark.parametrize(
    "options",
    [
        dict(softcap=30.0),
        dict(softcap=1),
        dict(alibi_slopes=(0.5, 0.25, 0.125, 0.0625)),
        dict(alibi_slopes=np.zeros(4)),
        dict(sinks=(0.0, -np.inf, 3.0, -2.0)),
        dict(chunk=1),
        dict(chunk=np.int64(8192)),
    ],
)
def test_a_good_modifier_passes(options):
    validate_inputs(Q, K, V, causal=True, scale=None, **options)
