"""Every message between the judge and the implementation's processes, and how they travel.

Two lines, each a conversation of frozen dataclasses:

* the **worker line**, between the judge (``conformance/run/worker_clients.py``) and a worker
  serving one implementation (:mod:`impls.worker_process`): the worker says :class:`Ready` (or
  :class:`NotResolved`) once, then answers each :class:`Call` with one of :data:`ANSWERS`, until
  :class:`Close` or the end of the line;
* the **fork-server line**, between the judge (``conformance/run/fork_server_client.py``) and the
  process that forks workers (:mod:`impls.fork_server`): :class:`StartWorker` is answered by
  :class:`WorkerStarted`, :class:`WaitForWorker` by :class:`WorkerExited` or
  :class:`StillRunning`; :class:`Refused` answers a request it cannot serve.

The judge unpickles only these classes, the capabilities they carry and NumPy's arrays
(:func:`loads`): a worker runs the implementation's code and holds its end of the line, and what
it sends must not be able to run code in the judge. This module imports nothing of the judge
(``conformance``): a worker has none of it.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from dataclasses import dataclass, field
from multiprocessing import BufferTooShort
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from impls.capabilities import Capabilities
from impls.sandbox import WorkerBounds

# --- the worker line ---------------------------------------------------------------------------

OPS = ("attention", "attention_weights", "vjp", "merge_states", "bench_call")
# The ops that return several arrays, and how many; attention does too with return_lse=True,
# and vjp gives a fourth, the sinks' gradient, where the call has sinks.
SEVERAL_OUTPUTS = {"vjp": 3, "merge_states": 2}


@dataclass(frozen=True)
class Description:
    """What the judge knows of an implementation: it learns it once, from the worker's Ready."""

    name: str
    family: str
    device: str
    version: str
    capabilities: Capabilities
    unavailable_reason: str | None
    call_timeout: float | None  # what it declares; None: the suite's default
    sandbox: str = "none (its worker did not say)"  # how its worker is confined

    def as_plain(self) -> dict:
        """JSON-ready data: how the xdist controller hands its descriptions to its workers."""
        return dataclasses.asdict(self)

    @classmethod
    def from_plain(cls, data: dict) -> Description:
        def tuples(value):
            return tuple(tuples(v) for v in value) if isinstance(value, list) else value

        capabilities = {key: tuples(value) for key, value in data["capabilities"].items()}
        return cls(**(data | {"capabilities": Capabilities(**capabilities)}))


@dataclass(frozen=True)
class InputArray:
    """A test input: values exact in ``dtype`` (float64, or spec.dtypes.numpy_storage(dtype) for
    a bench's draws), which the worker converts."""

    array: np.ndarray
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape


@dataclass(frozen=True)
class OutputArray:
    """An array the implementation returned, with the dtype and device it reported."""

    array: np.ndarray
    dtype: str
    device: str
    input_device: str  # where its inputs were: an output must come back where they went

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape


@dataclass(frozen=True)
class Call:
    """judge -> worker: call ``op`` on ``arrays`` (q, k, v[, grad_out]) laid out as ``layout``
    (impls.capabilities.LAYOUTS), with its allocations poisoned where ``poison``."""

    op: str
    arrays: tuple[InputArray, ...]
    keywords: dict[str, Any] = field(default_factory=dict)
    layout: str = "contiguous"
    poison: bool = False


@dataclass(frozen=True)
class Close:
    """judge -> worker: the run is over; exit."""


@dataclass(frozen=True)
class Ready:
    """worker -> judge, once: the selector resolved to this implementation."""

    description: Description


@dataclass(frozen=True)
class NotResolved:
    """worker -> judge, once: the selector resolved to nothing (the worker then exits)."""

    message: str


@dataclass(frozen=True)
class Answered:
    """The call returned: one output for attention and attention_weights, two for attention with
    return_lse=True and for merge_states, three for vjp."""

    outputs: tuple[OutputArray, ...]


@dataclass(frozen=True)
class Timed:
    """bench_call's answer: the call's seconds by the worker's clock (by CUDA events on a GPU),
    and its output, for the judge to check."""

    seconds: tuple[float, ...]
    outputs: tuple[OutputArray, ...]


@dataclass(frozen=True)
class Raised:
    """The implementation raised (anything at all) inside the call."""

    type_name: str
    message: str
    trace: str = ""


@dataclass(frozen=True)
class Broke:
    """What it returned, or how it converted its inputs, breaks the contract."""

    message: str


@dataclass(frozen=True)
class NotChecked:
    """The suite's own helpers cannot lay the inputs out as asked: not the implementation's
    fault, and not checked."""

    why: str


ANSWERS = (Answered, Timed, Raised, Broke, NotChecked)
GREETINGS = (Ready, NotResolved)

# --- the fork-server line ----------------------------------------------------------------------


@dataclass(frozen=True)
class StartWorker:
    """judge -> fork server, with the worker's end of its socket pair and its output file:
    fork a worker serving ``selector``, confined to ``scratch`` (None: unconfined)."""

    selector: str
    paths: tuple[str, ...]  # the worker's sys.path, set once it is confined
    cwd: str
    scratch: str | None
    bounds: WorkerBounds = field(default_factory=WorkerBounds)  # memory, disk, tasks (sandbox)


@dataclass(frozen=True)
class WorkerStarted:
    pid: int
    # how far it was confined, as the fork server saw it before the worker imported anything of
    # the implementation (impls.sandbox.Confinement.describe())
    sandbox: str


