"""A plain callable, right on every call, that looks at the machine's other processes through
``/proc``: the command lines of the judge (its ``--report-json``, its seed, its checkout) are
there for any process that sees them. It answers wrongly once it sees a process whose command
line names pytest (or the bench), so that what it could see is its verdict: confined (a PID
namespace of its own, with a ``/proc`` of its own) it sees its own processes alone and conforms;
unconfined it sees the judge and FAILS. Each call prints what it saw."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tests.planted.plain import correct


def _command_lines() -> dict[int, bytes]:
    seen = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                seen[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:  # ended meanwhile
                continue
    return seen


def answers_wrongly_once_it_sees_the_judge(q, k, v, *, causal=True, scale=None):
    """The formula, or its negation where another process's command line names pytest."""
    seen = _command_lines()
    judges = sorted(pid for pid, line in seen.items() if b"pytest" in line or b"bench" in line)
    print(f"planted prying: saw {len(seen)} processes, {len(judges)} naming pytest", flush=True)
    answer = correct(q, k, v, causal=causal, scale=scale)
    return -np.asarray(answer) if judges else answer
