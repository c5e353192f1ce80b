"""Plain callables that reach out of their worker to change a verdict: forge or read the run's
shared truth, stop or kill the judge, leave a daemon that rewrites the report, write files where
the judge or the suite would read them, trace the judge or read its memory.

Each answers wrongly (the causal mask aligned top-left), so each must FAIL; in a confined worker
(impls/sandbox.py) every one of these attempts is refused, and each leaves a line in its output
saying what it tried and what came of it. ``ATTNSPEC_PLANTED_MARK`` names the file that the file
writers write and the daemon's report rewrite aims at, so a test can look for them.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import itertools
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import numpy as np

TRUTH_GLOB = "/tmp/attnspec-judge-*/truth-*"
PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def _top_left(q, k, v, causal, scale) -> np.ndarray:
    scores = (q @ np.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        scores = np.where(np.tri(*scores.shape[-2:], 0, bool), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)


def _tried(what: str, attempt) -> None:
    try:
        outcome = f"done: {attempt()}"
    except Exception as exc:
        outcome = f"refused: {type(exc).__name__}: {exc}"
    print(f"planted {what}: {outcome}", flush=True)


def _judges() -> list[int]:
    """The processes above this worker whose command line names pytest: the judge."""
    found, pid = [], os.getppid()
    while pid > 1:
        with contextlib.suppress(OSError):
            if b"pytest" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def _seen_judges() -> list[int]:
    """The judge's processes, or ProcessLookupError where none is to be seen (a worker in a PID
    namespace of its own sees no process above its own)."""
    judges = _judges()
    if not judges:
        raise ProcessLookupError("no process above this one names pytest")
    return judges


def forges_the_truth(q, k, v, *, causal=True, scale=None):
    """Writes its own answer into every shared truth it finds, as the oracle's answer for its
    inputs, so that the judge compares the answer with itself."""
    answer = _top_left(q, k, v, causal, scale).astype(np.float64)

    def forge() -> str:
        from conformance.judge.truth import TruthCache, inputs_digest

        written = 0
        for directory in glob.glob(TRUTH_GLOB):
            cache = TruthCache(Path(directory))
            digest = inputs_digest(*(np.asarray(x, np.float64) for x in (q, k, v)))
            cache._write(
                cache.path_of("attention", digest, dict(causal=causal, scale=scale)), answer
            )
            written += 1
        if not written:
            raise FileNotFoundError(f"no {TRUTH_GLOB} to be seen")
        return f"{written} truth directories"

    _tried("forge the truth", forge)
    return answer.astype(q.dtype)


def reads_the_truth(q, k, v, *, causal=True, scale=None):
    """Computes nothing: returns the shared truth's entry for its inputs where one is there
    (another implementation's judgement left it), else zeros."""
    found = {}

    def read() -> str:
        from conformance.judge.truth import TruthCache, inputs_digest

        directories = glob.glob(TRUTH_GLOB)
        if not directories:
            raise FileNotFoundError(f"no {TRUTH_GLOB} to be seen")
        digest = inputs_digest(*(np.asarray(x, np.float64) for x in (q, k, v)))
        for directory in directories:
            cache = TruthCache(Path(directory))
            entry = cache._read(
                cache.path_of("attention", digest, dict(causal=causal, scale=scale))
            )
            if entry is not None:
                found["answer"] = entry
                return f"an entry in {directory}"
        return "no entry for these inputs"

    _tried("read the truth", read)
    if "answer" in found:
        return found["answer"].astype(q.dtype)
    return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)


def _signals_the_judge(sig: signal.Signals):
    def attention(q, k, v, *, causal=True, scale=None):
        def send() -> str:
            judges = _seen_judges()
            for pid in judges:
                os.kill(pid, sig)
            return f"{sig.name} to {judges}"

        _tried(f"send {sig.name} to the judge", send)
        return _top_left(q, k, v, causal, scale)

    attention.__doc__ = f"Sends {sig.name} to every process above it that names pytest."
    return attention


