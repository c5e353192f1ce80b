"""A claim that meets NaN in an output says NaN, where and how much; OUT-WRITTEN tells memory a
kernel never wrote from NaN it computed, by the plain call's answer beside the poisoned one's."""

from __future__ import annotations

from tests.suite_process import run_suite


def test_nan_is_named_and_told_apart_from_unwritten_memory():
    outputs = []
    for impl, claims in (
        ("tests.planted.nan_paths:nan_in_the_partial_tile", "OUT-WRITTEN,OUT-FORMULA"),
        ("tests.zoo.extensions:last_head_unwritten", "OUT-WRITTEN"),
    ):
        result = run_suite("--impl", impl, "--claims", claims, "-q")
        assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
        outputs.append(result.stdout)
    text = " ".join(" ".join(outputs).split())  # the verdict's lines are wrapped
    # computed: NaN in the plain call too
    assert "hold NaN in the plain call too: it computed them" in text, text[-4000:]
    # unwritten: NaN only where fresh allocations were poisoned
    assert "hold NaN only with fresh allocations filled with NaN: it never wrote them" in text
    assert "out: >1000x budget: NaN in 4096 of 12416 elements where the truth is finite" in text
