"""What a bench reports: a table within 100 columns, JSON under a versioned schema,
pytest-benchmark's JSON (so that ``pytest-benchmark compare`` reads saved runs), and with a
sweep, throughput against T as a PNG and in an HTML page.

Schema ``attnspec-bench/1``::

    {
      "schema": "attnspec-bench/1",
      "exit_status": 0 | 1 | 3,            # attnspec bench's (0 passes, 1 FAILS or a problem,
                                           # 3 inconclusive)
      "environment": {"python": ..., "platform": ..., "started": ISO time},
      "machine": {"kind": "cpu" | GPU name, "flops_per_second": x, "bytes_per_second": x,
                  "source": "...",          # measured now (CPU) or rated (GPU), and how
                  "clocks": {...} | null},  # a GPU's clocks as nvidia-smi reported them
      "settings": {"dtype": ..., "kv_cache_query": null | dtype,  # q's, for an FP8 KV cache
                   "causal": true, "pass": "forward" | "forward+backward",
                   "rounds": n, "warm": false, "settle_seconds": x, "check_share": x},
      "results": [
        {"shape": {"name": ..., "dims": [B, H, Hkv, Tq, Tk, D], "keywords": {...},
                   "source": "..."},
         "pass": "forward" | "forward+backward",  # what was timed: attention, or vjp
         "implementations": [              # the subject first, then its baseline
           {"name": ..., "dtype": ...,      # the side's (an FP8 subject's baseline: bfloat16)
            "median_seconds": x, "min_seconds": x, "max_seconds": x,
            "seconds": [x, ...],           # the worker's, each timed call
            "flops": x, "flops_per_second": x, "bytes": x,
            "roofline_seconds": x,         # the least time the machine allows the call
            "fraction_of_roofline": x,     # roofline_seconds / median_seconds
            "credible": true, "why_not": null | "...",
            "answers_checked": n, "worst_budget_fraction": x,
            "machine_load": {"measured": true,  # what other processes ran during its calls
                             "others_cores": x, "others_cores_shown": x,  # less 3 errors
                             "allowed_cores": x, "cores": n, "wall_seconds": x}}],
         "ratio": null | {"median": x, "low": x, "high": x, "confidence": 0.95},
         "max_ratio": null | x,
         "verdict": null | "passes" | "FAILS" | "inconclusive" | "not credible"}],
      "problems": ["..."]                  # wrong answers, shapes not timed, and why
    }

A field is only ever added to this schema; a change in meaning bumps the version.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import platform
import statistics
from pathlib import Path

from conformance.bench.measure import ShapeResult, SideResult
from conformance.bench.roofline import Machine
from conformance.report.tables import text_table

SCHEMA = "attnspec-bench/1"


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def rate(flops_per_second: float) -> str:
    if flops_per_second >= 1e12:
        return f"{flops_per_second / 1e12:.1f} TFLOP/s"
    return f"{flops_per_second / 1e9:.1f} GFLOP/s"


def side_row(shape: str, side: SideResult, dtype: str) -> tuple[str, ...]:
    """A side's row; its name says its dtype where it is not the bench's ``dtype`` (an FP8
    subject's baseline, timed in bfloat16)."""
    low, high = min(side.seconds), max(side.seconds)
    spread = f"{milliseconds(low)}-{milliseconds(high)}"
    name = side.name if side.dtype in ("", dtype) else f"{side.name} ({side.dtype})"
    if not side.credible:
        return (shape, name, milliseconds(side.median), spread, "-", "-", "NOT CREDIBLE")
    return (
        shape, name, milliseconds(side.median), spread, rate(side.flops_per_second),
        f"{side.fraction_of_bound:.2f}", "",
    )  # fmt: skip


def ratio_row(result: ShapeResult) -> tuple[str, ...]:
    if result.ratio is None:
        note = "no ratio: a side is not credible" if len(result.sides) > 1 else ""
        return ("", "ratio", "", "", "", "", note)
    r = result.ratio
    interval = f"{r.median:.2f} [{r.low:.2f}, {r.high:.2f}]"
    gate = "" if result.max_ratio is None else f" vs <= {result.max_ratio:g}: {result.verdict}"
    return ("", "ratio", interval, f"{r.confidence:.0%} interval", "", "", gate.strip())


def table_lines(results: list[ShapeResult]) -> list[str]:
    header = ("shape", "implementation", "median ms", "min-max ms", "throughput", "roofline", "")
    rows: list[tuple[str, ...]] = [header]
    for result in results:
        label = result.shape.name + (" fwd+bwd" if result.backward else "")
        for n, side in enumerate(result.sides):
            rows.append(side_row(label if n == 0 else "", side, result.dtype))
        if len(result.sides) > 1:
            rows.append(ratio_row(result))
    return text_table(rows)


def side_json(side: SideResult) -> dict:
    return {
        "name": side.name,
        "dtype": side.dtype,
        "median_seconds": side.median,
        "min_seconds": min(side.seconds),
        "max_seconds": max(side.seconds),
        "seconds": side.seconds,
        "flops": side.flops,
        "flops_per_second": side.flops_per_second,
        "bytes": side.bytes_moved,
        "roofline_seconds": side.bound_seconds,
        "fraction_of_roofline": side.fraction_of_bound,
        "credible": side.credible,
        "why_not": side.why_not,
        "answers_checked": side.checked,
        "worst_budget_fraction": side.worst_fraction,
        "machine_load": side.load.as_json(),
    }


def build_json(
    results: list[ShapeResult],
    machine: Machine,
    settings: dict,
    problems: list[str],
    exit_status: int,
    clocks: dict | None = None,
) -> dict:
    return {
        "schema": SCHEMA,
        "exit_status": exit_status,
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "started": settings.get("started"),
        },
        "machine": {
            "kind": machine.kind,
            "flops_per_second": machine.flops_per_second,
            "bytes_per_second": machine.bytes_per_second,
            "source": machine.source,
            "clocks": clocks,
        },
        "settings": {k: v for k, v in settings.items() if k != "started"},
        "results": [
            {
                "shape": {
                    "name": r.shape.name,
                    "dims": list(r.shape.dims),
                    "keywords": r.shape.keywords,
                    "source": r.shape.source,
                },
                "pass": r.timed_pass,
                "implementations": [side_json(side) for side in r.sides],
                "ratio": None if r.ratio is None else vars(r.ratio),
                "max_ratio": r.max_ratio,
                "verdict": r.verdict,
            }
            for r in results
        ],
        "problems": problems,
    }


