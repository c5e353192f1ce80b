"""Each planted bug is rejected on the claim it breaks."""

from __future__ import annotations

import pytest

PLANTED = {
    # callable: (claims to run, a claim that must fail)
    "mask_off_by_one": ("MASK-*", "MASK-ZERO"),
    "top_left_alignment": ("MASK-PREFIX", "MASK-PREFIX"),
    "no_max_subtraction": ("SOFTMAX-STABLE", "SOFTMAX-STABLE"),
    "max_before_masking": ("MASK-FUTURE-INVARIANT", "MASK-FUTURE-INVARIANT"),
    "heads_swapped": ("CONTRACT-BATCH", "CONTRACT-BATCH"),
    "scale_by_one_over_d": ("SCALE-FORMULA", "SCALE-FORMULA"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_fails_its_claim(suite, name):
    pattern, claim = PLANTED[name]
    run = suite("--impl", f"tests.planted.plain:{name}", "--claims", pattern, "-q")
    assert run.returncode == 1, run.stdout[-2000:]
    assert f"failed MUST {claim}:" in run.stdout, run.stdout[-2000:]
