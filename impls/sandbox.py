"""The confinement of a worker, applied in its process before the implementation's module is
imported: what the implementation may read, write, signal and trace.

On Linux, Landlock (unprivileged since 5.13) through its three system calls, with ctypes: no
maintained Python binding covers its scopes (ABI 6), and the calls are three. The worker:

- reads, and runs, only what a Python process and its libraries need (the interpreter's prefixes,
  ``sys.path``, the system's libraries, ``/etc``, ``/proc``, ``/sys``, ``/dev``); everything else
  (``/tmp``, where the run's truth and reports lie, HOME, the other users' files) is out of sight;
- writes only beneath its own scratch directory (its TMPDIR and every compile cache), to
  ``/dev/null`` and ``/dev/shm``, the GPU device nodes, and its own ``/proc/self`` entries (the
  CUDA driver writes there as it starts; without them no worker reaches a GPU);
- signals, and connects to abstract Unix sockets of, nothing outside its own domain (ABI 6), and
  may ptrace only its own descendants, which Landlock enforces with any ABI;
- runs without the capabilities root has, and with no_new_privs, so that no exec regains them;
- has no network: a network namespace of its own (no interface but a loopback that is down, so
  no TCP, UDP or loopback traffic leaves it), made as root or in a user namespace where an
  ordinary user may make one, and Landlock's TCP rules (ABI 4) refusing every bind and connect;
- sees no process of the machine but its own: a PID namespace of its own with a ``/proc`` of its
  own, so the judge's command line, the other workers and their ``/proc`` entries are not there
  to read, and every process it starts ends with it;
- shares no memory with any other process of the machine: an IPC namespace of its own (SysV
  shared memory, semaphores and message queues, POSIX message queues), and a mount namespace
  of its own where ``/dev/shm``, the one place besides its scratch where it may write, is a fresh
  tmpfs of at most its memory bound (PyTorch's and CuPy's shared memory work there); all of it
  dies with the worker's last process, so nothing of one candidate reaches another, nor a later
  run;
- gets an environment of the variables :func:`worker_environment` lets through, and nothing else
  of the judge's (no token, no secret);
- may hold at most its memory bound of data (``RLIMIT_DATA``, which counts what malloc, NumPy and
  torch allocate, and not the address space CUDA reserves); shared mappings, which that limit
  does not count, the judge watches (:mod:`conformance.run.memory_watch`), and ``/dev/shm`` is no
  larger than the bound. As root, the IPC namespace's SysV shared memory is bounded by it too;
- may write at most its disk bound: its scratch is a tmpfs of that size in its own mount
  namespace (what it writes there is gone with its last process, and never shares a file system
  with the judge's reports or truth), so a write past it fails with ENOSPC at once, where a watch
  of the directory's size would see a 4 GiB fallocate only after it happened;
- may have at most its bound of live tasks, processes and threads together: ``RLIMIT_NPROC``,
  counted in the worker's own user namespace (there the count is its tree's alone, not every
  process of its user's on the machine), so that an ordinary user's fork past it fails with
  EAGAIN; the kernel never refuses uid 0 a task, so for root's workers the judge counts them
  (:mod:`conformance.run.memory_watch`, every 20 ms of a call) and stops a worker at its bound.

What is confined is said by :class:`Confinement`: ``full``, ``partial`` (what is missing: an ABI
below 6 leaves signals and abstract sockets open, one below 4 TCP; no namespaces leave UDP, the
loopback, ``/dev/shm``, the IPC objects and the processes the machine's) or ``none`` (why). The
judge reports what the worker's confinement achieved as the fork server saw it, before the
implementation's module was imported, never what the worker says of itself afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fnmatch
import functools
import json
import os
import platform
import resource
import signal
import struct
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# System call numbers: the same on x86_64 and aarch64 (asm-generic numbers, added in 5.13).
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
CAPSET = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
PR_SET_CHILD_SUBREAPER = 36

# Filesystem rights by the ABI that introduced them; IOCTL_DEV (ABI 5) is left unhandled, so GPU
# drivers' ioctls work on the device nodes a worker may open.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ABI1_RIGHTS = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
REFER, TRUNCATE = 1 << 13, 1 << 14
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
NETWORK_ABI = 4  # TCP's bind and connect handled
FULL_ABI = 6  # signals and abstract sockets scoped
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x20000, 0x8000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
# A worker's own network, IPC, mount and PID namespaces: made together, in one unshare.
NAMESPACES = CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWPID
NAMESPACE_NAMES = ("network", "ipc", "mount", "pid")
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
SHARED_MEMORY = "/dev/shm"

READ = EXECUTE | READ_FILE | READ_DIR
READABLE_SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/proc",
                   "/sys", "/dev", "/run/nvidia-persistenced")  # fmt: skip
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/shm", "/dev/dri", "/dev/nvidiactl",
                    "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                    "/dev/nvidia-caps")  # fmt: skip
# The compile caches of the libraries a kernel may use, and the generic ones, pointed at scratch.
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "CUPY_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                   "TORCH_EXTENSIONS_DIR", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME",
                   "NUMBA_CACHE_DIR", "MPLCONFIGDIR")  # fmt: skip


# What a worker's environment holds of the judge's: the dynamic loader's and CUDA's variables, the
# thread and BLAS counts the run sets, NumPy's CPU dispatch, the interpreters of Triton and JAX's
# platform, locale and time zone; and, set afresh, HOME and TMPDIR in its scratch. A name ending
# in * stands for every name it begins.
WORKER_VARIABLES = ("PATH", "LD_LIBRARY_PATH", "CUDA_*", "NVIDIA_*", "CUPY_*", "TRITON_INTERPRET",
                    "JAX_PLATFORMS", "XLA_FLAGS", "OMP_*", "MKL_*", "OPENBLAS_*", "BLIS_*",
                    "NPY_*", "NUMEXPR_*", "LANG", "LANGUAGE", "LC_*", "TZ",
                    "ATTNSPEC_LANDLOCK_ABI")  # fmt: skip


def worker_environment(environ: Mapping[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """The judge's variables a worker gets: those :data:`WORKER_VARIABLES` names, and those named
    in ``passed`` (``--pass-env``); nothing else, however the judge's environment came to hold it
    (a CI token, a cloud key, ``PYTHONPATH``)."""
    allowed = (*WORKER_VARIABLES, *passed)
    return {
        name: value
        for name, value in environ.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)
    }


# A worker's disk: its scratch, where TMPDIR and every compile cache point. The largest a
# built-in's scratch reached here is in docs/isolation.md; a GPU's Triton and CuPy caches are
# megabytes. A tmpfs holds what is written in memory, so the bound is memory a worker may use
# besides its memory bound.
DEFAULT_WORKER_DISK = 2 << 30
# A worker's live processes and threads: OpenMP, BLAS and torch start a thread per core, Triton
# a compile worker per core; a 256-core machine's pools several times over.
DEFAULT_WORKER_TASKS = 2048


@dataclass(frozen=True)
class WorkerBounds:
    """What a confined worker may hold (None: no bound): ``memory_bytes`` of data and shared
    memory, ``disk_bytes`` written to its scratch, ``tasks`` live processes and threads."""

    memory_bytes: int | None = None
    disk_bytes: int | None = None
    tasks: int | None = None

    def as_text(self) -> str:
        """The bounds as one argument of a worker's command line."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_text(cls, text: str) -> WorkerBounds:
        return cls(**json.loads(text)) if text else cls()


