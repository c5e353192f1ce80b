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
    """The ``attnspec`` command, with nothing of the directory it is run from importable: that is
    where a candidate kernel's files lie (a ``csv.py`` among them, say), and it reaches the
    workers' ``sys.path`` alone, once they are confined (``--impl-path``). Run from the suite's
    own checkout (``python -m conformance``, nothing installed), that directory is the suite's:
    it comes back at the end of the path, behind the standard library and what is installed."""
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != here]
    if str(HOME) == os.path.realpath(here):
        sys.path.append(here)
    problem = shadowing()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    from conformance.cli import main as command

    return command()


def judge(impl, **options):
    """The verdict on ``impl`` from Python, as ``attnspec run`` gives it: see
    :func:`conformance.verifier.judge` for the options and what it returns."""
    problem = shadowing()
    if problem:
        raise ImportError(problem)
    from conformance.verifier import judge as confined_judge

    return confined_judge(impl, **options)


def shadowed_standard_library() -> str | None:
    """Under --require-sandbox, one line naming a module on ``sys.path`` that shadows the standard
    library's, or None: such a file beside a candidate kernel would run in the judge (the
    suite's own modules import hmac, csv, zipfile), so the run is refused before any of them."""
    asked = " ".join([*sys.argv, os.environ.get("PYTEST_ADDOPTS", "")])
    if "--require-sandbox" not in asked:
        return None
    from conformance.run.provenance import stdlib_shadows, trusted_roots

    found = stdlib_shadows(sys.path, trusted_roots())
    if not found:
        return None
    return (
        f"attnspec: --require-sandbox, but {'; '.join(found)}: judge untrusted code with "
        "`attnspec run --impl PATH.py:ATTR`, which imports nothing of its directory"
    )


# --- the pytest plugin (entry point pytest11) ---------------------------------------------------
# Registered under the name the checkout's conftest.py and `attnspec run`'s `-p` use, so that
# loading it again from either is a no-op rather than a second registration.
_PROBLEM = shadowing() or shadowed_standard_library()
if _PROBLEM is None:
    pytest_plugins = ["conformance.plugin"]
else:
    # Every pytest run in the environment loads this: stay silent unless asked to judge.
    ATTNSPEC_ARGUMENTS = ("--impl", "--claims", "--attnspec", "--report-json", "--report-html",
                          "--require-sandbox")  # fmt: skip

    def pytest_load_initial_conftests(early_config, parser, args) -> None:
        import pytest

        if any(arg.startswith(ATTNSPEC_ARGUMENTS) or "conformance" in arg for arg in args):
            raise pytest.UsageError(_PROBLEM)
