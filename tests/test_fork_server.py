"""A worker forked by the fork server is the process ``python -m impls.worker_process`` would start:
the judge's environment, path and directory, no module of the judge, random state of its own;
its end is told as a started worker's is; and a fork server that dies is replaced."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import conformance.run.fork_server_client as fork_server_client
from conformance.run.worker_clients import ImplementationDied, WorkerSetup, open_clients

INTROSPECTING = "tests.planted.introspecting:attention"
HOW = {"forked": True, "started": False}


@pytest.fixture(params=list(HOW))
def how(request, monkeypatch):
    monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", HOW[request.param])
    return request.param


# The judge's variable the planted module reports, handed on as --pass-env does: a worker gets
# no other of the judge's variables than impls.sandbox lets through.
PASSING_THE_MARK = WorkerSetup(pass_env=("ATTNSPEC_TEST_MARK",))


def worker_facts(selector: str = INTROSPECTING, setup: WorkerSetup = PASSING_THE_MARK) -> dict:
    """What the planted module saw of its process when its worker imported it."""
    [client] = open_clients([selector], setup=setup)
    try:
        return json.loads(client.version().split(" ", 1)[1])
    finally:
        client.close()


def test_a_forked_worker_sees_what_a_started_one_sees(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSPEC_TEST_MARK", "set by the judge")
    monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", True)
    worker_facts()  # the fork server starts here, so the directory changes after its start
    monkeypatch.chdir(tmp_path)
    seen = {}
    for how, forked in HOW.items():
        monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", forked)
        seen[how] = worker_facts()
        assert seen[how]["cwd"] == str(tmp_path), how
        assert seen[how]["mark"] == "set by the judge", how
        assert seen[how]["judge_modules"] == [], f"a {how} worker holds the judge's modules"
        assert seen[how]["python_threads"] == 1, how
    for facts in seen.values():
        del facts["numpy_draw"], facts["python_draw"]
    assert seen["forked"] == seen["started"]


def test_a_worker_gets_no_variable_of_the_judges_it_was_not_given(monkeypatch):
    monkeypatch.setenv("ATTNSPEC_TEST_MARK", "a secret of the judge's")
    for how, forked in HOW.items():
        monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", forked)
        assert worker_facts(setup=WorkerSetup())["mark"] is None, how


def test_forked_workers_draw_their_own_random_numbers(monkeypatch):
    """The global NumPy and Python generators are seeded afresh in each worker, as they are in a
    started interpreter: not one state copied into every fork."""
    monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", True)
    first, second = worker_facts(), worker_facts()
    assert first["numpy_draw"] != second["numpy_draw"]
    assert first["python_draw"] != second["python_draw"]


def test_a_changed_environment_gets_a_fork_server_of_its_own(monkeypatch):
    """What a library reads from the environment at import (thread counts) is read in the
    fork server, so a judge that changes its environment must not be served by the old one."""
    monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", True)
    for mark in ("first", "second"):
        monkeypatch.setenv("ATTNSPEC_TEST_MARK", mark)
        assert worker_facts()["mark"] == mark


@pytest.mark.parametrize(
    ("selector", "cause"),
    [
        ("tests.planted.crashing:segfaults", "killed by SIGSEGV (a segfault)"),
        ("tests.planted.crashing:exits", "exited with status 3"),
    ],
)
def test_a_worker_that_dies_is_told_by_its_cause(how, selector, cause):
    [client] = open_clients([selector])
    x = client.from_numpy(np.ones((1, 1, 4, 8)), "float64")
    try:
        with pytest.raises(ImplementationDied, match="ended its worker process") as died:
            client.attention(x, x, x)
        assert cause in str(died.value)
    finally:
        client.close()


@pytest.mark.parametrize("when", ["between calls", "during a call"])
def test_a_fork_server_that_dies_is_replaced_and_no_call_is_lost_with_it(monkeypatch, when):
    """Its workers die with it (impls.sandbox.die_with_parent); the implementation did nothing,
    so the call it was in, or the next, is answered by a fresh worker of a fresh fork server."""
    monkeypatch.setattr(fork_server_client, "WORKERS_ARE_FORKED", True)
    [client] = open_clients(["tests.planted.crashing:right_after_a_second"])
    x = client.from_numpy(np.ones((1, 1, 4, 8)), "float64")
    try:
        client.attention(x, x, x)
        server = client.channel.process.fork_server
        if when == "between calls":
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
        else:
            threading.Timer(0.5, os.kill, (server.process.pid, signal.SIGKILL)).start()
        assert client.attention(x, x, x).shape == (1, 1, 4, 8)
        assert client.channel.process.fork_server is not server
        assert client.deaths_in_a_row == 0
    finally:
        client.close()


def test_a_worker_that_ended_between_calls_is_started_afresh_for_the_next(how):
    """As with a started worker: the judge sees that it has ended before the next call, and
    starts another instead of counting a death against the implementation."""
    [client] = open_clients(["numpy"])
    x = client.from_numpy(np.ones((1, 1, 4, 8)), "float64")
    try:
        client.attention(x, x, x)
        os.kill(client.channel.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while client.channel.alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.attention(x, x, x).shape == (1, 1, 4, 8)
        assert client.deaths_in_a_row == 0
    finally:
        client.close()
