"""What of a pytest run came from outside the suite and the Python installation: the code the
judge's own process may have run before attnspec's plugin could stop it.

Under plain ``python -m pytest``, Python puts the current directory first on ``sys.path`` and
pytest reads the ini file and conftest.py files it finds there, all before the plugin runs: a
candidate's ``conftest.py``, an ini file's ``-p`` plugin or a ``zipfile.py`` beside its kernel
runs inside the judge. ``--require-sandbox`` then refuses the run, naming each, rather than
promise a confinement such a file undoes; ``attnspec run`` starts its pytest isolated, where
there is none (docs/isolation.md).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

import pytest

from impls.sandbox import SUITE_ROOT


def trusted_roots() -> list[Path]:
    """The suite's checkout or installation, and the interpreter's own directories."""
    roots = {SUITE_ROOT, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    roots.update(Path(path) for path in sysconfig.get_paths().values())
    return [root.resolve() for root in roots]


def is_trusted(path: Path, roots: Iterable[Path]) -> bool:
    path = path.resolve()
    return any(path == root or root in path.parents for root in roots)


def stdlib_shadows(search_path: list[str], roots: list[Path]) -> list[str]:
    """Modules named like the standard library's in a ``sys.path`` directory ahead of it, outside
    the suite and the installation: Python imports them instead of the standard library's."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    found = []
    for entry in search_path:
        directory = Path(entry or os.getcwd()).resolve()
        if directory == stdlib:
            break
        if not directory.is_dir() or is_trusted(directory, roots):
            continue
        for name in sorted(sys.stdlib_module_names):
            for candidate in (directory / f"{name}.py", directory / name / "__init__.py"):
                if candidate.is_file():
                    found.append(f"{candidate}, which shadows the standard library's {name}")
    return found


def foreign_code(config: pytest.Config) -> list[str]:
    """Each thing this run loaded, or would import, from outside the suite and the installation:
    an ini file, a conftest or plugin module, a module shadowing the standard library."""
    roots = trusted_roots()
    found = []
    if config.inipath is not None and not is_trusted(Path(config.inipath), roots):
        found.append(f"the ini file {config.inipath}")
    for plugin in config.pluginmanager.get_plugins():
        file = getattr(plugin, "__file__", None)
        if file and not is_trusted(Path(file), roots):
            kind = "conftest" if Path(file).name == "conftest.py" else "plugin"
            found.append(f"the {kind} {file}")
    return found + stdlib_shadows(sys.path, roots)
