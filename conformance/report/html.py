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

from conformance.judge.tolerance import describe_fraction
from conformance.run.ledger import MATHEMATICS, ClaimVerdict, RowVerdict

HEAT_MAPS_SHOWN = 4
HOW_OBTAINED = {"probe": "recovered through the probe", "exposed": "as it exposes them"}


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


WEIGHTS_FIGURE = "causal attention weights/"  # + the case: "square" or "Tq<Tk"
VISIBLE_DIFFERENCE = 1e-3  # a weight difference a heat map shows: below it, the square case


def heat_maps(report: dict, recorded: dict[str, dict]) -> list[tuple[str, str, str, dict]]:
    """(name, verdict, case, recorded weights) for up to HEAT_MAPS_SHOWN implementations whose
    tests recorded their causal weights, those that fail first, each at the case that shows its
    bug (where its weights differ most from the truth's: Tq < Tk for a top-left mask), a
    conforming one at the square case."""
    shown = []
    for subject in report["subjects"]:
        cases = {
            name.removeprefix(WEIGHTS_FIGURE): data
            for name, data in recorded.get(subject["name"], {}).items()
            if name.startswith(WEIGHTS_FIGURE)
        }
        if not cases:
            continue
        case = "square" if "square" in cases else next(iter(cases))
        if subject["verdict"] == RowVerdict.FAILS:
            worst = max(cases, key=lambda c: cases[c]["largest difference"])
            if not cases[worst]["largest difference"] <= VISIBLE_DIFFERENCE:
                case = worst
        shown.append((subject["name"], subject["verdict"], case, cases[case]))
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

    for name, verdict, case, weights in heat_maps(report, recorded):
        plots.append(heat_map_figure(plt, name, verdict, case, weights))

    bars = worst_fractions(report)
    if bars:
        fig, ax = plt.subplots(figsize=(5.5, 0.5 + 0.4 * len(bars)))
        names, values = zip(*bars, strict=True)
        finite = [v for v in values if math.isfinite(v)]
        # inf and NaN cannot be drawn: their bars run to the edge and say what they are
        edge = max([*finite, 1.0]) * 10
        lengths = [v if math.isfinite(v) else edge for v in values]
        colors = ["tab:red" if not v <= 1 else "tab:blue" for v in values]  # NaN: red
        for bar, value in zip(ax.barh(names, lengths, color=colors), values, strict=True):
            bar.set_hatch("" if math.isfinite(value) else "//")
        for row, value in enumerate(values):
            if not math.isfinite(value):
                ax.text(edge, row, f" {value}", va="center", ha="left", fontweight="bold")
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        if max(lengths) > 10:
            ax.set_xscale("log")
        ax.set_xlabel("worst error / tolerance budget (<= 1 passes; inf and nan at the edge)")
        plots.append(("Each implementation's worst error as a fraction of its budget", _png(fig)))
        plt.close(fig)
    return plots


def heat_map_figure(plt, name: str, verdict: str, case: str, weights: dict) -> tuple[str, str]:
    """The implementation's weights beside the truth's, on one colour scale."""
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.6), sharey=True)
    for ax, (title, data) in zip(
        axes, ((name, weights["weights"]), ("the truth", weights["truth"])), strict=True
    ):
        image = ax.imshow(
            np.array(data, dtype=float), cmap="viridis", vmin=0, vmax=1, aspect="auto"
        )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key j")
    axes[0].set_ylabel("query i")
    fig.colorbar(image, ax=axes)
    caption = (
        f"Causal attention weights of {name} ({verdict}, {weights['dtype']}, {case}), "
        + HOW_OBTAINED.get(weights["source"], weights["source"])
        + f", beside the truth's: largest difference {weights['largest difference']:.3g}"
    )
    figure = (caption, _png(fig))
    plt.close(fig)
    return figure


def worst_fractions(report: dict) -> list[tuple[str, float]]:
    """(name, its worst error / budget over its claims) for each subject that measured one;
    inf and NaN kept (a NaN wins: it is never hidden behind a finite value)."""
    bars = []
    for subject in report["subjects"]:
        fractions = [
            e["worst_budget_fraction"]
            for e in subject["claims"].values()
            if e.get("worst_budget_fraction") is not None
        ]
        if fractions:
            nan = [f for f in fractions if math.isnan(f)]
            bars.append((subject["name"], nan[0] if nan else max(fractions)))
    return bars


VERDICT_CLASS = {
    ClaimVerdict.MET: "met",
    ClaimVerdict.FAILED: "failed",
    ClaimVerdict.UNMET: "unmet",
    ClaimVerdict.NOT_CHECKED: "skip",
}


