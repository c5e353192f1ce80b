"""What tox's envs run: the numpy env runs every project test, and the torch env runs again only
those that take another path where torch or matplotlib is installed. Each of those must say so
(the ``optional_libraries`` marker), or it would never run with them."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
OPTIONAL_LIBRARIES = ("torch", "matplotlib")
OWN_ENV = {"test_ecosystem.py"}  # its libraries are tox's ecosystem env's


def looks_for_an_optional_library(function: ast.FunctionDef) -> bool:
    """Whether ``function`` calls importorskip or find_spec on torch or matplotlib."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("importorskip", "find_spec")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in OPTIONAL_LIBRARIES
        for node in ast.walk(function)
    )


def test_every_test_that_looks_for_torch_or_matplotlib_is_rerun_in_the_torch_env():
    unmarked = [
        f"{path.name}::{node.name}"
        for path in sorted(TESTS.glob("test_*.py"))
        if path.name not in OWN_ENV
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and looks_for_an_optional_library(node)
        and "pytest.mark.optional_libraries" not in map(ast.unparse, node.decorator_list)
    ]
    assert not unmarked, (
        f"{unmarked} look for {' or '.join(OPTIONAL_LIBRARIES)}, but are not marked "
        "@pytest.mark.optional_libraries, so tox's torch env never runs them with it"
    )
