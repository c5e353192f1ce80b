"""The self-contained HTML report: the matrix, the environment, and the figures that the run's
tests recorded (the document's measurements, each implementation's causal weights).

It renders data only: nothing is computed and no implementation is called here. Plots are PNGs
drawn with matplotlib and embedded as data URIs, so the file travels alone (a pull-request
attachment, a CI artefact). Without matplotlib the report still renders, with a note where the
plots would be.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import numpy as np

from conformance.report.matrix import matrix_lines
from conformance.run.ledger import MATHEMATICS, RowVerdict

HEAT_MAPS_SHOWN = 4
HOW_OBTAINED = {"probe": "recovered through the probe", "exposed": "as it exposes them"}


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def heat_maps(report: dict, recorded: dict[str, dict]) -> list[tuple[str, str, dict]]:
    """(name, verdict, recorded weights) for up to HEAT_MAPS_SHOWN implementations whose tests
    recorded their causal weights, those that fail first: the picture a reviewer needs is the
    failing one."""
    shown = [
        (s["name"], s["verdict"], recorded[s["name"]]["causal attention weights"])
        for s in report["subjects"]
        if "causal attention weights" in recorded.get(s["name"], {})
    ]
    shown.sort(key=lambda entry: entry[1] != RowVerdict.FAILS)
    return shown[:HEAT_MAPS_SHOWN]


def recorded_series(recorded: dict[str, object], prefix: str) -> tuple[list[int], list[float]]:
    """(d, value) pairs of the figures named ``prefix/d``, in order of d."""
    points = sorted(
        (int(name.rsplit("/", 1)[1]), value)
        for name, value in recorded.items()
        if name.rsplit("/", 1)[0] == prefix
    )
    return [d for d, _ in points], [value for _, value in points]


def figures(report: dict, recorded: dict[str, dict]) -> list[tuple[str, str]]:
    """(caption, base64 PNG) for each plot of what the run recorded (row -> figure name ->
    data). Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    plots = []
    document = recorded.get(MATHEMATICS, {})
    dims, stds = recorded_series(document, "dot-product std")
    if dims:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.loglog(dims, stds, "o-", label="measured std of q.k")
        ax.loglog(dims, [math.sqrt(d) for d in dims], "--", label="sqrt(d)")
        unit_dims, unit_stds = recorded_series(document, "unit-norm dot-product std")
        if unit_dims:
            ax.loglog(unit_dims, unit_stds, "s-", label="unit vectors")
        ax.set_xlabel("d")
        ax.set_ylabel("std of the dot product")
        ax.legend()
        plots.append(("Dot-product magnitude against d (DOT-GROWTH, with its erratum)", _png(fig)))
        plt.close(fig)

    largest = document.get("largest weight")
    if largest:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.semilogx(largest["d_k"], largest["unscaled"], "o-", label="unscaled")
        ax.semilogx(largest["d_k"], largest["scaled"], "s-", label="1/sqrt(d_k)")
        ax.set_xlabel("d_k")
        ax.set_ylabel("mean largest attention weight")
        ax.set_ylim(0, 1.05)
        ax.legend()
        plots.append(("Largest attention weight against d_k (SOFTMAX-SATURATION)", _png(fig)))
        plt.close(fig)

    for name, verdict, recorded_map in heat_maps(report, recorded):
        fig, ax = plt.subplots(figsize=(4.2, 3.6))
        image = ax.imshow(np.array(recorded_map["weights"]), cmap="viridis")
        fig.colorbar(image, ax=ax)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        plots.append(
            (
                f"Causal attention weights of {name} ({verdict}, {recorded_map['dtype']}), "
                + HOW_OBTAINED.get(recorded_map["source"], recorded_map["source"]),
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


def render_html(report: dict, recorded: dict[str, dict]) -> str:
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
            for caption, data in figures(report, recorded)
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


def write_html(path: Path, report: dict, recorded: dict[str, dict]) -> None:
    path.write_text(render_html(report, recorded), encoding="utf-8")