def _stats(seconds: list[float]) -> dict:
    """pytest-benchmark's statistics of one benchmark."""
    ordered = sorted(seconds)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else (ordered[0],) * 3
    iqr = q3 - q1
    mean = statistics.fmean(ordered)
    stddev = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
    return {
        "min": ordered[0], "max": ordered[-1], "mean": mean, "stddev": stddev,
        "rounds": len(ordered), "median": statistics.median(ordered), "iqr": iqr, "q1": q1,
        "q3": q3,
        "iqr_outliers": sum(1 for s in ordered if not q1 - 1.5 * iqr <= s <= q3 + 1.5 * iqr),
        "stddev_outliers": sum(1 for s in ordered if abs(s - mean) > stddev),
        "outliers": "0;0", "ld15iqr": ordered[0], "hd15iqr": ordered[-1], "ops": 1.0 / mean,
        "total": sum(ordered), "iterations": 1, "data": list(seconds),
    }  # fmt: skip


def build_pytest_benchmark_json(results: list[ShapeResult], settings: dict) -> dict:
    """The layout pytest-benchmark saves (--benchmark-json): one benchmark per implementation
    and shape, grouped by shape, so that ``pytest-benchmark compare`` reads it."""
    benchmarks = []
    for result in results:
        for side in result.sides:
            if not side.credible:
                continue
            name = f"bench[{side.name}-{result.shape.name}-{result.dtype}]"
            benchmarks.append(
                {
                    "group": f"{result.shape.name} {result.dtype}",
                    "name": name,
                    "fullname": f"attnspec::{name}",
                    "params": {"implementation": side.name, "shape": result.shape.name},
                    "param": f"{side.name}-{result.shape.name}",
                    "extra_info": {"flops_per_second": side.flops_per_second},
                    "options": {"disable_gc": False, "timer": "worker", "min_rounds": 1,
                                "max_time": 0, "min_time": 0, "warmup": False},
                    "stats": _stats(side.seconds),
                }
            )  # fmt: skip
    return {
        "machine_info": {
            "node": platform.node(), "processor": platform.processor(),
            "machine": platform.machine(), "python_version": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "release": platform.release(),
            "system": platform.system(), "cpu": {},
        },
        "commit_info": {},
        "benchmarks": benchmarks,
        "datetime": settings.get("started") or datetime.datetime.now(datetime.UTC).isoformat(),
        "version": "5.1.0",
    }  # fmt: skip


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def write_sweep_plot(results: list[ShapeResult], png: Path, html_path: Path | None) -> str | None:
    """Throughput against T for each implementation (FlashAttention's figure), as a PNG and,
    where asked, an HTML page holding it and the table; None, or why there is no plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'attnspec[report]')"
    series: dict[str, list[tuple[int, float]]] = {}
    for result in results:
        for side in result.sides:
            if side.credible:
                series.setdefault(side.name, []).append((result.shape.tq, side.flops_per_second))
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, points in series.items():
        lengths, rates = zip(*sorted(points), strict=True)
        axes.plot(lengths, [r / 1e9 for r in rates], marker="o", label=name)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("sequence length T")
    axes.set_ylabel("GFLOP/s (4·B·H·T²·D, halved when causal)")
    shape = results[0].shape
    axes.set_title(f"B={shape.batch} H={shape.heads} D={shape.head_dim} {results[0].dtype}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)
    plt.close(figure)
    if html_path is not None:
        image = base64.b64encode(png.read_bytes()).decode("ascii")
        rows = html.escape("\n".join(table_lines(results)))
        html_path.write_text(
            "<!doctype html><meta charset='utf-8'><title>attnspec bench</title>"
            "<h1>attnspec bench: throughput against T</h1>"
            f"<img src='data:image/png;base64,{image}'>"
            f"<pre>{rows}</pre>\n",
            encoding="utf-8",
        )
    return None