def matrix_table(report: dict) -> str:
    """The claim x implementation matrix as a table coloured by verdict, failed claims first,
    with the worst error as a fraction of the budget where the claim measures one."""
    subjects = [s for s in report["subjects"] if s["verdict"] != RowVerdict.NOT_RUN]
    claims: list[str] = []
    for subject in subjects:
        claims += [c for c in subject["claims"] if c not in claims]
    failing = {c for s in subjects for c, e in s["claims"].items() if e["verdict"] == "FAILED"}
    claims.sort(key=lambda c: c not in failing)
    head = "".join(f"<th>{html.escape(s['name'])}</th>" for s in subjects)
    rows = []
    for claim in claims:
        cells = []
        for subject in subjects:
            entry = subject["claims"].get(claim)
            if entry is None:
                cells.append("<td>-</td>")
                continue
            text = html.escape(str(entry["verdict"]))
            if entry.get("worst_budget_fraction") is not None:
                text += f" <small>{describe_fraction(entry['worst_budget_fraction'])}</small>"
            cells.append(f"<td class='{VERDICT_CLASS[entry['verdict']]}'>{text}</td>")
        rows.append(f"<tr><th>{html.escape(claim)}</th>{''.join(cells)}</tr>")
    return f"<table class='matrix'><tr><th>claim</th>{head}</tr>{''.join(rows)}</table>"


def failures_section(report: dict) -> str:
    """Each failed claim of each implementation: its message, its diagnosis, its reproducer."""
    parts = []
    for subject in report["subjects"]:
        failed = [
            (claim, entry)
            for claim, entry in subject["claims"].items()
            if entry["verdict"] == ClaimVerdict.FAILED
        ]
        if not failed:
            continue
        parts.append(f"<h3>{html.escape(subject['name'])}</h3>")
        if subject.get("broken"):
            # Every claim failed the same way: said once, with one reproducer.
            reproducer = next(
                (e["first_failure"]["reproducer"] for _, e in failed
                 if (e.get("first_failure") or {}).get("reproducer")),
                None,
            )  # fmt: skip
            parts.append(
                f"<p class='failed'>Broken at its first call: {html.escape(subject['broken'])}"
                f"</p><p>{len(failed)} claims failed: "
                + html.escape(", ".join(claim for claim, _ in failed))
                + "</p>"
                + (f"<p>Reproduce:</p><pre>{html.escape(reproducer)}</pre>" if reproducer else "")
            )
            continue
        for claim, entry in failed:
            failure = entry.get("first_failure") or {}
            diagnosis = "".join(
                f"<li><b>{html.escape(d['name'])}</b>: {html.escape(d['text'])}"
                + (f" <i>(usually: {html.escape(d['hint'])})</i>" if d.get("hint") else "")
                + f" &mdash; {describe_fraction(d['fraction_of_budget'])} in "
                f"<code>{html.escape(d['test'])}</code></li>"
                for d in entry.get("diagnosis") or []
            )
            parts.append(
                f"<div class='claim'><h4>{html.escape(claim)} ({html.escape(entry['level'])}): "
                f"{entry['failed']} failing test(s)</h4>"
                f"<pre>{html.escape(failure.get('message', ''))}</pre>"
                + (f"<p>Diagnosis:</p><ul>{diagnosis}</ul>" if diagnosis else "")
                + (
                    f"<p>Reproduce:</p><pre>{html.escape(failure['reproducer'])}</pre>"
                    if failure.get("reproducer")
                    else ""
                )
                + "</div>"
            )
    return "".join(parts) or "<p>No claim failed.</p>"


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
    matrix = matrix_table(report)
    verdicts = ", ".join(
        f"{html.escape(s['name'])}: <b>{html.escape(s['verdict'])}</b>" for s in report["subjects"]
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnspec conformance report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 80em; }}
pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 0.2em 1em; }}
table.matrix td, table.matrix th {{ border: 1px solid #ddd; font-size: 90%; }}
td.met {{ background: #d9f2d9; }} td.failed, p.failed {{ background: #f8c8c8; font-weight: bold; }}
td.unmet {{ background: #fde6c4; }} td.skip {{ background: #eee; color: #666; }}
div.claim {{ border-left: 4px solid #c33; padding-left: 1em; margin-bottom: 1em; }}
figure {{ display: inline-block; margin: 1em; vertical-align: top; }}
.note {{ color: #a60; }}
</style></head><body>
<h1>attnspec conformance report</h1>
<p>{verdicts}</p>
<p>Exit status {report["exit_status"]}; schema {html.escape(report["schema"])}.</p>
<h2>Claim x implementation</h2>
{matrix}
<h2>Failed claims</h2>
{failures_section(report)}
<h2>Figures</h2>
{plots}
<h2>Environment</h2>
<table>{rows}</table>
</body></html>
"""


def write_html(path: Path, report: dict, recorded: dict[str, dict]) -> None:
    path.write_text(render_html(report, recorded), encoding="utf-8")
