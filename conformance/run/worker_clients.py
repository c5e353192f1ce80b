"""The judge's end of the worker line: each implementation runs in a worker process of its own.

:class:`ImplementationClient` stands where an :class:`impls.contract.Implementation` stood: it
declares the same things (name, family, device, capabilities) and takes the same calls, but
every call crosses into the implementation's worker (:mod:`impls.worker_process`) as a message
of :mod:`impls.messages` and its answer comes back as one.

Nothing the implementation does in there - raise, print, patch a module, crash, hang -
reaches the judge: a raise comes back as :class:`ImplementationRaised`, a result that breaks
the contract as :class:`ImplementationBroke`, a death or a hang as :class:`ImplementationDied`
(the worker is started afresh for the next call; after :data:`CRASHES_BEFORE_GIVING_UP` deaths in
a row the implementation is not called again).

Why the standard library and not loky or pebble: the suite must run from a plain checkout with
nothing but numpy, pytest and hypothesis (a GPU runner with no network), and one worker per
implementation, with nothing of the judge in it (never forked from the judge: a CUDA context and
threads must not be inherited), with a deadline per call, is a few dozen lines of ``subprocess``
and ``os.fork`` from a clean interpreter (:mod:`conformance.run.fork_server_client`).

``--in-process`` keeps the same client over an in-process channel, for pdb and profilers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from conformance.run.fork_server_client import ForkedWorker, ForkServerGone, start_worker
from conformance.run.judge_files import judge_directory
from conformance.run.memory_watch import (
    WATCH_EVERY,
    BoundExceeded,
    MemoryBoundExceeded,
    MemoryWatch,
    TasksBoundExceeded,
)
from impls.messages import (
    ANSWERS,
    GREETINGS,
    Broke,
    Call,
    Close,
    Description,
    InputArray,
    LineError,
    NotChecked,
    NotResolved,
    OutputArray,
    Raised,
    Timed,
    receive,
    send,
)
from impls.sandbox import (
    DEFAULT_WORKER_DISK,
    DEFAULT_WORKER_TASKS,
    WorkerBounds,
    expected_confinement,
    worker_environment,
)
from impls.worker_process import Answer, describe, handle

DEFAULT_CALL_TIMEOUT = 120.0  # seconds; an implementation may declare its own (call_timeout)
START_TIMEOUT = 300.0  # resolving a selector may import a large library and compile
CRASHES_BEFORE_GIVING_UP = 3
OUTPUT_SHOWN = 4000  # characters of an implementation's output shown with a failure
# A worker's data bound: 16x the largest call of the suite's tests (an ANDREA layer's float64
# scores, 100 MiB, held a few times over), and a third of these 24 GiB machines.
DEFAULT_WORKER_MEMORY = 8 << 30
# The seconds an implementation's calls may take in one process of a run. Every built-in's whole
# run takes under 2 minutes here (tox's torch env: 107 s for all of them together).
DEFAULT_IMPL_BUDGET = 1800.0
# What an allocation past the bound raises: NumPy's MemoryError, torch's allocator's RuntimeError
ALLOCATION_FAILED = ("MemoryError", "can't allocate memory", "out of memory")


@dataclass(frozen=True)
class WorkerSetup:
    """What the judge gives each worker besides its selector: where the implementation's modules
    are found (before the judge's own sys.path, and only in the worker, once it is confined), the
    judge's variables it gets besides :data:`impls.sandbox.WORKER_VARIABLES`, its memory bound
    (None: none) and how long its implementation's calls may take in all (None: no limit)."""

    impl_paths: tuple[str, ...] = ()
    pass_env: tuple[str, ...] = ()
    memory_bytes: int | None = DEFAULT_WORKER_MEMORY
    budget_seconds: float | None = DEFAULT_IMPL_BUDGET
    disk_bytes: int | None = DEFAULT_WORKER_DISK
    tasks: int | None = DEFAULT_WORKER_TASKS

    def bounds(self) -> WorkerBounds:
        """What a confined worker may hold."""
        return WorkerBounds(self.memory_bytes, self.disk_bytes, self.tasks)

    def search_paths(self) -> list[str]:
        """The worker's sys.path: the candidate's directories, ``$PYTHONPATH``'s, then the
        judge's own (its current directory where the judge has it, as ``python -m pytest``
        does)."""
        judge = [os.getcwd() if entry == "" else entry for entry in sys.path]
        paths = [os.path.abspath(p) for p in (*self.impl_paths, *pythonpath_directories())]
        return list(dict.fromkeys(paths + judge))


# The options that bound a worker (attnspec run's, which the bench takes too), by the field of
# WorkerSetup each sets
BOUND_OPTIONS = {
    "memory_bytes": "worker_memory",
    "disk_bytes": "worker_disk",
    "tasks": "worker_processes",
}


def bounds_given(value_of: Callable[[str], Any]) -> dict[str, int | None]:
    """WorkerSetup's bound fields from the options ``value_of`` reads by their dest: each given
    one, 0 as no bound; one not given keeps WorkerSetup's default."""
    given = {field: value_of(dest) for field, dest in BOUND_OPTIONS.items()}
    return {field: value or None for field, value in given.items() if value is not None}


def pythonpath_directories() -> list[str]:
    """The directories ``$PYTHONPATH`` names, made absolute."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return [os.path.abspath(entry) for entry in entries if entry]


def format_bytes(size: int) -> str:
    """8589934592 -> '8 GiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


class ImplementationRaised(Exception):
    """The implementation raised (anything, BaseExceptions included) inside its call."""

    def __init__(self, name: str, op: str, type_name: str, message: str, trace: str = ""):
        self.type_name, self.message, self.trace = type_name, message, trace
        super().__init__(f"{name} raised {type_name}: {message}" + (f" (in {op})" if op else ""))


class ImplementationBroke(Exception):
    """What the implementation returned (or how it took its inputs) breaks the contract."""


class BrokenAtFirstCall(ImplementationBroke):
    """Its first call broke the contract (conformance.judge.preflight): every later call fails
    with that sentence."""


class LayoutNotChecked(Exception):
    """The suite's own helpers could not lay the inputs out as the test asked: not checked."""


class ImplementationDied(Exception):
    """The implementation's worker died during a call, or did not return before the deadline."""


def exit_cause(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        described = {"SIGSEGV": "a segfault", "SIGABRT": "an abort", "SIGKILL": "killed"}
        return f"killed by {name}" + (f" ({described[name]})" if name in described else "")
    return f"exited with status {returncode} (os._exit, exit() or a fatal error in native code)"


class OutputTail:
    """What a worker printed (its stdout and stderr share one file), read back in pieces."""

    def __init__(self) -> None:
        handle_, name = tempfile.mkstemp(prefix="worker-", suffix=".out", dir=judge_directory())
        os.close(handle_)
        self.path = Path(name)
        self.offset = 0
        self.pending: list[str] = []

    def sink(self):
        return open(self.path, "ab")  # append mode: the worker's writes always land at the end

    def collect(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size <= self.offset:
            return
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            head = file.read(OUTPUT_SHOWN // 2)
            if size - self.offset > OUTPUT_SHOWN:
                file.seek(size - OUTPUT_SHOWN // 2)
                tail = file.read(OUTPUT_SHOWN // 2)
                middle = (
                    f"\n[... {size - self.offset - len(head) - len(tail)} bytes not shown ...]\n"
                )
                text = head.decode(errors="replace") + middle + tail.decode(errors="replace")
            else:
                text = head.decode(errors="replace")
        self.offset = size
        self.pending.append(text)
        if size > 64 << 20:  # keep the disk use of a chatty implementation bounded
            os.truncate(self.path, 0)
            self.offset = 0

    def take(self) -> str:
        self.collect()
        text, self.pending = "".join(self.pending), []
        return text

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class ProcessChannel:
    """A worker process serving one selector; started again after it dies."""

    def __init__(self, selector: str, sandbox: bool = True, setup: WorkerSetup | None = None):
        self.selector = selector
        self.setup = setup or WorkerSetup()
        self.output = OutputTail()
        self.process: ForkedWorker | subprocess.Popen | None = None
        self.conn: Connection | None = None
        # The worker's own directory, its TMPDIR and caches: all it may write (impls.sandbox).
        self.scratch = (
            Path(tempfile.mkdtemp(prefix="scratch-", dir=judge_directory())) if sandbox else None
        )
        self.left_running = 0  # descendants of its workers that outlived them, and were killed
        self.sandbox = "none (no worker started)"  # how its last worker was confined
        self.watch: MemoryWatch | None = None  # over a confined worker's whole memory

    def start(self) -> None:
        judge_end, worker_end = socket.socketpair()
        scratch = str(self.scratch) if self.scratch else None
        # A confined worker gets the variables the sandbox lets through; --no-sandbox, for
        # debugging, the judge's whole environment.
        env = worker_environment(os.environ, self.setup.pass_env) if scratch else dict(os.environ)
        bounds = self.setup.bounds() if scratch else WorkerBounds()
        paths = self.setup.search_paths()
        with self.output.sink() as sink:
            self.process = start_worker(
                self.selector, env, worker_end, sink, scratch, paths, bounds
            )
        worker_end.close()
        self.conn = Connection(judge_end.detach())
        if isinstance(self.process, ForkedWorker):
            self.sandbox = self.process.sandbox
        else:  # started, not forked: where there is no fork server, there is no Landlock
            self.sandbox = expected_confinement().describe() if scratch else "none (--no-sandbox)"
        memory, tasks = bounds.memory_bytes, bounds.tasks
        watched = (memory is not None or tasks is not None) and sys.platform == "linux"
        self.watch = MemoryWatch(self.process.pid, memory, tasks) if watched else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exchange(self, message: Call | None, accepted: tuple[type, ...], timeout: float):
        """The worker's answer to ``message`` (None: its greeting), one of ``accepted``;
        TimeoutError when it runs past ``timeout`` seconds (it is then killed), ChildProcessError
        when it dies, LineError when it answers with something else (it is then killed too),
        BoundExceeded when its memory or its tasks reach their bound meanwhile (it is then
        killed)."""
        try:
            if message is not None:
                send(self.conn, message)
            if self.answered_within(timeout):
                return receive(self.conn, accepted)
        except (LineError, BoundExceeded):
            self.kill()
            raise
        except (EOFError, OSError):
            try:
                returncode = self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # closed its end of the line but lives on
                self.kill()
                raise ChildProcessError("closed its connection to the judge") from None
            self.conn.close()
            self.process = None
            raise ChildProcessError(exit_cause(returncode)) from None
        self.kill()
        raise TimeoutError

    def answered_within(self, timeout: float) -> bool:
        """Whether the worker's answer came within ``timeout`` seconds, its memory watched
        meanwhile and once more when it answers."""
        if self.watch is None:
            return self.conn.poll(timeout)
        deadline = time.monotonic() + timeout
        while not self.conn.poll(max(min(WATCH_EVERY, deadline - time.monotonic()), 0)):
            self.watch.look()
            if time.monotonic() >= deadline:
                return False
        self.watch.look()
        return True

    def memory_at_bound(self) -> BoundExceeded | None:
        """Whether the worker's memory or tasks are at their bound now (a failed allocation, a
        full ``/dev/shm`` or a refused fork said so by an exception it raised)."""
        if self.watch is None or not self.alive():
            return None
        try:
            self.watch.look(force=True)
        except BoundExceeded as exc:
            return exc
        return None

    def greeting(self, selector: str) -> Description:
        """The handshake: the description a freshly started worker sends. RegistryError when the
        selector resolves to nothing; TimeoutError, ChildProcessError or LineError as
        :meth:`exchange` has them."""
        from impls.registry import RegistryError

        reply = self.exchange(None, GREETINGS, START_TIMEOUT)
        if isinstance(reply, NotResolved):
            raise RegistryError(reply.message)
        return reply.description

    def kill(self) -> None:
        if self.process is not None:
            # Its process group (the worker leads one of its own): it and whatever it started
            # that stayed in the group, the worker's exit notwithstanding.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.kill()
            self.left_running += getattr(self.process, "left_running", 0)
            self.process.wait()
            self.conn.close()
            self.process = None

    def close(self) -> None:
        if self.alive():
            try:
                send(self.conn, Close())
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.output.collect()

    def discard(self) -> None:
        """Closes a worker that serves no client, and removes the file of what it printed and
        its scratch directory."""
        self.close()
        self.output.remove()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


class InProcessChannel:
    """The same requests, answered in the judge's own process (``--in-process``): for pdb and
    profilers, with none of the protection."""

    def __init__(self, selector: str):
        from impls.registry import resolve

        self.selector = selector
        self.impl = resolve(selector)

    def greeting(self, selector: str) -> Description:
        return describe(self.impl)

    def handle(self, call: Call) -> Answer:
        return handle(self.impl, call)

    def close(self) -> None:
        pass


class ImplementationClient:
    """An implementation under test, seen from the judge. See the module docstring."""

    def __init__(
        self,
        selector: str,
        description: Description,
        channel: ProcessChannel | InProcessChannel,
        call_timeout: float | None = None,
        budget_seconds: float | None = None,
    ):
        self.selector = selector
        self.description = description
        self.channel = channel
        self.budget_seconds = budget_seconds
        self.seconds_in_calls = 0.0  # what its calls (and its workers' starts) took so far
        self.name = description.name
        self.family = description.family
        self.device = description.device
        self.capabilities = description.capabilities
        self.call_timeout = call_timeout or description.call_timeout or DEFAULT_CALL_TIMEOUT
        self.deaths_in_a_row = 0
        self.crashed: str | None = None  # why it is not called again, once it crashed too often
        # why its first call broke the contract (conformance.judge.preflight): every later call
        # fails with it, after the test has skipped what the implementation does not declare
        self.broken: str | None = None
        # why its worker was restarted since the test began: a call that may have left it broken
        # (worker_left_suspect), so that no later call is decided by that worker
        self.restarts: list[str] = []
        self.restart_pending = False
        # the catalogued mistakes its failures so far refuted in this process
        # (conformance.judge.diagnosis): no later failure needs them computed
        self.refuted_mistakes: set[str] = set()

    @property
    def in_process(self) -> bool:
        return isinstance(self.channel, InProcessChannel)

    def version(self) -> str:
        return self.description.version

    def unavailable_reason(self) -> str | None:
        return self.description.unavailable_reason

    @property
    def sandbox(self) -> str:
        """How its worker is confined, as the fork server saw it before the worker imported
        anything of the implementation (impls.sandbox.Confinement)."""
        if self.in_process:
            return "none (--in-process: it runs in the judge)"
        return self.description.sandbox

    # --- the Implementation interface, over the line ----------------------------------------

    def from_numpy(self, array: np.ndarray, dtype: str) -> InputArray:
        return InputArray(np.asarray(array, np.float64), dtype)

    def to_numpy(self, native: OutputArray) -> np.ndarray:
        return native.array

    def dtype_name(self, native: OutputArray) -> str:
        return native.dtype

    def device_of(self, native: OutputArray) -> str:
        return native.device

    def attention(
        self,
        q,
        k,
        v,
        *,
        causal: bool = True,
        scale: float | None = None,
        layout: str = "contiguous",
        poison: bool = False,
        **variant,
    ) -> OutputArray:
        """The call; ``variant`` holds the extensions' keywords (window, key_lengths) where a test
        sets them, ``layout`` how the worker lays the inputs out (impls.capabilities.LAYOUTS), and
        ``poison`` whether fresh allocations read as NaN meanwhile."""
        return self.request(
            "attention",
            [q, k, v],
            layout=layout,
            poison=poison,
            causal=causal,
            scale=scale,
            **variant,
        )

    def attention_weights(self, q, k, *, causal: bool = True, scale: float | None = None):
        return self.request("attention_weights", [q, k], causal=causal, scale=scale)

    def bench_call(
        self, seed: int, dims: tuple, dtype: str, *, echo: bool = False, flush_cache: bool = True,
        causal: bool = True, backward: bool = False, query_dtype: str | None = None, **variant,
    ) -> tuple[float, OutputArray | tuple[OutputArray, ...]]:  # fmt: skip
        """One timed call on inputs the worker draws from ``seed`` (impls.bench_inputs): the
        worker's seconds and the answer (q itself, untimed, with ``echo``); with ``backward``,
        the vjp's, its gradients a tuple."""
        # only where given: a plain forward's request as it always was
        given = {"backward": True} if backward else {}
        if query_dtype is not None:  # an FP8 call in the key/value cache's convention
            given["query_dtype"] = query_dtype
        scale = variant.pop("scale", None)  # a shape's explicit scale (MLA's), else the default
        return self.request(
            "bench_call", [], seed=seed, dims=tuple(dims), dtype=dtype, echo=echo,
            flush_cache=flush_cache, causal=causal, scale=scale, **given, **variant,
        )  # fmt: skip

    def merge_states(self, outputs, lses):
        """The implementation's merge of partial states (P, B, H, Tq, Dv) and (P, B, H, Tq):
        (out, lse)."""
        return self.request("merge_states", [outputs, lses])

    def vjp(
        self, q, k, v, grad_out, *, causal: bool = True, scale: float | None = None,
        grad_lse=None, **variant,
    ):  # fmt: skip
        """The implementation's backward: (dq, dk, dv[, dsinks]). ``grad_lse`` travels as an
        array, the implementation's own, beside the others."""
        if grad_lse is None:
            return self.request("vjp", [q, k, v, grad_out], causal=causal, scale=scale, **variant)
        return self.request(
            "vjp", [q, k, v, grad_out, grad_lse], causal=causal, scale=scale, **variant
        )

    # --- the line itself ---------------------------------------------------------------------

    def request(
        self,
        op: str,
        arrays: list[InputArray],
        layout: str = "contiguous",
        poison: bool = False,
        **keywords,
    ):
        if self.broken:
            raise BrokenAtFirstCall(self.broken)
        call = Call(op, tuple(arrays), keywords, layout, poison)
        answer = self.channel.handle(call) if self.in_process else self.remote(call)
        suspect = worker_left_suspect(call, answer)
        if suspect:
            self.worker_suspect(f"{describe_call(call)} {suspect}")
        return self.unpack(op, answer)

    def worker_suspect(self, why: str) -> None:
        """A call may have left the worker broken: the first time in a test, the worker is
        restarted before the next call; after that (a test of many calls that each return NaN)
        before the next test, so that no later test is decided in it and a failing test does
        not pay a restart per call."""
        if self.restarts:
            self.restart_pending = True
            return
        self.restarts.append(f"{why}: its worker was restarted")
        self.restart_worker()

    def restart_worker(self) -> None:
        """End the worker, so that the next call starts a fresh one."""
        if self.in_process or not self.channel.alive():
            return
        self.channel.kill()

    def take_restarts(self) -> list[str]:
        """The restarts noted since the last call of this, which begins a test: a restart a
        call of the last test left pending happens here."""
        if self.restart_pending:
            self.restart_pending = False
            self.restart_worker()
        taken, self.restarts = self.restarts, []
        return taken

    def remote(self, call: Call) -> Answer:
        if self.crashed:
            raise ImplementationDied(self.crashed)
        channel: ProcessChannel = self.channel
        started = time.monotonic()
        try:
            return self.exchange(channel, call)
        finally:
            self.seconds_in_calls += time.monotonic() - started
            if self.budget_seconds is not None and self.seconds_in_calls >= self.budget_seconds:
                self.crashed = self.crashed or (
                    f"not called again: its calls took {self.seconds_in_calls:.0f} s, its budget "
                    f"of {self.budget_seconds:g} s (--impl-budget)"
                )

    def exchange(self, channel: ProcessChannel, call: Call, *, again: bool = False) -> Answer:
        if not channel.alive():
            self.start_worker()
        timeout = self.call_timeout
        if self.budget_seconds is not None:  # no call may outlast what is left of the budget
            timeout = min(timeout, max(self.budget_seconds - self.seconds_in_calls, 0.001))
        started = time.monotonic()
        try:
            answer = channel.exchange(call, ANSWERS, timeout)
        except TimeoutError:
            if timeout < self.call_timeout:
                self.died(
                    f"{self.name} was still in {call.op}() when its budget of "
                    f"{self.budget_seconds:g} s ran out (--impl-budget; its worker was killed)"
                )
            self.died(
                f"{self.name} did not return from {call.op}() within {self.call_timeout:g} s: it "
                "hangs (its worker was killed; the next call starts a fresh one)"
            )
        except ForkServerGone as exc:
            # The worker died with its fork server, which something outside the worker ended
            # (the worker cannot see it from its own PID namespace): not the implementation's
            # doing, so the call runs once more in a fresh worker under a fresh fork server.
            channel.kill()
            if again:
                self.died(f"{self.name}'s worker was lost twice with its fork server: {exc}")
            self.restarts.append(f"{describe_call(call)}: {exc}; run again in a fresh worker")
            return self.exchange(channel, call, again=True)
        except ChildProcessError as exc:
            self.died(
                f"{self.name} ended its worker process {time.monotonic() - started:.1f} s into "
                f"{call.op}(): {exc}"
            )
        except LineError as exc:
            self.died(f"{self.name}'s worker broke the line in {call.op}() (it was killed): {exc}")
        except BoundExceeded as exc:
            raise ImplementationDied(self.past_the_bound(call.op, exc)) from None
        self.deaths_in_a_row = 0
        return answer

    def past_the_bound(self, op: str, cause: BoundExceeded | Raised) -> str:
        """The failure of a call whose worker reached its memory bound or its bound on tasks.
        Its state after that is its own affair: the next call gets a fresh worker. Not a death:
        the run goes on with the implementation's other tests."""
        if isinstance(cause, TasksBoundExceeded):
            return (
                f"{self.name} exceeded its bound of {cause.bound} processes and threads in "
                f"{op}() (its tree held {cause.used}); its worker was restarted "
                "(--worker-processes)"
            )
        if isinstance(cause, MemoryBoundExceeded):
            how = f"its resident, shared and /dev/shm memory reached {cause.used / 2**20:.0f} MiB"
        else:
            how = f"{cause.type_name}: {cause.message[:200]}"
        bound = format_bytes(self.channel.setup.memory_bytes)
        return (
            f"{self.name} exceeded its memory bound of {bound} in {op}() ({how}); its worker was "
            "restarted (--worker-memory)"
        )

    def start_worker(self) -> None:
        """A fresh worker for the next call, which must be the implementation described before."""
        from impls.registry import RegistryError

        channel: ProcessChannel = self.channel
        channel.start()
        try:
            description = channel.greeting(self.selector)
        except TimeoutError:
            self.died(f"{self.name}'s worker did not start within {START_TIMEOUT:g} s")
        except (ChildProcessError, LineError, RegistryError) as exc:
            channel.kill()
            self.died(f"{self.name}'s worker died while starting: {exc}")
        if description.name != self.name:
            channel.kill()
            self.died(
                f"{self.name}'s worker started as something else this time: {description.name}"
            )

    def died(self, cause: str) -> NoReturn:
        self.deaths_in_a_row += 1
        if self.deaths_in_a_row >= CRASHES_BEFORE_GIVING_UP:
            self.crashed = (
                f"not called again after its worker died {self.deaths_in_a_row} times in a row; "
                f"last: {cause}"
            )
        raise ImplementationDied(cause)

    def unpack(self, op: str, answer: Answer):
        setup = getattr(self.channel, "setup", WorkerSetup(memory_bytes=None, tasks=None))
        if isinstance(answer, Raised) and (setup.memory_bytes or setup.tasks) is not None:
            at_bound = self.channel.memory_at_bound()
            if at_bound is not None or self.out_of_memory(answer):
                self.channel.kill()
                raise ImplementationDied(self.past_the_bound(op, at_bound or answer))
        if isinstance(answer, Raised):
            raise ImplementationRaised(
                self.name, op, answer.type_name, answer.message, answer.trace
            )
        if isinstance(answer, Broke):
            raise ImplementationBroke(f"{self.name} broke the contract in {op}(): {answer.message}")
        if isinstance(answer, NotChecked):
            raise LayoutNotChecked(answer.why)
        if isinstance(answer, Timed) != (op == "bench_call"):
            raise ImplementationBroke(f"{self.name}'s worker answered {op}() with a {answer}")
        if isinstance(answer, Timed):
            if len(answer.seconds) != 1 or not answer.outputs:
                raise ImplementationBroke(f"{self.name}'s worker answered bench_call with {answer}")
            outputs = answer.outputs
            return answer.seconds[0], outputs[0] if len(outputs) == 1 else outputs
        return answer.outputs if len(answer.outputs) > 1 else answer.outputs[0]

    @staticmethod
    def out_of_memory(answer: Raised) -> bool:
        text = f"{answer.type_name}: {answer.message}"
        return any(sign in text for sign in ALLOCATION_FAILED)

    def take_output(self) -> str:
        """What the implementation printed since the last call of this, truncated."""
        if self.in_process:
            return ""
        return self.channel.output.take()

    def close(self) -> None:
        if self.in_process:
            self.channel.close()
            return
        self.channel.discard()
        if self.channel.left_running:
            print(
                f"attnspec: {self.name} left {self.channel.left_running} process(es) running "
                "after its worker ended; they were killed",
                file=sys.stderr,
                flush=True,
            )

    def __repr__(self) -> str:
        where = "in-process" if self.in_process else "worker"
        return f"<ImplementationClient {self.name} ({self.family}, {self.device}, {where})>"


# The array libraries a kernel's calls go through: a raise from inside one of them (an illegal
# memory access, a failed launch, a corrupted allocator) may leave the process broken for every
# later call, where a raise from the kernel's own checks does not.
ARRAY_LIBRARIES = ("torch", "triton", "cupy", "cupyx", "jax", "jaxlib", "numpy", "cuda")


def worker_left_suspect(call: Call, answer: Answer) -> str | None:
    """Why a worker that gave ``answer`` to ``call`` may be broken for later calls, or None: it
    raised from inside its array library, broke the contract, or returned non-finite values
    for finite inputs (what an out-of-bounds write leaves behind)."""
    if isinstance(answer, Broke):
        return "broke the contract"
    if isinstance(answer, Raised):
        library = library_of_innermost_frame(answer.trace)
        return f"raised {answer.type_name} from inside {library}" if library else None
    if call.op not in ("attention", "vjp") or not hasattr(answer, "outputs"):
        return None
    if any(nonfinite_count(array.array) for array in call.arrays):
        return None
    for index, output in enumerate(answer.outputs):
        bad = nonfinite_count(output.array)
        if bad:
            return f"returned {bad} non-finite values in output {index} for finite inputs"
    return None


def nonfinite_count(array: np.ndarray) -> int:
    """How many of ``array``'s values are NaN or infinite (0 for values no float64 holds: not
    judged here)."""
    try:
        return int(np.count_nonzero(~np.isfinite(np.asarray(array, np.float64))))
    except (TypeError, ValueError):
        return 0


def library_of_innermost_frame(trace: str) -> str | None:
    """The array library whose file the innermost frame of ``trace`` lies in, or None."""
    files = [line.split('"')[1] for line in trace.splitlines() if line.strip().startswith('File "')]
    if not files:
        return None
    parts = Path(files[-1]).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            package = parts[parts.index(marker) + 1]
            return package if package in ARRAY_LIBRARIES else None
    return None


def describe_call(call: Call) -> str:
    shapes = ", ".join(str(tuple(array.shape)) for array in call.arrays[:3])
    return f"the call {call.op}({shapes})"


def open_clients(
    selectors: list[str],
    *,
    in_process: bool = False,
    sandbox: bool = True,
    call_timeout: float | None = None,
    descriptions: dict[str, Description] | None = None,
    setup: WorkerSetup | None = None,
) -> list[ImplementationClient]:
    """A client per selector, each described by its own worker (started side by side; each
    stays up to serve calls, unless the implementation cannot run here). ``descriptions``, when
    given (an xdist worker gets its controller's), spares the describing. Raises
    :class:`impls.registry.RegistryError` for a selector that resolves to nothing."""
    from impls.registry import RegistryError

    if in_process:
        channels = {s: InProcessChannel(s) for s in selectors}
        return [
            ImplementationClient(s, channels[s].greeting(s), channels[s], call_timeout)
            for s in selectors
        ]
    setup = setup or WorkerSetup()
    channels = {s: ProcessChannel(s, sandbox, setup) for s in selectors}
    budget = setup.budget_seconds
    if descriptions is not None:
        return [
            ImplementationClient(s, descriptions[s], channels[s], call_timeout, budget)
            for s in selectors
        ]
    for channel in channels.values():
        channel.start()
    clients, errors = [], []
    for selector, channel in channels.items():
        try:
            description = channel.greeting(selector)
        except RegistryError as exc:
            channel.discard()
            errors.append(str(exc))
            continue
        except TimeoutError:
            channel.discard()
            errors.append(f"{selector!r}: did not resolve within {START_TIMEOUT:g} s")
            continue
        except (ChildProcessError, LineError) as exc:
            output = channel.output.take().strip()
            channel.discard()
            errors.append(
                f"{selector!r}: its worker died while resolving it ({exc})"
                + (f"; it printed: {output[-1000:]}" if output else "")
            )
            continue
        # How far its worker is confined is what the fork server saw, not the worker's word.
        description = replace(description, sandbox=channel.sandbox)
        client = ImplementationClient(selector, description, channel, call_timeout, budget)
        if client.unavailable_reason():
            channel.close()
        clients.append(client)
    if errors:
        for client in clients:
            client.close()
        raise RegistryError("; ".join(errors))
    return clients
