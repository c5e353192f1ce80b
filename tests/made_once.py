"""Something costly that several processes of a test run ask for at once (xdist workers, an
implementation's workers), made by the first to ask and found by the others."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def made_once(path: Path, make: Callable[[Path], None]) -> Path:
    """``path``, made by ``make(scratch)`` (a file or a directory at ``scratch``) if it is not
    there yet; a process that asks while another makes it waits for it. Made aside and renamed
    into place, so it is never there half made, even if the process making it dies."""
    import fcntl  # POSIX only, as are the runs that share these

    with open(path.with_name(f"{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not path.exists():
            scratch = path.with_name(f"{path.name}.partial")
            make(scratch)
            scratch.replace(path)
    return path


def session_directory(tmp_path_factory) -> Path:
    """A directory that every process of this test session sees: under xdist each worker has a
    base temporary directory of its own, and their parent is the session's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") is not None else base
