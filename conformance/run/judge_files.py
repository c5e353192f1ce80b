"""Where a judge process keeps its files in the temporary directory: the float64 truth it
shares with its xdist workers, each worker's scratch directory and the file its output goes to.

They lie in one directory per judge process, named by its pid and removed when it ends. A judge
that ends without removing it (killed by a timeout, by SIGKILL, by the machine) leaves it behind:
the next judge of the machine removes every such directory whose process has ended, so nothing
of a run outlives the next one (hundreds of scratch directories and output files piled up in
``/tmp`` before, one set for each judge that was killed).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "attnspec-judge-"
_DIRECTORIES: dict[int, Path] = {}  # by pid: a forked judge makes its own


def judge_directory() -> Path:
    """This process's directory, made (and the ended judges' removed) on first use."""
    pid = os.getpid()
    if pid not in _DIRECTORIES:
        remove_ended_judges()
        path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-"))
        _DIRECTORIES[pid] = path
        atexit.register(_remove_own, pid)
    return _DIRECTORIES[pid]


def _remove_own(pid: int) -> None:
    if os.getpid() == pid:  # not a forked child's exit
        shutil.rmtree(_DIRECTORIES.pop(pid), ignore_errors=True)


def remove_ended_judges() -> list[Path]:
    """Removes the directories of this user's judges whose processes have ended. Returns them."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        owner = path.name[len(PREFIX) :].split("-", 1)[0]
        with contextlib.suppress(OSError):
            if not owner.isdigit() or path.stat().st_uid != os.getuid():
                continue
            if not _running(int(owner)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has that pid now
        return True
    return True
