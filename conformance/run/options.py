"""attnspec's options, declared once: the pytest plugin and ``attnspec run`` both read
:data:`OPTIONS`, each option with its typed parser (which names the problem), its metavar and its
default in its help. ``attnspec run`` hands each one it was given on to pytest as pytest spells it.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.run.selection import ENV_VAR, split_names
from conformance.run.worker_clients import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_IMPL_BUDGET,
    DEFAULT_WORKER_MEMORY,
    format_bytes,
)
from impls.sandbox import DEFAULT_WORKER_DISK, DEFAULT_WORKER_TASKS
from spec.catalogue import load_catalogue

DEFAULT_SEED = 20261129
SEED_VAR = "ATTNSPEC_SEED"
RANDOM_SEED = "random"  # a fresh seed per run, so that no answer is learnt against a known one


def seed_value(text: str) -> int:
    """A seed: a non-negative integer, or ``random`` for one drawn now."""
    if text == RANDOM_SEED:
        return secrets.randbelow(1 << 32)
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seed={text!r}, but should be a whole number or {RANDOM_SEED!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seed={value}, but should be >= 0")
    return value


def call_timeout_value(text: str) -> float:
    """A call deadline: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}, but should be a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g}, but should be > 0 seconds")
    return value


SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_value(text: str) -> int:
    """A memory bound: a size such as ``8GiB``, ``512M`` or ``4096MiB`` (binary units), or ``0``
    for none (returned as 0)."""
    size = size_value(text)
    if 0 < size < 64 << 20:
        raise argparse.ArgumentTypeError(
            f"{text!r} is below 64 MiB, where a worker cannot even import NumPy; 0 is no bound"
        )
    return size


def disk_value(text: str) -> int:
    """A disk bound: a size as :func:`memory_value` takes, at least 1 MiB, or ``0`` for none."""
    size = size_value(text)
    if 0 < size < 1 << 20:
        raise argparse.ArgumentTypeError(f"{text!r} is below 1 MiB; 0 is no bound")
    return size


def tasks_value(text: str) -> int:
    """A bound on a worker's live processes and threads: at least 8, or ``0`` for none."""
    try:
        tasks = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}, but should be a whole number of processes and threads, or 0 for no bound"
        ) from None
    if tasks < 0 or 0 < tasks < 8:
        raise argparse.ArgumentTypeError(
            f"{text!r}, but should be at least 8 (a Python process and its BLAS threads), or 0 "
            "for no bound"
        )
    return tasks


def size_value(text: str) -> int:
    """A size such as ``8GiB``, ``512M`` or ``4096MiB`` (binary units), or ``0``."""
    cleaned = text.strip().lower().removesuffix("b").removesuffix("i")
    number, unit = cleaned.rstrip("kmgt"), cleaned[len(cleaned.rstrip("kmgt")) :]
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}, but should be a size such as 8GiB or 512MiB, or 0 for no bound"
        ) from None
    if unit not in SIZE_UNITS or len(unit) > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: unit {unit!r} is not one of K, M, G, T")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}, but should be >= 0")
    return int(value * SIZE_UNITS[unit])


def budget_value(text: str) -> float:
    """An implementation's time budget: a positive number of seconds, or 0 for none."""
    try:
        if float(text) == 0:  # as given, or as attnspec run hands it on ("0.0")
            return 0.0
    except ValueError:
        pass  # the deadline's parser names the problem
    return call_timeout_value(text)


def directory_value(text: str) -> str:
    """A directory that exists, made absolute (the judge runs elsewhere)."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return str(path.resolve())


def variable_name_value(text: str) -> str:
    """An environment variable's name (a shell-style pattern such as ``HF_*`` is allowed)."""
    if not text or "=" in text or not text.replace("*", "A").replace("_", "A").isalnum():
        raise argparse.ArgumentTypeError(
            f"{text!r}, but should be a variable's name such as CUDA_HOME (no value)"
        )
    return text


def claim_patterns_value(text: str) -> list[str]:
    """Comma-separated claim patterns (shell-style, upper-cased as claim IDs are: ``mask-zero``
    is ``MASK-ZERO``), each matching at least one claim."""
    patterns = [pattern.upper() for pattern in split_names([text])]
    catalogue = load_catalogue()
    unmatched = [p for p in patterns if not catalogue.matching([p])]
    if unmatched:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unmatched)} matches no claim; claims are: "
            + ", ".join(c.id for c in catalogue)
        )
    return patterns


