"""Which tests a run keeps: every conformance test names its claims once, in its
``@pytest.mark.claim(...)`` marker, and :func:`claims_of` is the one place that reads it (for the
plugin, the ``attnspec`` command and the traceability test alike)."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from conformance.run.ledger import MATHEMATICS
from conformance.run.selection import Selected
from spec.catalogue import Catalogue

CONFORMANCE_DIR = Path(__file__).resolve().parent.parent
BENCH_DIR = CONFORMANCE_DIR / "bench"  # attnspec bench's own test is no conformance test
CLAIM_MARKER = "claim"


def claims_of(node: pytest.Item | Callable) -> list[str]:
    """The claim IDs a test checks: from a collected item's markers, or from a test function's
    own ``pytestmark`` (what the ``attnspec`` command reads without collecting)."""
    if isinstance(node, pytest.Item):
        markers = node.iter_markers(CLAIM_MARKER)
    else:  # the function's own markers, and those of its parameters (pytest.param(marks=...))
        marks = list(getattr(node, "pytestmark", ()))
        for parametrize in [m for m in marks if m.name == "parametrize"]:
            for value in parametrize.args[1]:
                marks += [getattr(mark, "mark", mark) for mark in getattr(value, "marks", ())]
        markers = (m for m in marks if m.name == CLAIM_MARKER)
    return list(dict.fromkeys(claim for marker in markers for claim in marker.args))


def is_conformance_test(item: pytest.Item) -> bool:
    return _under_conformance(item.path)


@functools.cache
def _under_conformance(path: Path) -> bool:
    # Cached: asked three times per test, and resolving a path reads the file system each time.
    parents = Path(path).resolve().parents
    return CONFORMANCE_DIR in parents and BENCH_DIR not in parents


def suite_test_id(item: pytest.Item) -> str:
    """A conformance test's id as the checkout names it (``conformance/test_x.py::test_y[...]``),
    whatever the run's rootdir: an installed suite's nodeids are relative to wherever pytest
    settled, and neither a test's inputs nor its reproducer may depend on that."""
    if not is_conformance_test(item):
        return item.nodeid
    _, _, rest = item.nodeid.partition("::")
    return f"{_suite_path(item.path)}::{rest}"


@functools.cache
def _suite_path(path: Path) -> str:
    # Cached as _under_conformance is: asked several times per test, and resolving reads the disk.
    return Path(path).resolve().relative_to(CONFORMANCE_DIR.parent).as_posix()


def is_attnspec_run(config: pytest.Config, option_names: Iterable[str]) -> bool:
    """Whether this pytest run is attnspec's. An installed attnspec's plugin is loaded by every
    pytest run in its environment, and must leave the others alone: a run is attnspec's when its
    rootdir is this suite's checkout, when it names the suite (``--pyargs conformance``, a path
    into it), or when it passes one of attnspec's options."""
    if (Path(config.rootpath) / "conformance").resolve() == CONFORMANCE_DIR:
        return True
    given = {arg.partition("=")[0] for arg in config.invocation_params.args}
    if given & set(option_names):
        return True
    for arg in config.args:
        target = arg.partition("::")[0]
        if config.option.pyargs and (target == "conformance" or target.startswith("conformance.")):
            return True
        path = (Path(config.invocation_params.dir) / target).resolve()
        if path == CONFORMANCE_DIR or CONFORMANCE_DIR in path.parents:
            return True
    return False


def selected_of(item: pytest.Item) -> Selected | None:
    """The implementation a test judges, or None for a test of the document."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("selected") if callspec else None


def judged_name(item: pytest.Item) -> str | None:
    """The name of the implementation a test judges, or None for a test of the document."""
    selected = selected_of(item)
    return selected.client.name if selected is not None else None


def inputs_id(item: pytest.Item) -> str:
    """The test's id without the implementation's name: what its random inputs are drawn from,
    so that every implementation is judged on the same inputs and a name cannot change them."""
    name = judged_name(item)
    if name is None:
        return suite_test_id(item)
    test, brackets, params = suite_test_id(item).partition("[")
    if params == f"{name}]":
        return test
    if not params.startswith(f"{name}-"):
        raise ValueError(
            f"{suite_test_id(item)}: the implementation {name!r} does not lead its parameters"
        )
    return f"{test}{brackets}{params.removeprefix(f'{name}-')}"


def row_of(item: pytest.Item) -> str:
    """The verdict row a test's outcome counts for."""
    return judged_name(item) or MATHEMATICS


def marking_problems(items: Iterable[pytest.Item], catalogue: Catalogue) -> list[str]:
    """Conformance tests without a claim marker, or naming a claim the catalogue lacks."""
    problems = []
    for item in items:
        if not is_conformance_test(item):
            continue
        claims = claims_of(item)
        if not claims:
            problems.append(f"{item.nodeid}: no @pytest.mark.claim(...) marker")
        problems += [f"{item.nodeid}: unknown claim {c!r}" for c in claims if c not in catalogue]
    return problems


def split_by_claims(
    items: list[pytest.Item], patterns: Iterable[str]
) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped): a test is kept when one of its claims matches a pattern (tests without
    claims, outside the conformance suite, are always kept)."""
    patterns = list(patterns)
    if not patterns:
        return items, []
    keep, drop = [], []
    for item in items:
        claims = claims_of(item)
        wanted = any(fnmatch.fnmatchcase(c, p) for c in claims for p in patterns)
        (keep if wanted or not claims else drop).append(item)
    return keep, drop


def fold_broken(
    items: list[pytest.Item], broken: dict[str, str]
) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped): of an implementation whose first call broke the contract, one test per
    claim and module is kept (it fails, saying so once); the rest would fail the same way. Per
    module, not per claim: a claim judged in two modules (MASK-NONFINITE on float dtypes in
    test_mask.py, on FP8 in test_fp8.py) may have a module whose tests the implementation does
    not declare, and they skip rather than fail."""
    if not broken:
        return items, []
    keep, drop, claims_kept = [], [], set()
    for item in items:
        name = judged_name(item)
        if name not in broken:
            keep.append(item)
            continue
        module = item.nodeid.split("::")[0]
        new_claims = {(name, c, module) for c in claims_of(item)} - claims_kept
        if new_claims:
            claims_kept |= new_claims
            keep.append(item)
        else:
            drop.append(item)
    return keep, drop