@dataclass(frozen=True)
class Confinement:
    """How far a worker is confined: ``level`` is full, partial or none, ``detail`` says what is
    missing (partial) or why there is none."""

    level: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.level} ({self.detail})" if self.detail else self.level


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


@functools.cache
def _libc():
    # The C library this process already has (find_library would start ldconfig: milliseconds
    # of every worker's start); loaded once, in the fork server, and inherited by its forks.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, disabled, too old).
    ``ATTNSPEC_LANDLOCK_ABI`` caps it, so a test can stand for an older kernel."""
    if sys.platform != "linux":
        return 0
    abi = _libc().syscall(LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    abi = max(int(abi), 0)
    cap = os.environ.get("ATTNSPEC_LANDLOCK_ABI")
    return min(abi, int(cap)) if cap and cap.isdigit() else abi


def expected_confinement() -> Confinement:
    """What :func:`confine` will achieve here: what the judge reports before any worker starts."""
    if sys.platform != "linux":
        return Confinement("none", f"Landlock is Linux's; this is {sys.platform}")
    abi = landlock_abi()
    if abi < 1:
        return Confinement("none", "the kernel offers no Landlock (disabled, or before 5.13)")
    if abi < FULL_ABI:
        return Confinement("partial", _missing_abi(abi))
    return Confinement("full")


def _missing_abi(abi: int) -> str:
    missing = "signals and abstract Unix sockets" + (" and TCP" if abi < NETWORK_ABI else "")
    return (
        f"Landlock ABI {abi}: files confined, but {missing} need ABI {FULL_ABI} (Linux 6.12), "
        "so a worker can signal the judge"
    )


def _handled_rights(abi: int) -> int:
    rights = ABI1_RIGHTS
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


SUITE_ROOT = Path(__file__).resolve().parent.parent  # where spec/, impls/ and conformance/ lie


def readable_paths(scratch: Path, search_paths: Iterable[str]) -> list[str]:
    """Where a worker may read: the interpreter, its modules, the system's libraries, the
    worker's ``search_paths`` (its sys.path to be: the candidate's directory among them) and the
    suite's own packages, which an editable install finds by an import hook, not ``sys.path``."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *READABLE_SYSTEM, str(scratch)}
    paths.add(str(SUITE_ROOT))
    paths.update(entry or os.getcwd() for entry in search_paths)
    return sorted(p for p in paths if os.path.exists(p))


