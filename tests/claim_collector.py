"""A pytest plugin (``-p tests.claim_collector``) that writes each collected conformance test's
claims, as the suite reads them (``claims_of``), to the JSON file named by $ATTNSPEC_CLAIMS_OUT,
for the traceability meta-test."""

from __future__ import annotations

import json
import os

from conformance.run.collection import claims_of


def pytest_collection_finish(session) -> None:
    claims = {item.nodeid: claims_of(item) for item in session.items}
    with open(os.environ["ATTNSPEC_CLAIMS_OUT"], "w", encoding="utf-8") as out:
        json.dump(claims, out)
