"""The ecosystem's adapters (impls/ecosystem), their findings and the table made from them.

An adapter is tested like a built-in: it resolves by name and declares itself, says why it cannot
run where its library is missing, and calls its library right: at Tq < Tk the bridged adapter
matches the oracle and the naive one, with the library's top-left causal mask, does not.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from conformance.report import ecosystem
from conformance.run.worker_clients import open_clients
from impls.ecosystem.findings import FINDINGS
from impls.registry import ECOSYSTEM, resolve
from spec.dtypes import round_to
from spec.formula import reference_attention


@pytest.mark.parametrize("name", list(ECOSYSTEM))
def test_every_adapter_resolves_and_declares_itself_or_says_why_not(name):
    impl = resolve(name)
    assert impl.name == name
    assert impl.capabilities.dtypes
    reason = impl.unavailable_reason()
    assert reason is None or "pip install" in reason or "no usable device" in reason, reason


def test_the_tox_env_runs_every_adapter():
    import configparser
    from pathlib import Path

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).resolve().parents[1] / "tox.ini")
    assert tox["ecosystem"]["adapters"].strip().split(",") == list(ECOSYSTEM)


PAIRS = sorted({name.rsplit("_", 1)[0] for name in ECOSYSTEM if name.endswith("_naive")})


@pytest.mark.parametrize("library_call", PAIRS)
def test_the_bridged_adapter_sees_the_cache_and_the_naive_one_does_not(library_call):
    """A chunk of 3 queries against 7 keys: the last query sits at position 6 and sees all 7.
    Each adapter runs in a worker of its own, as in a run (Keras picks one backend a process)."""
    clients = open_clients([f"{library_call}_naive", f"{library_call}_bridged"])
    try:
        for client in clients:
            reason = client.unavailable_reason()
            if reason:
                pytest.skip(f"{client.name} cannot run here: {reason}")
        rng = np.random.default_rng(0)
        q, k, v = (round_to(rng.standard_normal((1, 2, t, 8)), "float32") for t in (3, 7, 7))
        truth = reference_attention(q, k, v, causal=True)

        def error(client):
            native = [client.from_numpy(x, "float32") for x in (q, k, v)]
            return np.abs(client.to_numpy(client.attention(*native, causal=True)) - truth).max()

        naive, bridged = clients
        assert error(bridged) < 1e-5
        assert error(naive) > 0.1
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize(
    "finding", FINDINGS, ids=[f"{n}-{f.library}" for n, f in enumerate(FINDINGS, 1)]
)
def test_every_findings_reproducer_still_shows_it(finding):
    if importlib.util.find_spec(finding.library) is None:  # keras must not be imported here
        pytest.skip(f"{finding.library} is not installed")
    run = subprocess.run(
        [sys.executable, "-c", finding.reproducer], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"{finding.summary}\n{run.stdout[-2000:]}{run.stderr[-3000:]}"


def test_every_finding_names_adapters_that_exist_and_tests_it_explains():
    for finding in FINDINGS:
        assert finding.adapters, finding.summary
        assert finding.tests, finding.summary
        unknown = set(finding.adapters) - set(ECOSYSTEM)
        assert not unknown, (finding.summary, unknown)


def report_with(tmp_path, claims: dict[str, tuple[str, str]]):
    """A report in which the adapter torch_sdpa_naive has ``claims`` {id: (verdict, test)}."""
    subject = {
        "name": "torch_sdpa_naive",
        "selector": "torch_sdpa_naive",
        "version": "torch 0",
        "verdict": "FAILS",
        "skip_reason": None,
        "conventions": {"batch_axes": "broadcast"},
        "worst_budget_fraction_by_dtype": {"float32": 0.25},
        "claims": {
            claim: {
                "verdict": verdict,
                "level": "MUST",
                "failing_tests": [] if verdict == "met" else [f"conformance/x.py::{test}"],
            }
            for claim, (verdict, test) in claims.items()
        },
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": "attnspec-report/1", "subjects": [subject]}))
    return path


def test_the_table_refuses_a_failure_no_finding_explains(tmp_path, capsys):
    path = report_with(
        tmp_path,
        {
            "OUT-FORMULA": ("met", ""),
            "OUT-AFFINE": ("FAILED", "test_affine[torch_sdpa_naive-float32-2.0]"),
        },
    )
    page = tmp_path / "ecosystem.md"
    assert ecosystem.main([str(path), "--write", str(page)]) == ecosystem.NOT_EXPLAINED
    assert "torch_sdpa_naive: OUT-AFFINE test_affine[float32-2.0]" in capsys.readouterr().err
    assert not page.exists()


def test_the_table_shows_each_group_and_the_findings_that_explain_it(tmp_path):
    number = next(n for n, f in enumerate(FINDINGS, 1) if "torch_sdpa_naive" in f.adapters)
    test = "test_formula_with_fewer_queries_than_keys[torch_sdpa_naive-float32-3x799-causal]"
    assert FINDINGS[number - 1].explains("torch_sdpa_naive", f"conformance/x.py::{test}")
    path = report_with(tmp_path, {"SCALE-FORMULA": ("met", ""), "OUT-FORMULA": ("FAILED", test)})
    page = tmp_path / "ecosystem.md"
    assert ecosystem.main([str(path), "--write", str(page)]) == 0
    row = next(line for line in page.read_text().splitlines() if "`torch_sdpa_naive`" in line)
    assert f"FAIL [{number}]" in row
    assert "pass" in row
    assert "f32 0.25" in row
