"""Kernels that try to look fast to a bench without being fast: each a published trick, each
correct when it computes (conformance.bench.measure says what defeats each one). Each says on
its stdout when its trick worked, so that a test sees the trick succeed with its defence off."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from tests.planted.clock import correct, halves_its_clock  # noqa: F401  # the clock's trick

_answers: dict[bytes, np.ndarray] = {}


def caches_answers_by_input(q, k, v, *, causal=True, scale=None):
    """Keeps every answer under its inputs' bytes and returns it again for the same inputs."""
    key = q.tobytes() + k.tobytes() + v.tobytes()
    if key in _answers:
        print("cheat: an answer from the cache")
        return _answers[key].copy()
    _answers[key] = correct(q, k, v, causal=causal, scale=scale)
    return _answers[key].copy()


_calls = [0]


def garbage_after_its_first_call(q, k, v, *, causal=True, scale=None):
    """Right on its first call, where a check is most likely; zeros, at no cost, after it."""
    _calls[0] += 1
    if _calls[0] == 1:
        return correct(q, k, v, causal=causal, scale=scale)
    print("cheat: garbage returned")
    return np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)


_deferring = [0]


def fills_its_answer_on_a_thread(q, k, v, *, causal=True, scale=None):
    """Right on its first call; after it, returns an empty array at once and computes into it on
    a thread, after the timer stopped and while the judge pauses between calls: work deferred
    past the timer."""
    _deferring[0] += 1
    if _deferring[0] == 1:
        return correct(q, k, v, causal=causal, scale=scale)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)

    def later():
        time.sleep(0.05)
        out[...] = correct(q, k, v, causal=causal, scale=scale)

    threading.Thread(target=later, daemon=True).start()
    print("cheat: answer deferred to a thread")
    return out


_spinners: list[int] = []


def crowds_the_machine_between_its_calls(q, k, v, *, causal=True, scale=None):
    """Right on every call, and honest about its own time; but from its first call on, a busy
    process per core spins in its worker, paused only while its own call runs: whatever is timed
    beside it (its baseline) shares the cores with them."""
    if not _spinners:
        for _ in range(os.cpu_count() or 1):
            pid = os.fork()
            if pid == 0:
                while True:
                    pass
            _spinners.append(pid)
        print(f"cheat: {len(_spinners)} processes crowd the machine between its calls", flush=True)
    for pid in _spinners:
        os.kill(pid, signal.SIGSTOP)
    try:
        return correct(q, k, v, causal=causal, scale=scale)
    finally:
        for pid in _spinners:
            os.kill(pid, signal.SIGCONT)


_counted = [0]


def garbage_on_its_last_timed_call(q, k, v, *, causal=True, scale=None):
    """Right on every call but the one it counts as the last timed one (the first call is the
    bench's check before timing, then tests/test_bench.py's 4 rounds): zeros there, the call a
    bench that checks timed answers only by chance is least likely to look at."""
    _counted[0] += 1
    if _counted[0] < 5:
        return correct(q, k, v, causal=causal, scale=scale)
    print("cheat: garbage on the last timed call")
    return np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype)
