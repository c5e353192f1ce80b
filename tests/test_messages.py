"""The line between the judge and a worker carries its messages and nothing else: a worker runs
the implementation's code, so what the judge reads from it must not be able to run code there."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import impls
from conformance.run.worker_clients import ImplementationDied, open_clients
from impls import messages
from impls.capabilities import Capabilities
from tests.planted.meddling import _RunsInTheJudge

FORGER = "tests.planted.meddling:forges_an_answer"


def test_the_messages_and_arrays_round_trip():
    answer = messages.Answered(
        (messages.OutputArray(np.arange(6.0).reshape(2, 3)[:, ::2], "float64", "cpu", "cpu"),)
    )
    back = messages.loads(messages.dumps(answer), messages.ANSWERS)
    np.testing.assert_array_equal(back.outputs[0].array, answer.outputs[0].array)
    ready = messages.Ready(
        messages.Description(
            "x", "numpy", "cpu", "1", Capabilities(dtypes=("float32",), gqa=True), None, None
        )
    )
    assert messages.loads(messages.dumps(ready), messages.GREETINGS) == ready
    assert messages.Description.from_plain(ready.description.as_plain()) == ready.description


def test_a_message_naming_any_other_global_is_refused_unrun():
    with pytest.raises(messages.LineError, match=r"builtins\.exec, which is not part of the line"):
        messages.loads(pickle.dumps(_RunsInTheJudge(), protocol=5), messages.ANSWERS)
    assert not hasattr(impls, "LINE_FORGED")


def test_a_message_out_of_its_turn_is_refused():
    with pytest.raises(messages.LineError, match="a Close where the line expects Answered"):
        messages.loads(messages.dumps(messages.Close()), messages.ANSWERS)


def assert_one_call_kills_the_worker(selector: str, match: str) -> None:
    """One attention call on ``selector``'s worker ends it: ImplementationDied, saying ``match``."""
    (client,) = open_clients([selector])
    q = client.from_numpy(np.ones((1, 1, 4, 8)), "float64")
    try:
        with pytest.raises(ImplementationDied, match=match):
            client.attention(q, q, q, causal=True)
    finally:
        client.close()


def test_a_worker_that_announces_a_huge_answer_dies_and_the_judge_allocates_nothing():
    assert_one_call_kills_the_worker(
        "tests.planted.meddling:announces_a_huge_answer",
        "arrays of 1125899906842624 bytes announced",
    )


def test_a_worker_that_forges_a_message_dies_and_runs_nothing_in_the_judge():
    assert_one_call_kills_the_worker(FORGER, "broke the line in attention")
    assert not hasattr(impls, "LINE_FORGED")
