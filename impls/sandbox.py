"""The confinement of a worker, applied in its process before the implementation's module is
imported: what the implementation may read, write, signal and trace.

On Linux, Landlock (unprivileged since 5.13) through its three system calls, with ctypes: no
maintained Python binding covers its scopes (ABI 6), and the calls are three. The worker:

- reads, and runs, only what a Python process and its libraries need (the interpreter's prefixes,
  ``sys.path``, the system's libraries, ``/etc``, ``/proc``, ``/sys``, ``/dev``); everything else
  (``/tmp``, where the run's truth and reports lie, HOME, the other users' files) is out of sight;
- writes only beneath its own scratch directory (its TMPDIR and every compile cache), to
  ``/dev/null`` and ``/dev/shm``, and the GPU device nodes;
- signals, and connects to abstract Unix sockets of, nothing outside its own domain (ABI 6), and
  may ptrace only its own descendants, which Landlock enforces with any ABI;
- runs without the capabilities root has, and with no_new_privs, so that no exec regains them.

What is confined is said by :class:`Confinement`: ``full``, ``partial`` (what is missing: an ABI
below 6 leaves signals and abstract sockets open) or ``none`` (why).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import sys
import tempfile
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
FULL_ABI = 6  # signals and abstract sockets scoped

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
        return Confinement(
            "partial",
            f"Landlock ABI {abi}: files confined, but signals and abstract Unix sockets need ABI "
            f"{FULL_ABI} (Linux 6.12), so a worker can signal the judge",
        )
    return Confinement("full")


def _handled_rights(abi: int) -> int:
    rights = ABI1_RIGHTS
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


SUITE_ROOT = Path(__file__).resolve().parent.parent  # where spec/, impls/ and conformance/ lie


def readable_paths(scratch: Path) -> list[str]:
    """Where a worker may read: the interpreter, its modules, the system's libraries,
    ``sys.path`` (the judge's current directory among them, where a kernel file lies) and the
    suite's own packages, which an editable install finds by an import hook, not ``sys.path``."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *READABLE_SYSTEM, str(scratch)}
    paths.add(str(SUITE_ROOT))
    paths.update(entry or os.getcwd() for entry in sys.path)
    return sorted(p for p in paths if os.path.exists(p))


def scratch_environment(scratch: Path) -> dict[str, str]:
    """The variables that point a worker's temporary files and compile caches at its scratch."""
    return {"TMPDIR": str(scratch), "HOME": str(scratch)} | {
        name: str(scratch / "cache" / name.lower()) for name in CACHE_VARIABLES
    }


def become_subreaper() -> None:
    """This process's orphaned descendants come back to it (not to init), so that none escapes
    its tree: a worker's stay beneath it, and the fork server's beneath it."""
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def confine(scratch: Path) -> Confinement:
    """Confines this process (and all it starts) for good, as far as the kernel allows: files as
    the module docstring says, signals and abstract sockets scoped, root's capabilities dropped.
    Raises OSError where a step the kernel offers fails."""
    expected = expected_confinement()
    os.environ.update(scratch_environment(scratch))
    tempfile.tempdir = None  # chosen afresh from TMPDIR
    if sys.platform != "linux":
        return expected  # none, and why: no prctl, no Landlock
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    _drop_capabilities(libc)
    if expected.level == "none":
        return expected
    abi = landlock_abi()
    handled = _handled_rights(abi)
    attr = _RulesetAttr(handled, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 8  # older kernels take the first field
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in readable_paths(scratch):
            _allow(libc, ruleset, path, READ, handled)
        for path in [str(scratch), *WRITABLE_DEVICES]:
            if os.path.exists(path):
                _allow(libc, ruleset, path, handled, handled)
        for device in Path("/dev").glob("nvidia[0-9]*"):
            _allow(libc, ruleset, str(device), READ_FILE | WRITE_FILE, handled)
        if libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return expected


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
