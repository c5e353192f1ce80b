"""The self-contained HTML report: the matrix, the environment, and the document's figures.

Plots are PNGs drawn with matplotlib and embedded as data URIs, so the file travels alone (a
pull-request attachment, a CI artefact). Without matplotlib the report still renders, with a
note where the plots would be.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

from conformance.judge.harness import Case, Subject
from conformance.judge.measurements import dot_product_std, saturation
from conformance.judge.probe import recover_weights
from conformance.report.json_report import matrix_lines
from conformance.run.workers import (
    ImplementationBroke,
    ImplementationDied,
    ImplementationRaised,
    open_clients,
)
from impls.registry import RegistryError

HEAT_MAP_CASE = Case(batch=1, heads=1, tq=24, head_dim=16, dtype="float64")


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


HEAT_MAPS_SHOWN = 4


def _heat_map_sources(report: dict) -> list[tuple[str, str, np.ndarray]]:
    """(name, verdict, causal attention weights recovered through the probe) for up to
    HEAT_MAPS_SHOWN implementations that ran, those that fail first: the picture a reviewer
    needs is the failing one. Each is called in a worker of its own, as in the run."""
    ran = [s for s in report["subjects"] if s.get("selector") and s["verdict"] != "NOT RUN"]
    ran.sort(key=lambda s: s["verdict"] != "FAILS")
    maps = []
    for subject in ran[:HEAT_MAPS_SHOWN]:
        try:
            (client,) = open_clients([subject["selector"]])
        except RegistryError:
            continue
        try:
            if client.unavailable_reason():
                continue
            dtypes = client.capabilities.dtypes
            case = HEAT_MAP_CASE.with_(dtype="float64" if "float64" in dtypes else dtypes[0])
            probe = Subject(
                client, subject["selector"], seed=report["environment"]["seed"], test_id="map"
            )
            q, k, _ = probe.inputs(case, spread=2.0)
            try:
                weights = recover_weights(probe, case, q, k)[0, 0]
            except (ImplementationRaised, ImplementationBroke, ImplementationDied):
                continue
            maps.append((subject["name"], subject["verdict"], weights))
        finally:
            client.close()
    return maps


def figures(report: dict) -> list[tuple[str, str]]:
    """(caption, base64 PNG) for each plot. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    plots = []
    dims = [16, 64, 256, 1024, 4096]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.loglog(dims, [dot_product_std(d) for d in dims], "o-", label="measured std of q.k")
    ax.loglog(dims, [math.sqrt(d) for d in dims], "--", label="sqrt(d)")
    ax.loglog(dims, [dot_product_std(d, unit_norm=True) for d in dims], "s-", label="unit vectors")
    ax.set_xlabel("d")
    ax.set_ylabel("std of the dot product")
    ax.legend()
    plots.append(("Dot-product magnitude against d (DOT-GROWTH, with its erratum)", _png(fig)))
    plt.close(fig)

    d_ks = [16, 64, 256, 1024, 4096]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.semilogx(d_ks, [saturation(d, 1.0)[0] for d in d_ks], "o-", label="unscaled")
    ax.semilogx(d_ks, [saturation(d, 1 / math.sqrt(d))[0] for d in d_ks], "s-", label="1/sqrt(d_k)")
    ax.set_xlabel("d_k")
    ax.set_ylabel("mean largest attention weight")
    ax.set_ylim(0, 1.05)
    ax.legend()
    plots.append(("Largest attention weight against d_k (SOFTMAX-SATURATION)", _png(fig)))
    plt.close(fig)

    for name, verdict, weights in _heat_map_sources(report):
        fig, ax = plt.subplots(figsize=(4.2, 3.6))
        image = ax.imshow(weights, cmap="viridis")
        fig.colorbar(image, ax=ax)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        plots.append(
            (
                f"Causal attention weights of {name} ({verdict}), recovered through the probe",
                _png(fig),
            )
        )
        plt.close(fig)

    bars = [
        (subject["name"], max(fractions))
        for subject in report["subjects"]
        if (
            fractions := [
                e["worst_budget_fraction"]
                for e in subject["claims"].values()
                if e.get("worst_budget_fraction") is not None
            ]
        )
    ]
    if bars:
        fig, ax = plt.subplots(figsize=(5, 0.5 + 0.4 * len(bars)))
        names, values = zip(*bars, strict=True)
        ax.barh(names, values, color=["tab:red" if v > 1 else "tab:blue" for v in values])
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        if max(values) > 10:
            ax.set_xscale("log")
        ax.set_xlabel("worst error / tolerance budget (<= 1 passes)")
        plots.append(("Each implementation's worst error as a fraction of its budget", _png(fig)))
        plt.close(fig)
    return plots


def render_html(report: dict) -> str:
    environment = report["environment"]
    rows = "".join(
        f"<tr><th>{html.escape(str(key))}</th><td>{html.escape(str(value))}</td></tr>"
        for key, value in [
            ("python", environment["python"]),
            ("platform", environment["platform"]),
            ("seed", environment["seed"]),
            ("hypothesis profile", environment["hypothesis_profile"]),
            *environment["env"].items(),
            *(
                (s["name"], f"{s.get('version', '')} on {s.get('device', '')}")
                for s in report["subjects"]
                if s.get("selector")
            ),
        ]
    )
    try:
        plots = "".join(
            f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
            for caption, data in figures(report)
        )
    except ImportError:
        plots = "<p class='note'>Plots need matplotlib (<code>pip install matplotlib</code>).</p>"
    matrix = html.escape("\n".join(matrix_lines(report)))
    verdicts = ", ".join(
        f"{html.escape(s['name'])}: <b>{html.escape(s['verdict'])}</b>" for s in report["subjects"]
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnspec conformance report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 80em; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 0.2em 1em; }}
figure {{ display: inline-block; margin: 1em; vertical-align: top; }}
.note {{ color: #a60; }}
</style></head><body>
<h1>attnspec conformance report</h1>
<p>{verdicts}</p>
<p>Exit status {report["exit_status"]}; schema {html.escape(report["schema"])}.</p>
<h2>Claim x implementation</h2>
<pre>{matrix}</pre>
<h2>Figures</h2>
{plots}
<h2>Environment</h2>
<table>{rows}</table>
</body></html>
"""


def write_html(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report), encoding="utf-8")
