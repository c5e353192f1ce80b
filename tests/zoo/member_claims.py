"""A pytest plugin for the zoo's run in the project's tests: each member judged only on the claims
named for it, so that CI's zoo run checks the kill matrix's rows without the whole suite on every
mutant (the full matrix is ``python -m tests.zoo.kill_matrix``'s, and ``tox -e zoo``'s).

Loaded with ``-p tests.zoo.member_claims``; ``$ATTNSPEC_ZOO_CLAIMS`` names a JSON file mapping a
member's selector to the claim IDs its tests are kept for. A member the file does not name keeps
every test, and so do the tests of the document's mathematics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conformance.run.collection import claims_of, selected_of

ENV_VAR = "ATTNSPEC_ZOO_CLAIMS"


def load_claims(path: str) -> dict[str, frozenset[str]]:
    """{selector: claims} from the JSON file at ``path``."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise pytest.UsageError(
            f"${ENV_VAR}={path!r} is not a readable JSON file: {error}"
        ) from None
    if not isinstance(raw, dict) or not all(
        isinstance(claims, list) and all(isinstance(c, str) for c in claims)
        for claims in raw.values()
    ):
        raise pytest.UsageError(f"${ENV_VAR}={path!r} should map selectors to lists of claim IDs")
    return {selector: frozenset(claims) for selector, claims in raw.items()}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(ENV_VAR)
    if not path:
        raise pytest.UsageError(f"-p tests.zoo.member_claims needs ${ENV_VAR}")
    wanted = load_claims(path)
    keep, drop = [], []
    for item in items:
        selected = selected_of(item)
        claims = wanted.get(selected.selector) if selected is not None else None
        kept = claims is None or not claims.isdisjoint(claims_of(item))
        (keep if kept else drop).append(item)
    if drop:
        items[:] = keep
        config.hook.pytest_deselected(items=drop)