@dataclass(frozen=True)
class WaitForWorker:
    """judge -> fork server: wait ``timeout`` seconds (None: until it ends) for worker ``pid``."""

    pid: int
    timeout: float | None


@dataclass(frozen=True)
class WorkerExited:
    returncode: int  # negative for a signal, as subprocess has it
    left_running: int  # its descendants that outlived it, which the fork server then killed


@dataclass(frozen=True)
class StillRunning:
    pass


@dataclass(frozen=True)
class Refused:
    """The fork server cannot serve the request (a pid that is not its worker, say)."""

    message: str


# --- how they travel ---------------------------------------------------------------------------


class LineError(Exception):
    """What came down a line is not a message its receiver accepts there."""


MESSAGES = (
    Description,
    InputArray,
    OutputArray,
    Call,
    Close,
    *GREETINGS,
    *ANSWERS,
    StartWorker,
    WorkerBounds,
    WorkerStarted,
    WaitForWorker,
    WorkerExited,
    StillRunning,
    Refused,
    Capabilities,
)
# What pickled NumPy arrays refer to (numpy 1 and 2 spell the module differently).
NUMPY_GLOBALS = {
    (module, name)
    for prefix in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{prefix}.multiarray", "_reconstruct"),
        (f"{prefix}.multiarray", "scalar"),
        (f"{prefix}.numeric", "_frombuffer"),
    )
} | {("numpy", "ndarray"), ("numpy", "dtype")}
ACCEPTED_GLOBALS = {(cls.__module__, cls.__qualname__) for cls in MESSAGES} | NUMPY_GLOBALS


class MessageUnpickler(pickle.Unpickler):
    """Unpickles the line's messages and NumPy arrays, and refuses every other global: a pickle
    can name any callable, and the judge must never call one a worker chose."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ACCEPTED_GLOBALS or module.startswith("numpy.dtypes"):
            return super().find_class(module, name)
        raise LineError(f"the message names {module}.{name}, which is not part of the line")


def dumps(message: Any, buffer_callback=None) -> bytes:
    return pickle.dumps(message, protocol=5, buffer_callback=buffer_callback)


def loads(payload: bytes, accepted: tuple[type, ...], buffers=()) -> Any:
    """The message in ``payload``, which must be one of ``accepted``; LineError otherwise."""
    try:
        message = MessageUnpickler(io.BytesIO(payload), buffers=buffers).load()
    except LineError:
        raise
    except Exception as exc:
        raise LineError(f"an unreadable message ({type(exc).__name__}: {exc})") from None
    if not isinstance(message, accepted):
        names = ", ".join(cls.__name__ for cls in accepted)
        raise LineError(f"a {type(message).__qualname__} where the line expects {names}")
    return message


IN_BAND_BYTES = 1 << 20  # below this, one message each way beats saving a copy
# What a receiver takes before it allocates: a worker announces its own sizes, and the judge must
# not run out of memory on its word. The pickle itself holds arrays under 1 MiB, messages and
# tracebacks; the out-of-band arrays of one answer are at most a few outputs of the suite's
# largest calls (an ANDREA layer's output in float64 is 6 MiB).
MAX_HEAD_BYTES = 64 << 20
MAX_BUFFER_BYTES = 4 << 30


def send(conn: Connection, message: Any) -> None:
    """``message`` down the worker line, NumPy arrays of 1 MiB or more as out-of-band buffers
    (one copy each way)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = dumps(message, buffers.append)
    if sum(buffer.raw().nbytes for buffer in buffers) < IN_BAND_BYTES:
        # Small arrays: one message (one system call, one wake-up of the other side).
        buffers = []
        payload = dumps(message)
    # Head: the number of out-of-band buffers and their sizes, 8 bytes each, then the pickle.
    sizes = b"".join(buffer.raw().nbytes.to_bytes(8, "little") for buffer in buffers)
    conn.send_bytes(len(buffers).to_bytes(4, "little") + sizes + payload)
    for buffer in buffers:
        conn.send_bytes(buffer.raw())


def receive(conn: Connection, accepted: tuple[type, ...]) -> Any:
    """The next message on the worker line, one of ``accepted`` (LineError otherwise);
    EOFError when the other end has closed it."""
    try:
        head = conn.recv_bytes(MAX_HEAD_BYTES)
    except OSError as exc:
        if "bad message length" not in str(exc):
            raise
        raise LineError(f"a message longer than {MAX_HEAD_BYTES} bytes") from None
    if len(head) < 4:
        raise LineError(f"a message of {len(head)} bytes, shorter than its head")
    count = int.from_bytes(head[:4], "little")
    sizes = [int.from_bytes(head[4 + 8 * i : 12 + 8 * i], "little") for i in range(count)]
    if sum(sizes) > MAX_BUFFER_BYTES:
        raise LineError(f"arrays of {sum(sizes)} bytes announced, over {MAX_BUFFER_BYTES}")
    # Writable buffers: an implementation may use its inputs as scratch space, as it could when
    # it ran in the judge's process; what it writes there stays in its worker.
    buffers = []
    for size in sizes:
        buffer = bytearray(size)
        try:
            if size:
                conn.recv_bytes_into(buffer)
            else:
                conn.recv_bytes()
        except BufferTooShort:
            raise LineError(f"a buffer longer than the {size} bytes its head announced") from None
        buffers.append(buffer)
    return loads(head[4 + 8 * count :], accepted, buffers)
