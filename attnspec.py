"""The installed entry points of attnspec: the ``attnspec`` command and the pytest plugin.

The suite's packages have the plain names of the repository's folders (``spec``, ``impls``,
``conformance``), which a user's own ``spec/`` or ``impls.py`` in the working directory would
shadow: Python imports whatever comes first on ``sys.path``, and ``python -m pytest`` puts the
current directory first. This module has the distribution's own name, so it is imported from the
installation whatever the working directory holds, and it checks the plain names before anything
imports them: a shadowed package is refused in one line naming the file that shadows it, rather
than judging with someone else's module or failing on a missing submodule.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

PACKAGES = ("spec", "impls", "conformance")
HOME = Path(__file__).resolve().parent  # where this installation's packages are


def shadowing() -> str | None:
    """One line naming what shadows one of the suite's packages on ``sys.path``, or None."""
    for name in PACKAGES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module else None
        if module is None:
            try:
                found = importlib.util.find_spec(name)
            except (ImportError, ValueError) as exc:
                return f"attnspec: its package {name!r} cannot be found ({exc})"
            origin = found.origin if found else None
        ours = HOME / name / "__init__.py"
        if origin is None or Path(origin).resolve() != ours:
            where = origin or f"a directory {name}/ without __init__.py"
            return (
                f"attnspec: {where} shadows attnspec's package {name!r} ({ours.parent}): "
                "rename it, or run from another directory"
            )
    return None


def main() -> int:
    """The ``attnspec`` command: the current directory first on ``sys.path`` (where a kernel named
    ``module:attr`` is found, and where the suite's pytest will look too), checked, then run."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    problem = shadowing()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    from conformance.cli import main as command

    return command()


# --- the pytest plugin (entry point pytest11) ---------------------------------------------------
# Registered under the name the checkout's conftest.py and `attnspec run`'s `-p` use, so that
# loading it again from either is a no-op rather than a second registration.
_PROBLEM = shadowing()
if _PROBLEM is None:
    pytest_plugins = ["conformance.plugin"]
else:
    # Every pytest run in the environment loads this: stay silent unless asked to judge.
    ATTNSPEC_ARGUMENTS = ("--impl", "--claims", "--attnspec", "--report-json", "--report-html")

    def pytest_load_initial_conftests(early_config, parser, args) -> None:
        import pytest

        if any(arg.startswith(ATTNSPEC_ARGUMENTS) or "conformance" in arg for arg in args):
            raise pytest.UsageError(_PROBLEM)
