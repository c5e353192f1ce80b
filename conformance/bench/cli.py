"""``attnspec bench``: a speed verdict for any implementation against what its user would call
instead, at the shapes real models run, in numbers a shared machine cannot fake.

Exit status: 0 when every gate passes (or there is none and every timing is credible), 1 when a
gate FAILS, an answer is wrong or a timing is not credible, 2 on a usage error, 3 when a gate is
inconclusive (the ratio's interval straddles it) and nothing failed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from conformance.bench.gates import Gate, load_gates
from conformance.bench.measure import (
    CHECK_SHARE,
    FAILS,
    INCONCLUSIVE,
    NOT_CREDIBLE,
    PASSES,
    ShapeResult,
    WrongAnswer,
    bench_shape,
)
from conformance.bench.report import (
    build_json,
    build_pytest_benchmark_json,
    table_lines,
    write_json,
    write_sweep_plot,
)
from conformance.bench.roofline import Machine, measure_cpu, rated_gpu
from conformance.bench.shapes import NAMED_SHAPES, BenchShape, parse_shape, parse_sweep
from conformance.bench.timing import SETTLE_SECONDS
from conformance.run.commands import absolute_selector, usage_error
from conformance.run.options import OPTIONS
from conformance.run.worker_clients import (
    BOUND_OPTIONS,
    ImplementationBroke,
    ImplementationClient,
    ImplementationDied,
    ImplementationRaised,
    WorkerSetup,
    bounds_given,
    open_clients,
)
from impls.bench_inputs import BLOCK_QUERY_DTYPE
from impls.registry import RegistryError
from spec.block_scaled import (
    BLOCK_FORMATS,
    CACHE_CONVENTIONS,
    CACHE_LAYOUTS,
    BlockShapeError,
    convention_of,
    scale_shape,
)
from spec.dtypes import DTYPES
from spec.features import FEATURES
from spec.fp8 import FP8_FORMATS

DEFAULT_BASELINES = {"cpu": "torch_sdpa", "cuda": "torch_sdpa_cuda"}
DEFAULT_DTYPES = {"cpu": "float32", "cuda": "bfloat16"}
DEFAULT_ROUNDS = 15
EXIT_PASSES, EXIT_FAILS, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3


def positive_ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a ratio is a number above 0, such as 1.5")
    return value


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return int(text)


def add_bench_parser(commands) -> None:
    bench = commands.add_parser(
        "bench",
        help="time an implementation against its baseline: a speed verdict that cannot be faked",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--impl",
        metavar="SELECTOR",
        help="what to time: a built-in, package.module:attr, or path/to/file.py:attr "
        "(with --gates: only that file's gates for it)",
    )
    bench.add_argument(
        "--baseline",
        metavar="SELECTOR",
        help="what it is compared with (default: torch_sdpa on the CPU, "
        "torch_sdpa_cuda on a GPU); 'none' times the implementation alone",
    )
    bench.add_argument(
        "--shape",
        action="append",
        type=parse_shape,
        metavar="NAME|B,H,Hkv,Tq,Tk,D",
        help=f"a named shape ({', '.join(NAMED_SHAPES)}) or six integers; "
        "repeat for several (default: andrea)",
    )
    bench.add_argument(
        "--sweep",
        type=parse_sweep,
        metavar="T=L1,L2,...",
        help="time the shape at each length T (Tq = Tk), and plot throughput",
    )
    bench.add_argument(
        "--dtype",
        choices=(*DTYPES, *FP8_FORMATS, *BLOCK_FORMATS),
        metavar="DTYPE",
        help="float64, float32, float16 or bfloat16 (default: float32 on the CPU, "
        "bfloat16 on a GPU); or an FP8 format (float8_e4m3fn, float8_e5m2, ...): q, k and v "
        "in it with per (batch, kv head) descales, FlashAttention 3's call; or a block-scaled "
        "format: mxfp8_e4m3 or mxfp8_e5m2 (MXFP8 attention: q, k and v in blocks of 32 with "
        "e8m0 scales), nvfp4 or mxfp4 (an FP4 key/value cache: q in bfloat16, k and v packed "
        "e2m1 with their block scales); each timed against the baseline's same call in "
        "bfloat16",
    )
    bench.add_argument(
        "--kv-cache-query",
        choices=FP8_QUERY_DTYPES,
        metavar="DTYPE",
        help="with an FP8 --dtype, the key/value cache's call instead: q in DTYPE (float16, "
        "bfloat16 or float32), k and v in the FP8 dtype with a scale per kv head; with nvfp4 or "
        "mxfp4, q's dtype in the FP4 cache's call (default bfloat16)",
    )
    bench.add_argument(
        "--max-ratio",
        type=positive_ratio,
        metavar="R",
        help="the gate: the implementation's median time at most R times the "
        "baseline's (default: no gate, the ratio is reported)",
    )
    bench.add_argument(
        "--gates",
        type=Path,
        metavar="FILE",
        help="gates in perf/gates.toml's schema: each one whose device is here is "
        "measured at its shape, against its baseline, as the file says (default: none)",
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=f"timed calls of each implementation per shape (default {DEFAULT_ROUNDS})",
    )
    bench.add_argument(
        "--backward",
        action="store_true",
        help="time the forward and backward together (vjp; 3.5x the forward's FLOPs, as "
        "FlashAttention counts), each side's gradients checked as outputs are",
    )
    bench.add_argument(
        "--warm",
        action="store_true",
        help="on a GPU, leave the L2 cache warm between calls (default: flushed)",
    )
    bench.add_argument(
        "--report-json",
        type=Path,
        metavar="PATH",
        help="write the results as JSON (schema attnspec-bench/1)",
    )
    bench.add_argument(
        "--benchmark-json",
        type=Path,
        metavar="PATH",
        help="write them as pytest-benchmark's JSON, for pytest-benchmark compare",
    )
    bench.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="with --sweep: the throughput plot (default: attnspec-sweep.png)",
    )
    bench.add_argument(
        "--report-html",
        type=Path,
        metavar="PATH",
        help="with --sweep: an HTML page with the plot and the table",
    )
    bench.add_argument(
        "--impl-path",
        action="append",
        metavar="DIR",
        help="a directory the implementation's modules are found in (repeatable)",
    )
    for option in OPTIONS:  # the workers' bounds, as attnspec run declares them
        if option.dest in BOUND_OPTIONS.values():
            bench.add_argument(option.flag, **option.arguments())
    bench.set_defaults(handler=command_bench)


class BenchUsageError(Exception):
    """A bench asked for something it cannot do; the message says what."""


@dataclass(frozen=True)
class Plan:
    """What one bench measures: each item a subject, a baseline (or None), shapes and a gate."""

    subject: str
    baseline: str | None
    shapes: list[BenchShape]
    dtype: str | None
    max_ratio: float | None
    causal: bool = True
    gate_id: str | None = None
    device: str | None = None  # a gate's; None: wherever the subject runs


# What a gate file fixes for each of its gates, and so may not be asked for beside it.
SET_BY_A_GATE = ("baseline", "shape", "sweep", "dtype", "kv_cache_query", "max_ratio")
FP8_QUERY_DTYPES = ("float16", "bfloat16", "float32")
# What an FP8 or block-scaled call is timed against: the baseline's same call in bfloat16, the
# dtype such a kernel replaces
FP8_BASELINE_DTYPE = "bfloat16"


def plans_of(options: argparse.Namespace, gates: list[Gate]) -> list[Plan]:
    """What to measure: the gates of --gates (those of --impl alone where it is given), or
    --impl at the shapes asked for. BenchUsageError where the options contradict."""
    if options.impl is None and not gates:
        raise BenchUsageError("give --impl SELECTOR (what to time), or --gates FILE")
    if gates:
        beside = [f"--{name.replace('_', '-')}" for name in SET_BY_A_GATE if getattr(options, name)]
        if beside:
            raise BenchUsageError(
                f"{' and '.join(beside)} beside --gates: a gate names its own baseline, shape, "
                "dtype and ratio; give one or the other"
            )
        chosen = [gate for gate in gates if options.impl in (None, gate.subject)]
        if not chosen:
            subjects = sorted({gate.subject for gate in gates})
            raise BenchUsageError(
                f"--gates {options.gates} has no gate for {options.impl} (its subjects: "
                f"{', '.join(subjects)})"
            )
        return [
            Plan(
                gate.subject, gate.baseline, [gate.shape()], gate.dtype, gate.max_time_ratio,
                gate.causal, gate.id, gate.device,
            )
            for gate in chosen
        ]  # fmt: skip
    caches = [*FP8_FORMATS, *(f for f in BLOCK_FORMATS if convention_of(f) == "fp4_cache")]
    if getattr(options, "kv_cache_query", None) and options.dtype not in caches:
        raise BenchUsageError(
            f"--kv-cache-query {options.kv_cache_query} times a key/value cache's call: give an "
            f"FP8 or FP4 --dtype too ({', '.join(caches)}), not {options.dtype or 'the default'}"
        )
    shapes = options.shape or [NAMED_SHAPES["andrea"]]
    if options.sweep:
        shapes = [shape.at_length(t) for shape in shapes for t in options.sweep]
    # None: no baseline; "": the default for the subject's device, known once it is open
    baseline = None if options.baseline == "none" else (options.baseline or "")
    return [Plan(options.impl, baseline, shapes, options.dtype, options.max_ratio)]


def refusal(
    client: ImplementationClient, shape: BenchShape, dtype: str, backward: bool = False,
    query_dtype: str | None = None,
) -> str | None:  # fmt: skip
    """Why ``client`` cannot be timed at ``shape`` in ``dtype`` (its backward too, with
    ``backward``; q in ``query_dtype`` under an FP8 dtype), or None."""
    caps = client.capabilities
    if client.unavailable_reason():
        return f"{client.name} cannot run here: {client.unavailable_reason()}"
    if backward and not caps.autograd:
        return f"{client.name} declares no backward (Capabilities.autograd)"
    if backward and "page_size" in shape.keywords:
        return f"{shape.name} reads a page pool, which no backward is asked to differentiate"
    if dtype in FP8_FORMATS or dtype in BLOCK_FORMATS:
        refused = fp8_refusal if dtype in FP8_FORMATS else block_refusal
        why = refused(client, shape, dtype, backward, query_dtype)
        if why:
            return why
    elif dtype not in caps.dtypes:
        return f"{client.name} does not declare {dtype} (it declares {', '.join(caps.dtypes)})"
    if not caps.supports_head_dim(shape.head_dim):
        return f"{client.name} does not declare head dim {shape.head_dim}"
    if shape.tq != shape.tk and not caps.cross_length:
        return f"{client.name} does not declare Tq != Tk"
    if shape.value_dim is not None and shape.value_dim != shape.head_dim:
        if not caps.distinct_value_dim:
            return f"{client.name} does not declare Dv != D, which {shape.name} needs"
        if (dtype in FP8_FORMATS or dtype in BLOCK_FORMATS) and dtype not in CACHE_LAYOUTS:
            return f"{shape.name}'s v is k's first columns, which no {dtype} call takes here"
    needed = (["gqa"] if shape.kv_heads != shape.heads else []) + [
        feature.name
        for keyword in shape.keywords
        for feature in FEATURES
        if keyword in feature.keywords or keyword in feature.plain_keywords
    ]
    missing = [feature for feature in needed if not caps.declares(feature)]
    if missing:
        return f"{client.name} does not declare {', '.join(missing)}, which {shape.name} needs"
    return None


def fp8_refusal(
    client: ImplementationClient, shape: BenchShape, fmt: str, backward: bool,
    query_dtype: str | None,
) -> str | None:  # fmt: skip
    """Why ``client``'s FP8 call in ``fmt`` cannot be timed at ``shape``, or None."""
    caps = client.capabilities
    convention = "descale" if query_dtype is None else "kv_scale"
    if not caps.fp8:
        return f"{client.name} does not declare fp8 (FP8 operands with scales)"
    if backward:
        return "an FP8 call is timed forward only: no claim judges an FP8 backward"
    if shape.keywords:
        return f"{shape.name} needs {', '.join(shape.keywords)}, which no FP8 call takes here"
    if fmt not in caps.fp8_formats:
        return f"{client.name} does not declare {fmt} (it declares {', '.join(caps.fp8_formats)})"
    if convention not in caps.fp8_conventions:
        return f"{client.name} does not declare the {convention} convention"
    if convention == "kv_scale" and "kv_head" not in caps.fp8_kv_scales:
        return f"{client.name} does not declare a scale per kv head (Capabilities.fp8_kv_scales)"
    if query_dtype is not None and query_dtype not in caps.fp8_queries:
        return f"{client.name} does not declare q in {query_dtype}"
    return None


