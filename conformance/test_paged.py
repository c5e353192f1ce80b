"""Extensions, paged key/value caches: k and v as the page pools of a serving engine, read through
a block table per item and cut at its key length (PAGED-KV), and the pages and slots no item owns
never read (PAGED-UNREAD).

The worker lays each dense case out as a pool (spec.formula.page_pool): twice the pages needed,
in an order drawn from the keys, NaN in every page no table points to, +inf in the slots of a
last page past its item's length, and the tables' spare entries pointing at a NaN page. Any read
of what an item does not own therefore shows in its rows."""

from __future__ import annotations

import pytest

from conformance.judge.assertions import assert_matches_oracle
from conformance.judge.harness import Case

PAGED_CASES = {
    # a decoding batch: one item at its full cache, one mid-page, one exactly at 4 pages of 16
    "decode": Case(
        batch=3, heads=4, kv_heads=2, tq=1, tk=100, head_dim=16, key_lengths=(100, 37, 64)
    ),
    # chunked prefill against caches of 3 full pages and of 1 page and a part
    "prefill": Case(batch=2, heads=2, tq=6, tk=48, head_dim=16, key_lengths=(48, 20)),
    # pages of one key each: every key its own page, in random order
    "page of 1": Case(batch=2, heads=2, tq=4, tk=20, head_dim=16, key_lengths=(20, 9)),
    # groups that are no power of two, where a paged decode kernel broke (FlashInfer #2896: 28
    # query heads over 4): 3 and 7 query heads per key/value head
    "groups of 3": Case(
        batch=2, heads=6, kv_heads=2, tq=1, tk=40, head_dim=16, key_lengths=(40, 23)
    ),
    "groups of 7": Case(batch=1, heads=14, kv_heads=2, tq=2, tk=37, head_dim=16, key_lengths=(37,)),
    # lengths one short of a page boundary and one past one (a last page of a single key)
    "page edges": Case(batch=3, heads=2, tq=3, tk=33, head_dim=16, key_lengths=(15, 33, 31)),
}
PAGE_SIZES = {
    "decode": 16, "prefill": 16, "page of 1": 1, "groups of 3": 16, "groups of 7": 16,
    "page edges": 16,
}  # fmt: skip


@pytest.mark.claim("PAGED-KV")
@pytest.mark.parametrize("shape", list(PAGED_CASES))
def test_pages_in_table_order_are_the_keys(subject, dtype, shape):
    case = subject.fit(PAGED_CASES[shape].with_(dtype=dtype, page_size=PAGE_SIZES[shape]))
    q, k, v = subject.inputs(case)
    # The truth is the dense call on the same keys (Case.formula_variant leaves the pages out).
    assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)


UNREAD_CASES = {
    # item 1 owns one page, 11 of its 16 slots past its length (+inf); most of the pool is NaN
    "short item": Case(batch=2, heads=2, tq=3, tk=70, head_dim=16, key_lengths=(70, 5)),
    # every item's last page partial, pages of 8
    "partial pages": Case(batch=3, heads=2, tq=1, tk=45, head_dim=16, key_lengths=(45, 13, 30)),
}


@pytest.mark.claim("PAGED-UNREAD")
@pytest.mark.parametrize("shape", list(UNREAD_CASES))
def test_pages_and_slots_no_item_owns_are_never_read(subject, dtype, shape):
    page_size = 16 if shape == "short item" else 8
    case = subject.fit(UNREAD_CASES[shape].with_(dtype=dtype, page_size=page_size))
    q, k, v = subject.inputs(case)
    assert_matches_oracle(subject, case, subject.call(case, q, k, v), q, k, v)