def report_path_value(text: str) -> Path:
    """A report's path: a file that can be written, in a directory that exists."""
    path = Path(text)
    problem = report_path_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(f"{path}: {problem}")
    return path


def report_path_problem(path: Path) -> str | None:
    """Why a report cannot be written to ``path``, or None: checked before the run, so that a
    typo never costs the run's verdict."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return "is a directory; give a file name"
    if not parent.exists():
        # Walk up to say which part is missing or is a file.
        for ancestor in [parent, *parent.parents]:
            if ancestor.exists():
                if not ancestor.is_dir():
                    return f"{ancestor} is a file, not a directory"
                break
        return f"directory {parent} does not exist; create it first"
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    if not os.access(parent, os.W_OK):
        return f"directory {parent} is not writable"
    return None


@dataclass(frozen=True)
class Option:
    """One option: its pytest flag, what it does, its default in words, and how it is parsed."""

    flag: str  # as pytest spells it
    does: str
    default: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    action: str = "store"  # or "append" (repeatable), "store_true" (a switch)
    run_flags: tuple[str, ...] = ()  # how attnspec run spells it, where not as pytest does

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of argparse's add_argument and pytest's addoption."""
        arguments: dict[str, Any] = {"action": self.action, "help": self.help}
        if self.action != "store_true":
            arguments |= {"metavar": self.metavar, "type": self.type}
        return arguments | {"default": False if self.action == "store_true" else None}

    @property
    def help(self) -> str:
        return f"{self.does} Default: {self.default}."

    def passed_on(self, value: Any) -> list[str]:
        """The pytest arguments that give it ``value`` as parsed (None, False: not given)."""
        if value is None or value is False:
            return []
        if self.action == "store_true":
            return [self.flag]
        values = value if self.action == "append" else [value]
        return [
            text
            for one in values
            for text in (self.flag, ",".join(one) if isinstance(one, list) else str(one))
        ]


