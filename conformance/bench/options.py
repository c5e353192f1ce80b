"""``attnspec bench`` through pytest: its options, in one group, for

    python -m pytest --pyargs conformance.bench.in_pytest --bench-impl X [--bench-...]

The same measurement as the command (conformance.bench.cli.run_bench), with the same parsers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from conformance.bench.cli import DEFAULT_ROUNDS, positive_int, positive_ratio
from conformance.bench.shapes import NAMED_SHAPES, parse_shape
from spec.dtypes import DTYPES


def add_bench_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnspec bench", "attnspec bench (conformance.bench.in_pytest)")
    group.addoption(
        "--bench-impl",
        metavar="SELECTOR",
        help="what conformance.bench.in_pytest times (default: none; the test says so and "
        "fails, unless --bench-gates names what to time)",
    )
    group.addoption(
        "--bench-baseline",
        metavar="SELECTOR",
        help="what it is compared with (default: torch_sdpa on the CPU, "
        "torch_sdpa_cuda on a GPU; 'none': no baseline)",
    )
    group.addoption(
        "--bench-shape",
        action="append",
        type=parse_shape,
        metavar="NAME|B,H,Hkv,Tq,Tk,D",
        help=f"a named shape ({', '.join(NAMED_SHAPES)}) or six integers (default: andrea)",
    )
    group.addoption(
        "--bench-dtype",
        choices=DTYPES,
        metavar="DTYPE",
        help="default: float32 on the CPU, bfloat16 on a GPU",
    )
    group.addoption(
        "--bench-max-ratio",
        type=positive_ratio,
        metavar="R",
        help="the gate on the median time's ratio to the baseline's (default: none)",
    )
    group.addoption(
        "--bench-gates",
        type=Path,
        metavar="FILE",
        help="gates in perf/gates.toml's schema, measured as attnspec bench --gates does "
        "(default: none)",
    )
    group.addoption(
        "--bench-rounds",
        type=positive_int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=f"timed calls of each side per shape (default {DEFAULT_ROUNDS})",
    )


def is_bench_run(config: pytest.Config) -> bool:
    """Whether this pytest run is a bench (conformance.bench.in_pytest), which opens its own
    workers and judges nothing."""
    return any(config.getoption(name, None) is not None for name in ("bench_impl", "bench_gates"))


def bench_namespace(config: pytest.Config) -> argparse.Namespace:
    """attnspec bench's options, as the pytest options give them."""
    return argparse.Namespace(
        impl=config.getoption("bench_impl"),
        baseline=config.getoption("bench_baseline"),
        shape=config.getoption("bench_shape"),
        sweep=None,
        dtype=config.getoption("bench_dtype"),
        max_ratio=config.getoption("bench_max_ratio"),
        gates=config.getoption("bench_gates"),
        rounds=config.getoption("bench_rounds"),
        warm=False,
    )