def block_refusal(
    client: ImplementationClient, shape: BenchShape, fmt: str, backward: bool,
    query_dtype: str | None,
) -> str | None:  # fmt: skip
    """Why ``client``'s block-scaled call in ``fmt`` (spec.block_scaled, in the format's
    convention) cannot be timed at ``shape``, or None."""
    caps = client.capabilities
    convention = convention_of(fmt)
    if query_dtype is not None and convention not in CACHE_CONVENTIONS:
        return f"--kv-cache-query is a cache's: {fmt}'s q is in {fmt} too ({convention})"
    if not caps.block_scaled:
        return f"{client.name} does not declare block_scaled (block-scaled operands)"
    if backward:
        return "a block-scaled call is timed forward only: no claim judges its backward"
    needs = [name for name in shape.keywords if name != "scale"]
    if needs:
        return f"{shape.name} needs {', '.join(needs)}, which no {fmt} call takes here"
    if fmt not in caps.block_formats:
        return f"{client.name} does not declare {fmt} (it declares {', '.join(caps.block_formats)})"
    if convention not in caps.block_conventions:
        return f"{client.name} does not declare the {convention} convention, which {fmt} is in"
    query_dtype = query_dtype or BLOCK_QUERY_DTYPE
    if convention in CACHE_CONVENTIONS and query_dtype not in caps.fp8_queries:
        return f"{client.name} does not declare q in {query_dtype} (--kv-cache-query DTYPE)"
    if fmt in CACHE_LAYOUTS:
        layout = CACHE_LAYOUTS[fmt]
        widths = (layout.latent + layout.rope, layout.latent)
        if (shape.head_dim, shape.value_dim) != widths:
            return (f"{shape.name} has D={shape.head_dim}, Dv={shape.value_dim or shape.head_dim},"
                    f" but a {fmt} cache's keys and values have D={widths[0]}, Dv={widths[1]} "
                    "(mla-decode has them)")  # fmt: skip
        return None
    try:
        for operand, dims in (("q", shape.dims[3]), ("v", shape.dims[4])):
            scale_shape(convention, operand, (1, 1, dims, shape.head_dim), BLOCK_FORMATS[fmt].block)
    except BlockShapeError as exc:
        return f"{shape.name}: {exc}"
    return None


