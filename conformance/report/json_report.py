"""The machine-readable report: one JSON document per run, under a versioned schema.

Schema ``attnspec-report/2``::

    {
      "schema": "attnspec-report/2",
      "exit_status": 0,                      # pytest's exit status of the run
      "environment": {"python": ..., "platform": ..., "seed": ..., "hypothesis_profile": ...,
                      "env": {NAME: value, ...}},
      "workers": {                           # what every worker was given
        "sandbox": "full" | "partial (...)" | "none (...)",  # as the workers were confined
        "memory_bytes": null | n,            # their memory bound (null: none)
        "memory_bound": null | "...",        # how it holds (RLIMIT_DATA, and the judge's watch)
        "disk_bytes": null | n,              # their scratch's tmpfs size (null: no disk bound)
        "tasks": null | n,                   # their live processes and threads (null: no bound)
        "namespaces": ["network", "ipc", "mount", "pid"],  # their own where the sandbox is on
        "impl_budget_seconds": null | x,     # what an implementation's calls may take in all
        "variables": [NAME or PATTERN],      # what a worker gets of the judge's environment
        "impl_paths": [DIR]},                # first on the workers' sys.path, and only there
      "subjects": [                          # "(mathematics)" first, then each implementation
        {"name": ..., "selector": ...,       # what --impl takes to select it again (null: maths)
         "version": ..., "device": ..., "family": ..., "capabilities": ...,
         "sandbox": "full" | "partial (what is missing)" | "none (why)",  # how its worker ran
         "broken": null | "...",             # why its first call broke the contract
         "skip_reason": null | "...",        # why it could not run here
         "verdict": "conforms" | "FAILS" | "NOT RUN",
         "claims": {CLAIM_ID: {"level": "MUST" | "SHOULD" | "INFO",
                               "verdict": "met" | "FAILED" | "unmet" | "not checked",
                               "passed": n, "failed": n, "unmet": n, "skipped": n,
                               "worst_budget_fraction": null | x,  # error / tolerance budget,
                                                      # the largest in the claim's tests (<= 1 ok)
                               "failing_tests": [node ids], "skip_reasons": [...],
                               "first_failure": null | {"test": node id,
                                                        "message": "...",  # truncated
                                                        "reproducer": null | "python -m ..."},
                               "diagnosis": [         # failed or unmet claims: why (else [])
                                 {"kind": "mistake" | "where",
                                  "name": ...,      # spec.mistakes' name ("where", "pattern")
                                  "text": ...,      # what the mistake is, or where errors lie
                                  "hint": ...,      # mistakes only: where it comes from
                                  "test": node id,  # the evidence: the failing test
                                  "fraction_of_budget": x}]}},  # the output against the
                                                    # variant (mistake) or the truth (where)
         "conventions": {NAME: VALUE},       # the CONTRACT-ERRORS conventions it followed
         "regimes": {REGIME_ID: [node ids]}, # spec.regimes its calls drew, and the tests that did
         "worst_budget_fraction_by_dtype": {DTYPE: x}},  # over all its tests in that dtype
      ]
    }

A field is only ever added to this schema; a change in meaning bumps the version. Version 2
added "diagnosis" and "broken"; "workers" and "regimes" came later, within version 2.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

from conformance.judge.diagnosis import conclude, refuted_by
from conformance.run.ledger import MATHEMATICS, Ledger
from conformance.run.selection import Selected

SCHEMA = "attnspec-report/2"


def subject_entry(ledger: Ledger, name: str, selected: Selected | None) -> dict:
    claims = {}
    records = ledger.verdicts(name)
    refuted = refuted_by([finding for rec in records.values() for finding in rec.findings])
    for claim, rec in sorted(records.items()):
        claims[claim] = {
            "level": ledger.catalogue[claim].level if claim in ledger.catalogue else None,
            "verdict": rec.verdict,
            "passed": rec.passed,
            "failed": rec.failed,
            "unmet": rec.unmet,
            "skipped": rec.skipped,
            "worst_budget_fraction": rec.worst_budget_fraction,
            "failing_tests": list(rec.failing_tests),
            "first_failure": asdict(rec.first_failure) if rec.first_failure else None,
            "diagnosis": conclude(rec.findings, refuted),
            "skip_reasons": sorted(rec.skip_reasons),
        }
    entry = {"name": name, "selector": None, "verdict": ledger.row_verdict(name)}
    if selected is not None:
        client = selected.client
        entry.update(
            selector=selected.selector,
            version=client.version(),
            device=client.device,
            family=client.family,
            capabilities=client.capabilities.describe(),
            sandbox=client.sandbox,
            broken=ledger.broken.get(name),
            skip_reason=selected.skip_reason,
        )
    entry["conventions"] = ledger.conventions_followed(name)
    entry["regimes"] = {
        regime: sorted(tests) for regime, tests in sorted(ledger.regimes.get(name, {}).items())
    }
    entry["worst_budget_fraction_by_dtype"] = dict(sorted(ledger.budget_fractions[name].items()))
    entry["claims"] = claims
    return entry


def build_report(
    ledger: Ledger,
    selection: list[Selected],
    *,
    seed: int,
    hypothesis_profile: str | None,
    exit_status: int,
    reported_env: tuple[str, ...],
    workers: dict | None = None,
) -> dict:
    by_name = {s.client.name: s for s in selection}
    names = ([MATHEMATICS] if ledger.verdicts(MATHEMATICS) else []) + list(by_name)
    return {
        "schema": SCHEMA,
        "exit_status": int(exit_status),
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "seed": seed,
            "hypothesis_profile": hypothesis_profile,
            "env": {name: os.environ[name] for name in reported_env if name in os.environ},
        },
        "workers": workers or {},
        "subjects": [subject_entry(ledger, name, by_name.get(name)) for name in names],
    }


def write_report(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n", encoding="utf-8")
