"""A kernel is called only within what it declares (head dims, lengths, an lse it does not
differentiate), unless a test's point is the undeclared call; the declarations themselves are
checked when made."""

from __future__ import annotations

import pytest

from impls.capabilities import Capabilities
from tests.suite_process import run_suite


def test_a_kernel_with_narrow_limits_is_judged_within_them():
    """tests/planted/narrow.py refuses every call outside its declaration and answers NaN for an
    lse gradient: a failure would be a call the suite should not have made. CONTRACT-ERRORS
    called it at D = 4 whatever it declared, once."""
    result = run_suite("--impl", "tests.planted.narrow:NarrowKernel", "-q", "-rs")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "FAILED" not in result.stdout, result.stdout[-4000:]
    # What it declares is honoured by skips that name it, not by judging nothing.
    assert "sequence length 17 (it declares multiples of 128 from 128)" in result.stdout
    assert "the log-sum-exp's gradient (lse_backward)" in result.stdout
    assert "narrow-limits  conforms" in result.stdout, result.stdout[-3000:]


def test_the_same_kernel_declaring_no_limits_fails():
    """The control: its refusals and NaN, which the suite must see where it makes those calls."""
    result = run_suite("--impl", "tests.planted.narrow:NarrowKernelDeclaredWide", "-q")
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]
    assert "FAILED MUST GRAD-LSE" in result.stdout, result.stdout[-4000:]
    assert "FAILED MUST CONTRACT-DTYPE" in result.stdout, result.stdout[-4000:]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(length_multiple=0), "length_multiple=0, but should be a positive integer"),
        (dict(min_length=True), "min_length=True, but should be a positive integer"),
        (dict(max_length=0), r"max_length=0, but should be a positive integer or None"),
        (dict(length_multiple=128, max_length=100), "from 1 to 100: there is none"),
    ],
)
def test_a_bad_length_rule_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        Capabilities(dtypes=("float32",), **fields)


def test_lengths_are_fitted_upwards_within_the_rule():
    caps = Capabilities(dtypes=("float32",), length_multiple=64, min_length=128, max_length=512)
    assert [caps.fit_length(n) for n in (1, 128, 129, 600)] == [128, 128, 192, 512]
    assert caps.length_problem(192) is None
    assert (
        caps.length_problem(100)
        == "sequence length 100 (it declares multiples of 64 from 128 to 512)"
    )