def scratch_environment(scratch: Path) -> dict[str, str]:
    """The variables that point a worker's temporary files and compile caches at its scratch."""
    return {"TMPDIR": str(scratch), "HOME": str(scratch)} | {
        name: str(scratch / "cache" / name.lower()) for name in CACHE_VARIABLES
    }


def die_with_parent(parent: int | None = None) -> bool:
    """This process gets SIGKILL when its parent ends, so that a judge killed outright takes its
    fork server, the fork server its workers, and a worker's relay its PID namespace. Returns
    False where the parent (pid ``parent``, seen from here) has ended already."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return parent is None or os.getppid() == parent


def become_subreaper() -> None:
    """This process's orphaned descendants come back to it (not to init), so that none escapes
    its tree: a worker's stay beneath it, and the fork server's beneath it."""
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def confine(
    scratch: Path, search_paths: Iterable[str], bounds: WorkerBounds | None = None
) -> Confinement:
    """Confines this process (and all it starts) for good, as far as the kernel allows: files as
    the module docstring says, no network, signals and abstract sockets scoped, root's
    capabilities dropped, and ``bounds`` (None: none). Returns what was achieved; raises OSError
    where a step the kernel offers fails."""
    bounds = bounds or WorkerBounds()
    memory_bytes = bounds.memory_bytes
    expected = expected_confinement()
    os.environ.update(scratch_environment(scratch))
    tempfile.tempdir = None  # chosen afresh from TMPDIR
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    if sys.platform != "linux":
        return expected  # none, and why: no prctl, no Landlock
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    # before the capabilities go (root's needs them), and before Landlock's rules, so that the
    # rules for /dev/shm and the scratch name the worker's own file systems
    no_namespace = _leave_the_machine(libc, bounds, scratch)
    _drop_capabilities(libc)
    if expected.level == "none":
        return expected
    abi = landlock_abi()
    handled = _handled_rights(abi)
    network = NET_BIND_TCP | NET_CONNECT_TCP if abi >= NETWORK_ABI else 0
    attr = _RulesetAttr(
        handled, network, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    )
    # older kernels take the fields they know: the first alone before ABI 4, two before ABI 6
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= NETWORK_ABI else 8)
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in readable_paths(scratch, search_paths):
            _allow(libc, ruleset, path, READ, handled)
        for path in [str(scratch), *WRITABLE_DEVICES]:
            if os.path.exists(path):
                _allow(libc, ruleset, path, handled, handled)
        for device in Path("/dev").glob("nvidia[0-9]*"):
            _allow(libc, ruleset, str(device), READ_FILE | WRITE_FILE, handled)
        # The CUDA driver writes to the process's own /proc entries as it starts: without this,
        # cudaGetDeviceCount fails with cudaErrorOperatingSystem (an H200, driver 580, seen
        # through a worker of each confinement step); /proc/self is this worker's own.
        _allow(libc, ruleset, "/proc/self", READ | WRITE_FILE | TRUNCATE, handled)
        if libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    if expected.level == "full" and no_namespace and no_namespace.startswith("unshare"):
        return Confinement(
            "partial",
            f"no namespaces ({no_namespace}): UDP, the loopback, /dev/shm, the IPC objects and "
            "the processes in /proc stay the machine's",
        )
    if expected.level == "full" and no_namespace:
        return Confinement("partial", no_namespace)  # a bound that could not be set, named
    return expected


def _leave_the_machine(libc, bounds: WorkerBounds, scratch: Path) -> str | None:
    """Moves this process into network, IPC, mount and PID namespaces of its own (as root
    directly, else inside a user namespace of its own that maps this user to itself), with a
    fresh ``/dev/shm``, its scratch a tmpfs of its disk bound, its tasks bounded, and a ``/proc``
    that shows its own processes alone; from here on it is the PID namespace's process 2
    (:func:`_own_process_tree`). Returns what it could not do, or None."""
    if libc.unshare(NAMESPACES) != 0:
        as_root = os.strerror(ctypes.get_errno())
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | NAMESPACES) != 0:
            return f"unshare: {as_root}; in a user namespace: {os.strerror(ctypes.get_errno())}"
        try:  # this user as itself inside, so that files keep their owners
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError as exc:
            raise OSError(exc.errno, f"mapping the user namespace: {exc.strerror}") from None
    missing = [
        why
        for why in (
            _own_shared_memory(libc, bounds.memory_bytes),
            _scratch_of_its_own(libc, scratch, bounds.disk_bytes),
            _own_process_tree(libc),
        )
        if why
    ]
    if bounds.tasks is not None:
        # Counted in the user namespace an ordinary user's worker has of its own: its tree's
        # tasks alone. The kernel exempts uid 0, whose workers the judge counts instead.
        resource.setrlimit(resource.RLIMIT_NPROC, (bounds.tasks, bounds.tasks))
    return "; ".join(missing) or None


def _own_process_tree(libc) -> str | None:
    """Goes on as a process of the PID namespace the unshare made, which sees its own processes
    alone in a ``/proc`` of its own. Returns why it cannot see them alone, or None.

    The unshare moved this process's children, not itself: so it stays outside as the worker
    the fork server and the judge know by its pid, and relays (:func:`_relay`); its child is the
    namespace's process 1, which mounts the namespace's ``/proc``, reaps, and dies with this
    process (``PR_SET_PDEATHSIG``); and its child, the namespace's process 2, returns from here
    and becomes the worker. Process 1 is its own for a reason: the kernel keeps signals without
    a handler from a namespace's process 1, so an implementation's own ``abort()`` or
    ``kill(getpid(), ...)`` would not end it as they end a worker elsewhere. When process 1 ends,
    the kernel kills every process left in the namespace, so nothing the implementation started
    outlives its worker, wherever it put itself."""
    on_interrupt = signal.getsignal(signal.SIGINT)  # its relay and process 1 ignore SIGINT
    status_read, status_write = os.pipe()
    if (init := os.fork()) != 0:
        _relay(init, status_read, status_write)
    os.close(status_read)
    die_with_parent()  # its parent, outside the namespace, has no pid here to check
    why = None
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        why = (
            f"no /proc of its own ({os.strerror(ctypes.get_errno())}): its PID namespace's "
            "worker sees the machine's processes"
        )
    if (worker := os.fork()) != 0:
        _init(worker, status_write)
    os.close(status_write)
    signal.signal(signal.SIGINT, on_interrupt)
    return why


def _keep_only(*kept: int) -> None:
    """Closes every descriptor but stdin, stdout, stderr and ``kept``: the worker's line to the
    judge and its report pipe stay the worker's alone, so the judge sees them close with it."""
    edge = 3
    for fd in sorted(kept):
        os.closerange(edge, fd)
        edge = fd + 1
    os.closerange(edge, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _init(worker: int, status_write: int) -> None:
    """Process 1 of the worker's PID namespace: reaps what ends in it, and when the worker ends
    tells the relay how, and ends (and the namespace with it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _keep_only(status_write)
    while True:
        try:
            ended, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if ended == worker:
            os.write(status_write, struct.pack("i", status))
            os._exit(0)


def _relay(init: int, status_read: int, status_write: int) -> None:
    """The worker as its fork server and judge know it: waits for the namespace's process 1,
    then ends as the worker inside ended (its exit status, or its signal), so that the judge
    reads a segfault inside as a segfault."""
    os.close(status_write)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _keep_only(status_read)
    _, status = os.waitpid(init, 0)
    said = os.read(status_read, 4)
    if len(said) == 4:
        status = struct.unpack("i", said)[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker's core was its own
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _scratch_of_its_own(libc, scratch: Path, disk_bytes: int | None) -> str | None:
    """The scratch a tmpfs of ``disk_bytes`` (None: no bound, the directory as it is) in this
    process's own mount namespace. Returns why not."""
    if disk_bytes is None:
        return None
    options = f"size={disk_bytes},mode=0700".encode()
    if libc.mount(b"tmpfs", str(scratch).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return f"no disk bound: mounting a tmpfs on the scratch: {os.strerror(ctypes.get_errno())}"
    return None


def _own_shared_memory(libc, memory_bytes: int | None) -> str | None:
    """A fresh tmpfs on /dev/shm, no larger than the memory bound, in this process's own mount
    namespace (whose mounts first stop propagating to the machine's), and, where this process may
    set them (root), the IPC namespace's SysV shared memory bounded alike. Returns why not."""
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return f"making the mounts private: {os.strerror(ctypes.get_errno())}"
    if not os.path.isdir(SHARED_MEMORY):
        return None  # no /dev/shm to share
    size = f"size={memory_bytes}," if memory_bytes else ""
    options = f"{size}mode=1777".encode()
    if libc.mount(b"tmpfs", SHARED_MEMORY.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return f"mounting a tmpfs on {SHARED_MEMORY}: {os.strerror(ctypes.get_errno())}"
    if memory_bytes:
        # An ordinary user's user namespace may not set them (EACCES): its segments then live
        # and die with the IPC namespace, unbounded meanwhile (docs/isolation.md).
        with contextlib.suppress(OSError):
            Path("/proc/sys/kernel/shmmax").write_text(str(memory_bytes))
            Path("/proc/sys/kernel/shmall").write_text(
                str(-(-memory_bytes // os.sysconf("SC_PAGE_SIZE")))
            )
    return None


def _allow(libc, ruleset: int, path: str, rights: int, handled: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not os.path.isdir(path):
            rights &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE  # what a file's rule may hold
        rule = ctypes.byref(_PathBeneathAttr(rights & handled, fd))
        added = libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0)
        if added != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _drop_capabilities(libc) -> None:
    """Every capability gone: the bounding set, the ambient set, and the effective, permitted and
    inheritable sets (capset), so that root's worker is an ordinary process of uid 0."""
    if os.geteuid() != 0 and not _has_capabilities():
        return
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for capability in range(last + 1):
        dropped = libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) == 0
        if not dropped and ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {capability})")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if CAPSET is None:
        raise OSError(errno.ENOSYS, f"capset on {platform.machine()}")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # two words each of effective, permitted, inheritable: none
    if libc.syscall(CAPSET, ctypes.byref(header), ctypes.byref(data)) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _has_capabilities() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16) != 0
    return False