OPTIONS: tuple[Option, ...] = (
    Option(
        "--impl",
        "implementation(s) to judge: a built-in name, an 'attnspec.impls' entry point, or "
        "package.module:attribute; repeatable.",
        f"${ENV_VAR}, else every built-in",
        metavar="NAME[,NAME...]",
        action="append",
    ),
    Option(
        "--claims",
        "run only tests of claims matching PATTERN (shell-style, e.g. 'MASK-*'); repeatable.",
        "every claim",
        metavar="PATTERN[,PATTERN...]",
        type=claim_patterns_value,
        action="append",
    ),
    Option(
        "--attnspec-seed",
        f"seed of every test's random inputs, or '{RANDOM_SEED}' for one drawn for the run "
        "(printed in the header and every reproducer).",
        f"${SEED_VAR}, else {DEFAULT_SEED}",
        metavar="N",
        type=seed_value,
        run_flags=("--seed",),
    ),
    Option(
        "--fail-on-should",
        "a SHOULD claim not met fails the run, as a MUST claim does.",
        "it is reported as an expected failure (unmet)",
        action="store_true",
    ),
    Option(
        "--call-timeout",
        "deadline of one call of an implementation: past it, its worker is killed and the test "
        "fails as a hang.",
        f"what the implementation declares (call_timeout), else {DEFAULT_CALL_TIMEOUT:g}",
        metavar="SECONDS",
        type=call_timeout_value,
        run_flags=("--call-timeout", "--timeout"),
    ),
    Option(
        "--in-process",
        "run implementations in the judge's own process, for pdb and profilers: a crash, a hang "
        "or a patched module can then lose or change the verdict.",
        "a worker process per implementation",
        action="store_true",
    ),
    Option(
        "--no-sandbox",
        "run workers unconfined, for debugging: an implementation can then write files, signal "
        "or trace the judge, and read the shared truth.",
        "each worker confined (impls/sandbox.py) as far as the kernel allows",
        action="store_true",
    ),
    Option(
        "--require-sandbox",
        "a run whose workers cannot be fully confined (no Landlock, an ABI before 6, "
        "--no-sandbox, --in-process) is a usage error.",
        "it runs, and says so",
        action="store_true",
    ),
    Option(
        "--impl-path",
        "a directory where the implementation's modules are found (a kernel file, its own "
        "packages), put first on the workers' sys.path and on nothing of the judge's; "
        "repeatable. A selector naming a file (./mykernel.py:attention) adds its directory.",
        "the directories of selectors that name a file",
        metavar="DIR",
        type=directory_value,
        action="append",
    ),
    Option(
        "--pass-env",
        "a variable of the judge's environment a worker gets besides those it always gets (PATH, "
        "the loader's, CUDA's, thread counts, locale; impls/sandbox.py); a pattern such as "
        "'HF_*' names several; repeatable.",
        "none",
        metavar="NAME",
        type=variable_name_value,
        action="append",
    ),
    Option(
        "--worker-memory",
        "the memory a worker may hold: its data (RLIMIT_DATA), and what the judge watches "
        "besides, its resident and shared pages and its own /dev/shm (no larger than SIZE): past "
        "it, the call fails as having exceeded its memory bound, its worker is restarted and the "
        "run goes on; 0 for no bound.",
        format_bytes(DEFAULT_WORKER_MEMORY),
        metavar="SIZE",
        type=memory_value,
    ),
    Option(
        "--worker-disk",
        "what a worker may write to its scratch (its TMPDIR and compile caches), a tmpfs of "
        "SIZE of its own: a write past it fails with ENOSPC, and the call with a message naming "
        "the bound; 0 for no bound (the scratch a directory of the judge's file system).",
        format_bytes(DEFAULT_WORKER_DISK),
        metavar="SIZE",
        type=disk_value,
    ),
    Option(
        "--worker-processes",
        "the live processes and threads a worker may have, all its tree together, counted in "
        "its own user namespace: a fork or thread past it fails (EAGAIN), and the call with a "
        "message naming the bound; 0 for no bound.",
        str(DEFAULT_WORKER_TASKS),
        metavar="N",
        type=tasks_value,
    ),
    Option(
        "--impl-budget",
        "the seconds an implementation's calls may take in all, per process of the run: once "
        "spent, its remaining tests are not checked, with that reason; 0 for no budget.",
        f"{DEFAULT_IMPL_BUDGET:g}",
        metavar="SECONDS",
        type=budget_value,
    ),
    Option(
        "--first-failure",
        "stop judging an implementation at its first failed MUST claim, the claims that most "
        "often fail run first: its verdict (FAILS) sooner, its other claims not checked, with "
        "that reason. For loops where most candidates are wrong; under -n, exact where one xdist "
        "worker runs all of an implementation's tests (--dist loadgroup, as attnspec run does).",
        "every claim judged",
        action="store_true",
    ),
    Option(
        "--no-truth-cache",
        "compute the float64 truth and the naive baseline in every test that needs them.",
        "once per inputs in a run, shared by the implementations and the xdist workers "
        "(conformance/judge/truth.py)",
        action="store_true",
    ),
    Option(
        "--report-json",
        "write the verdict per implementation and claim as JSON (schema attnspec-report/2, "
        "documented in conformance/report/json_report.py) to PATH.",
        "no file",
        metavar="PATH",
        type=report_path_value,
    ),
    Option(
        "--report-html",
        "write a self-contained HTML report (the matrix, the environment, the document's "
        "figures; plots need matplotlib) to PATH.",
        "no file",
        metavar="PATH",
        type=report_path_value,
    ),
)

OPTION_GROUP = "attnspec"


def add_to_pytest(parser) -> list[str]:
    """Declares every option in pytest's ``attnspec`` group; returns their flags."""
    group = parser.getgroup(OPTION_GROUP, "attnspec: attention conformance")
    for option in OPTIONS:
        group.addoption(option.flag, dest=option.dest, **option.arguments())
    return [option.flag for option in OPTIONS]


def add_to_command(parser: argparse.ArgumentParser) -> None:
    """Declares every option on ``attnspec run``, as it spells them."""
    for option in OPTIONS:
        parser.add_argument(
            *(option.run_flags or (option.flag,)), dest=option.dest, **option.arguments()
        )


def pytest_arguments_of(namespace: argparse.Namespace) -> list[str]:
    """The pytest arguments that pass on what ``attnspec run`` was given."""
    return [
        text for option in OPTIONS for text in option.passed_on(getattr(namespace, option.dest))
    ]
