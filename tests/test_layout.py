"""The folders tell the story: each layer imports only from the layers below it, and the formula
has one home (spec/formula.py) that the judge never restates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.suite_process import ROOT

# Lowest first. A module may import from its own layer and those before it, never after.
LAYERS = (
    (("spec",), "what must hold: the claims, the dtypes, the formula and its oracle"),
    (("impls",), "what is judged"),
    (("conformance.run",), "the session: selection, workers, what was recorded"),
    (("conformance.judge",), "one test's judgement: cases, assertions, tolerance"),
    (("conformance.report",), "what the run says: tables, JSON, HTML"),
    (("conformance",), "the pytest wiring, the attnspec command and the tests of the claims"),
    (("perf", "tests"), "performance gates and the project's own tests, on top of everything"),
)
# Calls that compute the formula's pieces (softmax, mask): only spec/formula.py may make them on
# the judge's side, so that the truth and the yardstick cannot drift apart.
FORMULA_CALLS = {"exp", "exp2", "expm1", "logaddexp", "logsumexp", "log_softmax", "tril", "triu"}
JUDGE_SIDE = ("conformance", "perf")


def layer_of(module: str) -> int | None:
    ranks = [
        (len(prefix), rank)
        for rank, (prefixes, _) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(ranks)[1] if ranks else None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> list[Path]:
    return [
        path
        for top in ("spec", "impls", "conformance", "perf", "tests")
        for path in sorted((ROOT / top).rglob("*.py"))
    ]


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def upward_imports(path: Path) -> list[str]:
    own = layer_of(module_name(path))
    problems = []
    for line, imported in imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
        target = layer_of(imported)
        if own is not None and target is not None and target > own:
            problems.append(
                f"{path.relative_to(ROOT)}:{line} imports {imported} "
                f"({' '.join(LAYERS[target][0])}, above {' '.join(LAYERS[own][0])})"
            )
    return problems


def formula_restatements(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in FORMULA_CALLS:
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}()")
    return problems


def test_every_module_belongs_to_a_layer():
    assert [str(p) for p in project_modules() if layer_of(module_name(p)) is None] == []


def test_no_module_imports_from_a_layer_above_it():
    problems = [problem for path in project_modules() for problem in upward_imports(path)]
    assert not problems, "\n".join(problems)


def test_the_judge_never_restates_the_softmax_or_the_mask():
    judge_side = [p for p in project_modules() if module_name(p).startswith(JUDGE_SIDE)]
    problems = [problem for path in judge_side for problem in formula_restatements(path)]
    assert not problems, (
        "the formula's pieces belong in spec/formula.py; found on the judge's side:\n"
        + "\n".join(problems)
    )


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import numpy as np\nw = np.exp(s - s.max())\n", True),
        ("import numpy as np\nm = np.tril(np.ones((3, 3)))\n", True),
        ("from math import exp\nw = [exp(x) for x in s]\n", True),
        ("from spec.formula import softmax\nw = softmax(s)\n", False),
    ],
)
def test_the_restatement_scan_sees_a_planted_softmax(tmp_path, source, found):
    planted = ROOT / "conformance" / "_planted_for_test_layout.py"
    try:
        planted.write_text(source, encoding="utf-8")
        assert bool(formula_restatements(planted)) is found
    finally:
        planted.unlink(missing_ok=True)


def test_the_import_scan_sees_a_planted_upward_import():
    planted = ROOT / "conformance" / "run" / "_planted_for_test_layout.py"
    try:
        planted.write_text("from conformance.judge.harness import Case\n", encoding="utf-8")
        assert upward_imports(planted) == [
            "conformance/run/_planted_for_test_layout.py:1 imports conformance.judge.harness "
            "(conformance.judge, above conformance.run)"
        ]
    finally:
        planted.unlink(missing_ok=True)


def is_test_module(module: str) -> bool:
    """A module of tests: the suite's (conformance.test_*) or the project's (tests.*)."""
    return module.startswith("tests.") or module.split(".")[-1].startswith("test_")


def imports_of_tests(path: Path) -> list[str]:
    """Where a product module (not a test) imports a test module: tables a tool reads live in
    conformance.judge, not beside the tests that run them."""
    if is_test_module(module_name(path)) or module_name(path).startswith("perf"):
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for line, imported in imported_modules(tree)
        if is_test_module(imported)
    ]


def test_no_product_module_imports_a_test_module():
    problems = [problem for path in project_modules() for problem in imports_of_tests(path)]
    assert not problems, "\n".join(problems)


def test_the_test_import_scan_sees_a_planted_import():
    planted = ROOT / "conformance" / "_planted_for_test_layout.py"
    try:
        planted.write_text("from conformance.test_gradients import BACKWARD_CASES\n")
        assert imports_of_tests(planted) == [
            "conformance/_planted_for_test_layout.py:1 imports conformance.test_gradients"
        ]
    finally:
        planted.unlink(missing_ok=True)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports, at any depth of its code (an import inside a
    function closes a circle as surely as one at the top); ``from package import name`` imports
    package.name where that is a module, else the package."""
    modules = {module_name(path): path for path in paths}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {
                    f"{node.module}.{alias.name}"
                    if f"{node.module}.{alias.name}" in modules
                    else node.module
                    for alias in node.names
                }
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports, as the modules around it (depth first, each circle once)."""
    circles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                circles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported, [*path, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return circles


def test_no_modules_import_each_other():
    """Two modules that import each other (one of them inside a function, to get past Python's
    own refusal) belong apart: what both need goes one floor down."""
    judge_side = [p for p in project_modules() if not module_name(p).startswith("tests")]
    circles = import_circles(import_graph(judge_side))
    assert not circles, "\n".join(" -> ".join(circle) for circle in circles)


def test_the_circle_scan_sees_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c", "a"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def layout_rows() -> list[tuple[str, str]]:
    """(path column, description) of docs/layout.md's table."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            rows.append((cells[0], cells[1]))
    return rows


def test_the_layout_table_matches_the_tree():
    rows = layout_rows()
    named = [token for path, _ in rows for token in path.split("`")[1::2] if "/" in token]
    missing = [token for token in named if not list(ROOT.glob(token.rstrip("/")))]
    assert not missing, f"docs/layout.md's table names what the tree lacks: {missing}"
    table = " ".join(f"{path} {what}" for path, what in rows)
    unnamed = [
        str(module.relative_to(ROOT))
        for folder in ("conformance/run", "conformance/judge", "conformance/report")
        for module in sorted((ROOT / folder).glob("*.py"))
        if module.name != "__init__.py" and f"`{module.name}`" not in table
    ]
    assert not unnamed, f"modules docs/layout.md's table does not mention: {unnamed}"