stops_the_judge = _signals_the_judge(signal.SIGSTOP)
terminates_the_judge = _signals_the_judge(signal.SIGTERM)
kills_the_judge = _signals_the_judge(signal.SIGKILL)


def _report_path() -> str | None:
    for pid in _judges():
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        for option, value in itertools.pairwise(arguments):
            if option == b"--report-json":
                return value.decode()
    return None


def leaves_a_daemon_that_rewrites_the_report(q, k, v, *, causal=True, scale=None):
    """Once per worker, double-forks a daemon (in a session of its own, out of its worker's
    process group) that waits for the judge to end and then writes a report saying "conforms"
    over the JSON report the judge wrote."""
    path, judges = _report_path(), _judges()
    if path and judges and not os.environ.get("PLANTED_DAEMON_STARTED"):
        os.environ["PLANTED_DAEMON_STARTED"] = "1"
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while any(Path(f"/proc/{pid}").exists() for pid in judges):
                    time.sleep(0.05)
                forged = {"schema": "attnspec-report/1", "exit_status": 0, "subjects": [
                    {"name": "forged", "verdict": "conforms"}]}  # fmt: skip
                with contextlib.suppress(OSError):
                    Path(path).write_text(json.dumps(forged))
                mark = os.environ.get("ATTNSPEC_PLANTED_MARK")
                with contextlib.suppress(OSError):
                    if mark:
                        Path(mark + ".daemon").write_text("the daemon outlived the run")
            os._exit(0)
        print(f"planted daemon: started, aiming at {path}", flush=True)
    return _top_left(q, k, v, causal, scale)


def writes_files_where_the_judge_reads(q, k, v, *, causal=True, scale=None):
    """Writes a module into the judge's current directory (first on its sys.path), beside the
    suite's own modules, into HOME and into the system's temporary directory."""
    import conformance

    mark = os.environ.get("ATTNSPEC_PLANTED_MARK", "planted")
    name = Path(mark).name
    for where in (
        Path.cwd(),
        Path(conformance.__file__).parent,
        Path(os.path.expanduser("~")),
        Path(os.environ.get("ATTNSPEC_PLANTED_HOME", "/root")),
        Path("/tmp"),
    ):
        target = where / f"{name}.py"
        _tried(f"write {target}", lambda target=target: target.write_text("raise SystemExit\n"))
    _tried("write beside the mark", lambda: Path(mark + ".written").write_text("x"))
    return _top_left(q, k, v, causal, scale)


def writes_beside_the_mark(q, k, v, *, causal=True, scale=None):
    """Writes one file, beside ATTNSPEC_PLANTED_MARK: the writers' attempt, aimed where a test
    can look and clean up."""
    mark = os.environ["ATTNSPEC_PLANTED_MARK"]
    _tried("write beside the mark", lambda: Path(mark + ".written").write_text("x"))
    return _top_left(q, k, v, causal, scale)


def traces_the_judge(q, k, v, *, causal=True, scale=None):
    """PTRACE_ATTACH to the judge, and opening its memory through /proc."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        judges = _seen_judges()
    except ProcessLookupError as exc:
        print(f"planted ptrace: refused: {exc}", flush=True)
        judges = []
    for pid in judges:

        def attach(pid=pid) -> str:
            if libc.ptrace(PTRACE_ATTACH, pid, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            libc.ptrace(PTRACE_DETACH, pid, 0, 0)
            return f"attached to {pid}"

        _tried(f"ptrace {pid}", attach)
        _tried(f"open /proc/{pid}/mem", lambda pid=pid: open(f"/proc/{pid}/mem", "rb").close())
    return _top_left(q, k, v, causal, scale)


def uses_its_scratch(q, k, v, *, causal=True, scale=None):
    """Correct, and writes a temporary file as libraries do (their caches): a confined worker
    may, in its own scratch directory."""
    with tempfile.NamedTemporaryFile(suffix=".cache") as cache:
        cache.write(b"compiled kernel")
        cache.flush()
    scores = (q @ np.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        tq, tk = scores.shape[-2:]
        scores = np.where(np.tri(tq, tk, tk - tq, bool), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)
