"""The assertion helpers' one message: the claims come from the subject (bound once, from the
test's marker), then the implementation and the call, then the reproducer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.judge.assertions import assert_equal, fail
from conformance.judge.harness import Case, Document, Subject


def failure_message(call) -> str:
    with pytest.raises(pytest.fail.Exception) as raised:
        call()
    return str(raised.value)


def test_a_subject_names_its_claims_implementation_call_and_reproducer():
    client = SimpleNamespace(name="numpy")
    subject = Subject(client, "numpy", 7, "conformance/test_x.py::test_y[numpy]", ("OUT-FORMULA",))
    case = Case(tq=3)
    message = failure_message(lambda: assert_equal(subject, case, "out.dtype", "f4", "f8"))
    assert message.splitlines() == [
        "out.dtype='f4', but should be 'f8' [OUT-FORMULA numpy attention(causal=True, scale=None)]",
        "reproduce: python -m pytest --pyargs 'conformance.test_x::test_y[numpy]' --impl numpy "
        f"--attnspec-seed 7   # {case.describe()}",
    ]


def test_the_document_names_its_claims_and_reproducer():
    document = Document("conformance/test_scores.py::test_z", ("DOT-GROWTH", "SCALE-UNIT"))
    message = failure_message(lambda: fail(document, None, "std=3, but should be 8"))
    assert message.splitlines() == [
        "std=3, but should be 8 [DOT-GROWTH SCALE-UNIT]",
        "reproduce: python -m pytest --pyargs 'conformance.test_scores::test_z'",
    ]
