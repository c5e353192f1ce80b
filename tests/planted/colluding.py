"""Candidates that pass answers to each other through what workers could once share with the
machine, and candidates that hold memory ``RLIMIT_DATA`` does not count.

Each pair is an honest kernel, which computes the formula and leaves every answer where another
process could find it under a hash of its inputs, and a parasite, which computes nothing and
returns what it finds there (zeros where it finds nothing, so that it FAILS unless it is fed).
The channels: files in ``/dev/shm``, SysV shared memory and POSIX message queues. A parasite
judged alone in a later run reads what an earlier run's honest kernel left behind. Each says in
its output how many answers it found. The memory plantings are correct kernels that also hold
:data:`HELD` bytes past a worker's bound of ``--worker-memory 512MiB``: a shared anonymous
mapping, and a file written into ``/dev/shm``.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os

import numpy as np

from spec.formula import reference_attention

PREFIX = "attnspec-planted-"
HELD = 768 << 20  # past the tests' bound of 512 MiB
IPC_CREAT, SHM_RDONLY = 0o1000, 0o10000
O_RDWR, O_CREAT, O_NONBLOCK = 2, 0o100, 0o4000
QUEUE_MESSAGE = 8192  # the default msgsize_max


def _answer(q, k, v, causal, scale) -> np.ndarray:
    return reference_attention(q, k, v, causal=causal, scale=scale).astype(q.dtype)


def _key(q, k, v, causal, scale) -> str:
    digest = hashlib.sha1()
    for array in (q, k, v):
        digest.update(str((array.shape, array.dtype)).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update(repr((causal, scale)).encode())
    return digest.hexdigest()[:16]


def _found(channel: str, found: bool) -> None:
    print(f"planted parasite through {channel}: {'found' if found else 'no'} answer", flush=True)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
    libc.shmdt.argtypes = (ctypes.c_void_p,)
    libc.mq_timedreceive.restype = ctypes.c_ssize_t
    return libc


# --- files in /dev/shm ------------------------------------------------------------------------


def honest_through_files(q, k, v, *, causal=True, scale=None):
    out = _answer(q, k, v, causal, scale)
    np.save(f"/dev/shm/{PREFIX}{_key(q, k, v, causal, scale)}.npy", out)
    return out


def parasite_through_files(q, k, v, *, causal=True, scale=None):
    path = f"/dev/shm/{PREFIX}{_key(q, k, v, causal, scale)}.npy"
    found = os.path.exists(path)
    _found("files in /dev/shm", found)
    return np.load(path) if found else np.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)


# --- SysV shared memory -----------------------------------------------------------------------


def _segment_key(key: str) -> int:
    return int(key[:7], 16) + 1  # a positive int, never IPC_PRIVATE


def honest_through_sysv(q, k, v, *, causal=True, scale=None):
    out = _answer(q, k, v, causal, scale)
    libc, data = _libc(), out.tobytes()
    segment = libc.shmget(_segment_key(_key(q, k, v, causal, scale)), len(data), IPC_CREAT | 0o666)
    if segment >= 0:
        address = libc.shmat(segment, None, 0)
        if address not in (None, ctypes.c_void_p(-1).value):
            ctypes.memmove(address, data, len(data))
            libc.shmdt(ctypes.c_void_p(address))
    return out


def parasite_through_sysv(q, k, v, *, causal=True, scale=None):
    shape = q.shape[:-1] + v.shape[-1:]
    libc, size = _libc(), int(np.prod(shape)) * q.dtype.itemsize
    segment = libc.shmget(_segment_key(_key(q, k, v, causal, scale)), size, 0)
    address = libc.shmat(segment, None, SHM_RDONLY) if segment >= 0 else None
    found = address not in (None, ctypes.c_void_p(-1).value)
    _found("SysV shared memory", found)
    if not found:
        return np.zeros(shape, q.dtype)
    out = np.frombuffer(ctypes.string_at(address, size), q.dtype).reshape(shape).copy()
    libc.shmdt(ctypes.c_void_p(address))
    return out


# --- POSIX message queues ------------------------------------------------------------------------


class _QueueAttributes(ctypes.Structure):
    _fields_ = (
        ("mq_flags", ctypes.c_long),
        ("mq_maxmsg", ctypes.c_long),
        ("mq_msgsize", ctypes.c_long),
        ("mq_curmsgs", ctypes.c_long),
    )


_POSTED: list[bytes] = []  # the queues this honest kernel made, oldest first


def honest_through_message_queue(q, k, v, *, causal=True, scale=None):
    """Posts each answer in a queue of its own, named by its key, in at most 10 messages of at
    most 8 KiB (the defaults an ordinary user may not exceed); where the user's queue bytes run
    out, it removes its oldest queue and tries again."""
    out = _answer(q, k, v, causal, scale)
    data, libc = out.tobytes(), _libc()
    messages = [data[i : i + QUEUE_MESSAGE] for i in range(0, len(data), QUEUE_MESSAGE)] or [b""]
    if len(messages) > 10:
        return out
    name = f"/{PREFIX}{_key(q, k, v, causal, scale)}".encode()
    size = max(len(m) for m in messages) or 1
    attributes = _QueueAttributes(0, len(messages), size, 0)
    flags = O_RDWR | O_CREAT | O_NONBLOCK
    while (queue := libc.mq_open(name, flags, 0o666, ctypes.byref(attributes))) < 0 and _POSTED:
        libc.mq_unlink(_POSTED.pop(0))
    if queue >= 0:
        for message in messages:
            libc.mq_send(queue, message, len(message), 0)
        libc.mq_close(queue)
        _POSTED.append(name)
    return out


def parasite_through_message_queue(q, k, v, *, causal=True, scale=None):
    shape = q.shape[:-1] + v.shape[-1:]
    libc, size = _libc(), int(np.prod(shape)) * q.dtype.itemsize
    name = f"/{PREFIX}{_key(q, k, v, causal, scale)}".encode()
    queue = libc.mq_open(name, O_RDWR | O_NONBLOCK, 0o666, None)  # only one someone else made
    data, buffer = b"", ctypes.create_string_buffer(QUEUE_MESSAGE)
    if queue >= 0:
        while (got := libc.mq_timedreceive(queue, buffer, QUEUE_MESSAGE, None, None)) >= 0:
            data += buffer.raw[:got]
        libc.mq_close(queue)
        libc.mq_unlink(name)
    _found("POSIX message queues", len(data) == size)
    if len(data) != size:
        return np.zeros(shape, q.dtype)
    return np.frombuffer(data, q.dtype).reshape(shape).copy()


# --- memory the data limit does not count -----------------------------------------------------

_HELD: list = []  # what a kernel caching its workspace keeps between calls


def maps_shared_memory(q, k, v, *, causal=True, scale=None):
    if not _HELD:
        workspace = mmap.mmap(-1, HELD)  # shared and anonymous: not data
        for offset in range(0, HELD, mmap.PAGESIZE):
            workspace[offset] = 1
        _HELD.append(workspace)
    return _answer(q, k, v, causal, scale)


def fills_dev_shm(q, k, v, *, causal=True, scale=None):
    path = f"/dev/shm/{PREFIX}filler-{os.getpid()}"
    if not os.path.exists(path):
        chunk = b"\1" * (16 << 20)
        with open(path, "wb") as filler:
            for _ in range(HELD // len(chunk)):
                filler.write(chunk)
    return _answer(q, k, v, causal, scale)
