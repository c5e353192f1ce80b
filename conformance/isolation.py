"""Surviving implementations that crash or hang, when the suite runs on pytest-xdist workers.

A crash (segfault, abort, ``os._exit``, a CUDA error that kills the process) or a hang cut short
by pytest-timeout's thread method ends the worker; xdist reports the test it was running and
starts a new worker. What xdist cannot say is *which implementation* crashed and *why*: each
worker keeps a flight record (the test it is running, its implementation and claims, since when)
in a directory shared with the controller. When a worker dies, the controller reads its record,
reports the test as failing its claims with the cause, and marks the implementation as crashed
so that no worker calls it again: its remaining tests are skipped, naming the crash.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FlightRecord:
    """What a worker was doing when it died."""

    nodeid: str
    subject: str
    claims: list[str]
    started: float  # time.time() when the test's call began

    def cause(self, timeout: float | None, now: float | None = None) -> str:
        elapsed = (time.time() if now is None else now) - self.started
        if timeout and elapsed >= 0.9 * timeout:
            return (
                f"{self.subject} did not return within {elapsed:.0f} s and was stopped by "
                f"--timeout {timeout:g}: it hangs"
            )
        return (
            f"{self.subject} ended the test process {elapsed:.1f} s into the call "
            "(a segfault, an abort, os._exit or a fatal device error; the worker's stderr has "
            "the traceback faulthandler printed)"
        )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class FlightDeck:
    """The directory shared by the controller and its workers."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory or tempfile.mkdtemp(prefix="attnspec-flight-"))

    def _record_path(self, worker: str) -> Path:
        return self.directory / f"running-{_safe(worker)}.json"

    def _crash_path(self, subject: str) -> Path:
        return self.directory / f"crashed-{_safe(subject)}.json"

    def take_off(self, worker: str, nodeid: str, subject: str, claims: list[str]) -> None:
        record = {"nodeid": nodeid, "subject": subject, "claims": claims, "started": time.time()}
        self._record_path(worker).write_text(json.dumps(record))

    def land(self, worker: str) -> None:
        self._record_path(worker).unlink(missing_ok=True)

    def last_flight(self, worker: str) -> FlightRecord | None:
        path = self._record_path(worker)
        if not path.exists():
            return None
        return FlightRecord(**json.loads(path.read_text()))

    def mark_crashed(self, record: FlightRecord, cause: str) -> None:
        path = self._crash_path(record.subject)
        if not path.exists():
            path.write_text(json.dumps({"nodeid": record.nodeid, "cause": cause}))

    def crash_of(self, subject: str) -> dict | None:
        """The first crash of ``subject`` in this run: its test id and cause, or None."""
        path = self._crash_path(subject)
        return json.loads(path.read_text()) if path.exists() else None