def gpu_clocks() -> dict | None:
    """The GPU's clocks as nvidia-smi reports them now (a throttled GPU times slow), or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    fields = "name,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,temperature.gpu,power.draw"
    run = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        return None
    values = [value.strip() for value in run.stdout.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def machine_for(device: str, dtype: str) -> Machine:
    if device != "cuda":
        return measure_cpu(dtype)
    clocks = gpu_clocks() or {}
    name = clocks.get("name", "an unnamed GPU")
    rated = rated_gpu(name, dtype)
    if rated is None:
        raise RegistryError(
            f"no rated figures for {name} in {dtype}: a GPU bench checks every time against its "
            "roofline, and knows H200 and H100 (FP8 included) and A100 (no FP8) "
            "(conformance/bench/roofline.py)"
        )
    return rated


@dataclass
class BenchRun:
    results: list[ShapeResult]
    problems: list[str]  # wrong answers, shapes not timed, timings not credible
    skipped: list[str]  # gates for a device that is not here
    machine: Machine | None
    settings: dict
    status: int


def command_bench(options: argparse.Namespace) -> int:
    try:
        run = run_bench(options)
    except BenchUsageError as exc:
        return usage_error(str(exc))
    print(f"attnspec bench: {run.machine.source if run.machine else 'nothing measured'}")
    for line in table_lines(run.results):
        print(line)
    for line in [*run.skipped, *run.problems]:
        print(f"attnspec bench: {line}")
    if options.sweep and run.results:
        png = options.plot or Path("attnspec-sweep.png")
        why_no_plot = write_sweep_plot(run.results, png, options.report_html)
        print(f"attnspec bench: {why_no_plot or f'throughput against T in {png}'}")
    if options.report_json and run.machine is not None:
        clocks = gpu_clocks() if run.machine.kind != "cpu" else None
        data = build_json(run.results, run.machine, run.settings, run.problems, run.status, clocks)
        write_json(options.report_json, data)
    if options.benchmark_json:
        write_json(options.benchmark_json, build_pytest_benchmark_json(run.results, run.settings))
    return run.status


def run_bench(options: argparse.Namespace) -> BenchRun:
    """Measure what ``options`` (attnspec bench's) ask for; BenchUsageError where they cannot
    be measured as asked."""
    if (getattr(options, "plot", None) or getattr(options, "report_html", None)) and not (
        options.sweep
    ):
        raise BenchUsageError("--plot and --report-html draw a sweep: give --sweep T=... too")
    gates: list[Gate] = []
    if getattr(options, "gates", None) is not None:
        try:
            gates = load_gates(options.gates)
        except (OSError, ValueError) as exc:
            raise BenchUsageError(f"--gates {options.gates}: {exc}") from None
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    paths = [*(getattr(options, "impl_path", None) or ()), os.getcwd()]
    backward = getattr(options, "backward", False)
    bounds = bounds_given(lambda dest: getattr(options, dest, None))
    setup = WorkerSetup(impl_paths=tuple(paths), budget_seconds=None, **bounds)
    results: list[ShapeResult] = []
    problems: list[str] = []
    machine = None
    machines: dict[tuple[str, str], Machine] = {}
    skipped: list[str] = []  # gates for a device that is not here: said, not failed
    clients: dict[str, ImplementationClient] = {}

    def client(selector: str) -> ImplementationClient:
        if selector not in clients:
            (clients[selector],) = open_clients([absolute_selector(selector)], setup=setup)
        return clients[selector]

    try:
        for plan in plans_of(options, gates):
            if plan.device == "cuda" and gpu_clocks() is None:
                skipped.append(f"{plan.gate_id}: not measured: a gate for a GPU, and none is here")
                continue
            subject = client(plan.subject)
            device = subject.device if subject.device in DEFAULT_BASELINES else "cpu"
            baseline_name = plan.baseline if plan.baseline != "" else DEFAULT_BASELINES[device]
            baseline = client(baseline_name) if baseline_name else None
            dtype = plan.dtype or DEFAULT_DTYPES[device]
            query_dtype = getattr(options, "kv_cache_query", None)
            low_precision = dtype in FP8_FORMATS or dtype in BLOCK_FORMATS
            baseline_dtype = FP8_BASELINE_DTYPE if low_precision else dtype
            for timed_dtype in {dtype, baseline_dtype}:
                if (device, timed_dtype) not in machines:
                    machines[device, timed_dtype] = machine_for(device, timed_dtype)
            machine = machines[device, dtype]
            for shape in plan.shapes:
                why = refusal(subject, shape, dtype, backward, query_dtype)
                baseline_why = baseline is not None and refusal(
                    baseline, shape, baseline_dtype, backward
                )
                if not why and baseline_why:
                    other = "" if plan.gate_id else " (another: --baseline NAME, or none)"
                    why = f"{baseline_why}{other}"
                if why:
                    problems.append(f"{shape.name}: not timed: {why}")
                    continue
                try:
                    result = bench_shape(
                        subject, baseline, shape, dtype, machine, rounds=options.rounds,
                        causal=plan.causal, warm=options.warm, max_ratio=plan.max_ratio,
                        backward=backward, query_dtype=query_dtype, baseline_dtype=baseline_dtype,
                        baseline_machine=machines[device, baseline_dtype],
                    )  # fmt: skip
                except WrongAnswer as exc:
                    problems.append(f"{shape.name}: {exc}")
                    continue
                except (ImplementationRaised, ImplementationBroke, ImplementationDied) as exc:
                    # what it raised, broke or how it died, as the suite says it: not timed
                    problems.append(f"{shape.name}: not timed: {exc}")
                    continue
                results.append(result)
                machine = machines[device, dtype] = result.machine  # measured again, maybe
    except RegistryError as exc:
        raise BenchUsageError(str(exc)) from None
    finally:
        for opened in clients.values():
            opened.close()
    for result in results:
        for side in result.sides:
            if side.why_not:
                problems.append(f"{result.shape.name}: {side.why_not}")
    verdicts = [r.verdict for r in results if r.verdict is not None]
    settings = {
        "dtype": results[0].dtype if results else None,
        "kv_cache_query": getattr(options, "kv_cache_query", None),
        "causal": results[0].causal if results else None,
        "pass": results[0].timed_pass if results else None,
        "rounds": options.rounds, "warm": options.warm, "settle_seconds": SETTLE_SECONDS,
        "check_share": CHECK_SHARE, "started": started,
    }  # fmt: skip
    return BenchRun(results, problems, skipped, machine, settings, exit_status(verdicts, problems))


def exit_status(verdicts: list[str], problems: list[str]) -> int:
    if problems or FAILS in verdicts or NOT_CREDIBLE in verdicts:
        return EXIT_FAILS
    if INCONCLUSIVE in verdicts:
        return EXIT_INCONCLUSIVE
    assert all(verdict == PASSES for verdict in verdicts), verdicts
    return EXIT_PASSES
