"""One bench: an implementation and its baseline timed call by call, in their workers, on inputs
drawn afresh for every call, each answer open to a check the worker cannot foresee.

What a timing must withstand, and what withstands it (docs/performance.md, "A speed no kernel
can fake"):

- answers cached by input: every call's inputs are drawn from a seed the judge chose for it
  (``secrets``) and sent with it (impls/bench_inputs.py), so no two calls share inputs and none
  can be computed before its call;
- garbage on timed calls: there is no separate checked call. The first call of each side is
  checked before anything is timed (a wrong answer is not timed); after it, each answer is
  checked with probability CHECK_SHARE, and the last one always, decided once the answer is
  back, on heads drawn then too;
- work deferred past the timer: the worker's window ends when the answer can be read (after
  to_numpy on the CPU, at a synchronised CUDA event on a GPU), and the judge's clock over each
  request, less the line's cost, must agree with the worker's (CREDIBLE below);
- a patched clock in the worker: the same agreement;
- a time below the roofline: not credible, whatever the clocks say (conformance.bench.roofline);
- a rival slowed: while one side is timed, the other side's worker is frozen, and a round in
  which it ran anyway is refused (conformance.bench.fairness);
- a machine busy with other work: what the rest of the machine ran during each side's timed
  calls is measured, and a side that shared the cores with it is refused
  (conformance.bench.machine_load).
"""

from __future__ import annotations

import secrets
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from conformance.bench.device_activity import DeviceActivity
from conformance.bench.fairness import FREEZE, OFF, Quiet, unfair
from conformance.bench.machine_load import MachineLoad, WatchedCall
from conformance.bench.roofline import Machine, call_bytes, call_flops
from conformance.bench.shapes import BenchShape
from conformance.bench.timing import SETTLE_SECONDS
from conformance.judge.fp8 import Fp8Inputs, compare_dequantized, compare_fp8, fp8_budget
from conformance.judge.tolerance import compare_gradients, compare_to_oracle
from conformance.run.worker_clients import ImplementationClient
from impls.bench_inputs import (
    BLOCK_QUERY_DTYPE,
    fresh_block_call,
    fresh_fp8_inputs,
    fresh_inputs,
)
from spec import block_scaled
from spec.block_scaled import BLOCK_FORMATS, stored_dtypes
from spec.fp8 import FP8_FORMATS, output_dtype

ECHO_PROBES = 3  # requests that call nothing, for the line's own cost, before the first call
CHECK_SHARE = 0.25  # the chance that a timed call's answer is checked
HEADS_CHECKED = 2  # (item, head) pairs a check compares, drawn once the answer is back
HEADS_VALIDATED = 4  # the same for the first call, before any timing
# The judge's view of a call (its request, less the line's cost) may exceed the worker's report
# by LONGER_SHARE of it, or fall short by SHORTER_SHARE, each plus SLACK_SECONDS, before the
# report is not credible. A busy machine only lengthens the judge's view, so short of the report
# is held closer: a clock at half speed is twice off. A clock that lies does so on every call,
# while the scheduler delays some requests by a slice or more (seen: 9 to 12 ms on four of eight
# of torch_sdpa's 2 ms calls at T = 256, its threads spinning after the call), so "exceeds"
# is read at the lower quartile of the calls' differences, "falls short" at the upper one.
LONGER_SHARE, SHORTER_SHARE = 0.5, 0.1
SLACK_SECONDS = 0.003
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


class WrongAnswer(Exception):
    """A checked answer was outside its budget: the implementation is not timed."""


@dataclass
class TimedSide:
    """One implementation's calls in a bench. The switches (fresh_inputs, check_share,
    check_last, judge_clock, fairness) exist so that tests can show each cheat succeeding
    without its defence."""

    client: ImplementationClient
    shape: BenchShape
    dtype: str
    causal: bool = True
    flush_cache: bool = True
    fresh_inputs: bool = True
    check_share: float = CHECK_SHARE
    check_last: bool = True  # the last timed call's answer checked, whatever the draw
    judge_clock: bool = True
    fairness: str = FREEZE  # what the other sides' workers undergo while this one is timed
    machine_watch: bool = True  # a side whose calls shared the machine with other work refused
    backward: bool = False  # time vjp, forward and backward, and check its gradients
    # an FP8 dtype: q's dtype where the call is in the key/value cache's convention (None: q in
    # the FP8 dtype with the descales, FlashAttention 3's)
    query_dtype: str | None = None
    device_activity: DeviceActivity | None = None  # the GPU's samples, where it is one
    seconds: list[float] = field(default_factory=list)  # the worker's, timed calls only
    # the CPU each other side's worker ran during each of this side's timed calls, by name
    others_ran: dict[str, list[float]] = field(default_factory=dict)
    # the SM utilisation NVML saw of each other side's worker during each timed call, by name
    others_busy: dict[str, list[int]] = field(default_factory=dict)
    # the judge's, request by request, less the line's cost measured just after it
    judged: list[float] = field(default_factory=list)
    checked: int = 0  # answers checked, the first one included
    worst_fraction: float = 0.0  # the largest error / budget among them
    echoes: list[float] = field(default_factory=list)  # the line's cost, request by request
    # what the rest of the machine ran during the timed calls
    load: MachineLoad = field(default_factory=MachineLoad)

    def __post_init__(self) -> None:
        self.choices = np.random.default_rng(secrets.randbits(64))  # the judge's, not the worker's

    @property
    def drawn(self) -> dict:
        """How the inputs are drawn beyond their dims: v as k's first columns (MLA's)."""
        return {} if self.shape.value_dim is None else {"value_dim": self.shape.value_dim}

    def _seed(self) -> int:
        return secrets.randbits(62) if self.fresh_inputs else 1

    def _request(self, seed: int, echo: bool = False):
        started = time.perf_counter()
        seconds, output = self.client.bench_call(
            seed, self.shape.dims, self.dtype, echo=echo, flush_cache=self.flush_cache,
            causal=self.causal, backward=self.backward, query_dtype=self.query_dtype,
            **self.shape.keywords, **self.drawn,
        )  # fmt: skip
        return seconds, output, time.perf_counter() - started

    def probe_line(self, probes: int = 1) -> None:
        """The line's cost: requests that draw and lay out the inputs, run the clock around no
        call, and send the inputs back.
        One follows each timed call, so that the cost is measured under the load the call met
        (two processes on two cores make it vary by tens of milliseconds)."""
        for _ in range(probes):
            self.echoes.append(self._request(self._seed(), echo=True)[2])

    @property
    def overhead(self) -> float:
        return statistics.median(self.echoes)

    def validate(self) -> None:
        """The first call, checked on HEADS_VALIDATED heads before anything is timed (and the
        warm-up: it is not counted)."""
        seed = self._seed()
        _, output, _ = self._request(seed)
        self.check(seed, output, HEADS_VALIDATED, "its first call, before any timing")

    def timed_call(self, others: list[ImplementationClient], last: bool = False) -> None:
        """One timed call, with ``others`` (the sides not timed) quiet as :attr:`fairness`
        says."""
        seed = self._seed()
        # a side timed against itself has one worker: it is not frozen under its own call
        mine = worker_of(self.client)
        workers = {o.name: pid for o in others if (pid := worker_of(o)) not in (None, mine)}
        every_worker = [pid for pid in (mine, *workers.values()) if pid is not None]
        with (
            Quiet(workers, self.fairness, self.device_activity) as quiet,
            WatchedCall(self.load, every_worker),
        ):
            seconds, output, wall = self._request(seed)
            self.probe_line()  # right after, warm as the call's request was
        for name, ran in quiet.ran.items():
            self.others_ran.setdefault(name, []).append(ran)
        for name, busy in quiet.busy.items():
            self.others_busy.setdefault(name, []).append(busy)
        self.seconds.append(seconds)
        self.judged.append(wall - self.echoes[-1])
        # the last answer always (a kernel that counts its calls knows which is last, and one
        # that returns garbage everywhere never escapes), the others by chance
        due = last and self.check_last
        if due or self.choices.random() < self.check_share:
            self.check(seed, output, HEADS_CHECKED, f"timed call {len(self.seconds)}")

    def check(self, seed: int, output, heads: int, which: str) -> None:
        """The answer of the call drawn from ``seed`` against the oracle on ``heads`` (item,
        head) pairs drawn now; the gradients, on as many (item, key/value head) groups."""
        if self.backward:
            self.check_gradients(seed, output, heads, which)
            return
        out = np.asarray(output.array, np.float64)
        expected = (self.shape.batch, self.shape.heads, self.shape.tq, self.shape.out_dim)
        if out.shape != expected:
            raise WrongAnswer(
                f"{self.client.name} returned shape {out.shape} in {which}, but should return "
                f"{expected} [{self.shape.describe()}]"
            )
        if self.dtype in FP8_FORMATS:
            self.check_fp8(seed, out, heads, which)
            return
        if self.dtype in BLOCK_FORMATS:
            self.check_block(seed, out, heads, which)
            return
        q, k, v = fresh_inputs(seed, self.shape.dims, self.dtype, **self.drawn)
        group = self.shape.heads // self.shape.kv_heads
        pairs = self.shape.batch * self.shape.heads
        variant = {n: v for n, v in self.shape.keywords.items() if n != "page_size"}
        for index in self.choices.choice(pairs, size=min(heads, pairs), replace=False):
            b, h = divmod(int(index), self.shape.heads)
            kv = slice(h // group, h // group + 1)
            inputs = (q[b : b + 1, h : h + 1], k[b : b + 1, kv], v[b : b + 1, kv])
            one = dict(variant)
            if "kv_indices" in one:  # the item's rows of its key/value head
                one["kv_indices"] = one["kv_indices"][b : b + 1, kv]
            comparison = compare_to_oracle(
                out[b : b + 1, h : h + 1], *(x.astype(np.float64) for x in inputs),
                dtype=self.dtype, causal=self.causal, **one,
            )  # fmt: skip
            self.worst_fraction = max(self.worst_fraction, comparison.budget_fraction)
            if not comparison.ok:
                raise WrongAnswer(
                    f"{self.client.name} is wrong in {which} (item {b}, head {h}), so it is not "
                    f"timed: {comparison.describe()} [{self.shape.describe()} {self.dtype}]"
                )
        self.checked += 1

    def check_fp8(self, seed: int, out: np.ndarray, heads: int, which: str) -> None:
        """The FP8 call's answer against the float64 formula on its dequantized inputs, within
        the budget of the arithmetic the implementation declares (conformance.judge.fp8), on
        ``heads`` (item, head) pairs drawn now."""
        inputs = Fp8Inputs(*fresh_fp8_inputs(seed, self.shape.dims, self.dtype, self.query_dtype))
        caps = self.client.capabilities
        out_dtype = output_dtype(inputs.scales.convention, self.query_dtype, caps.fp8_output)
        pairs = self.shape.batch * self.shape.heads
        for index in self.choices.choice(pairs, size=min(heads, pairs), replace=False):
            b, h = divmod(int(index), self.shape.heads)
            comparison = compare_fp8(
                out[b : b + 1, h : h + 1], inputs.one_head(b, h), causal=self.causal,
                scale=None, p_rounding=caps.fp8_p, out_dtype=out_dtype,
            )  # fmt: skip
            self.worst_fraction = max(self.worst_fraction, comparison.elements.budget_fraction)
            if not comparison.ok:
                raise WrongAnswer(
                    f"{self.client.name} is wrong in {which} (item {b}, head {h}), so it is not "
                    f"timed: {comparison.describe()} [{self.describe()}]"
                )
        self.checked += 1

    def check_block(self, seed: int, out: np.ndarray, heads: int, which: str) -> None:
        """The block-scaled call's answer against the float64 formula on its dequantized
        inputs, within the budget of the arithmetic the implementation declares
        (conformance.judge.block_scaled's rule), on ``heads`` (item, head) pairs drawn now."""
        call = fresh_block_call(seed, self.shape.dims, self.dtype, self.query_dtype,
                                self.shape.value_dim)  # fmt: skip
        caps = self.client.capabilities
        cache_query = self.query_dtype or BLOCK_QUERY_DTYPE
        query_dtype = stored_dtypes(call.convention, self.dtype, cache_query)[0]
        out_dtype = block_scaled.output_dtype(call.convention, query_dtype, caps.block_output)
        options = dict(causal=self.causal, scale=self.shape.keywords.get("scale"))
        p_rounding = caps.block_p_of(call.convention)
        call = call.with_(p_rounding=p_rounding, out_dtype=out_dtype, options=options)
        budget = fp8_budget(out_dtype, p_rounding)
        group = self.shape.heads // self.shape.kv_heads
        pairs = self.shape.batch * self.shape.heads
        for index in self.choices.choice(pairs, size=min(heads, pairs), replace=False):
            b, h = divmod(int(index), self.shape.heads)
            one = call.one_head(b, h, group)
            comparison = compare_dequantized(out[b : b + 1, h : h + 1], one.dequantized(),
                                             one.baseline(), options=one.options,
                                             budget=budget)  # fmt: skip
            self.worst_fraction = max(self.worst_fraction, comparison.elements.budget_fraction)
            if not comparison.ok:
                raise WrongAnswer(
                    f"{self.client.name} is wrong in {which} (item {b}, head {h}), so it is not "
                    f"timed: {comparison.describe()} [{self.describe()}]"
                )
        self.checked += 1

    def describe(self) -> str:
        """The timed call in words: its shape and dtypes."""
        if self.dtype in BLOCK_FORMATS:
            convention = block_scaled.convention_of(self.dtype)
            cache = convention in block_scaled.CACHE_CONVENTIONS
            query = f", q {self.query_dtype or BLOCK_QUERY_DTYPE}" * cache
            return f"{self.shape.describe()} {self.dtype} ({convention}{query})"
        if self.query_dtype is not None:
            return (f"{self.shape.describe()}, q {self.query_dtype}, k and v {self.dtype} with "
                    "per-kv-head scales")  # fmt: skip
        return f"{self.shape.describe()} {self.dtype}"

    def check_gradients(self, seed: int, grads, heads: int, which: str) -> None:
        """dq, dk, dv of the vjp call drawn from ``seed``, each group of query heads with its
        key/value head a backward of its own, against the float64 backward."""
        q, k, v, grad_out = (x.astype(np.float64) for x in fresh_inputs(
            seed, self.shape.dims, self.dtype, grad_out=True, **self.drawn))  # fmt: skip
        grads = [np.asarray(g.array, np.float64) for g in grads]
        for got, want in zip(grads, (q, k, v), strict=True):
            if got.shape != want.shape:
                raise WrongAnswer(
                    f"{self.client.name} returned gradients of shapes "
                    f"{[g.shape for g in grads]} in {which}, but should return "
                    f"{[x.shape for x in (q, k, v)]} [{self.shape.describe()}]"
                )
        group = self.shape.heads // self.shape.kv_heads
        pairs = self.shape.batch * self.shape.kv_heads
        variant = {n: v for n, v in self.shape.keywords.items() if n != "page_size"}
        for index in self.choices.choice(pairs, size=min(heads, pairs), replace=False):
            b, kv = divmod(int(index), self.shape.kv_heads)
            heads_of = slice(kv * group, (kv + 1) * group)  # the group's query heads
            one_group = (slice(b, b + 1), heads_of), (slice(b, b + 1), slice(kv, kv + 1))
            inputs = [x[one_group[n]] for x, n in ((q, 0), (k, 1), (v, 1), (grad_out, 0))]
            answer = {name: g[one_group[n]] for name, g, n in zip("qkv", grads, (0, 1, 1),
                                                                   strict=True)}  # fmt: skip
            comparisons = compare_gradients(
                answer, *inputs, dtype=self.dtype, causal=self.causal, **variant
            )
            for name, comparison in comparisons.items():
                self.worst_fraction = max(self.worst_fraction, comparison.budget_fraction)
                if not comparison.ok:
                    raise WrongAnswer(
                        f"{self.client.name}'s {name} is wrong in {which} (item {b}, key/value "
                        f"head {kv}), so it is not timed: {comparison.describe()} "
                        f"[{self.shape.describe()} {self.dtype}, forward and backward]"
                    )
        self.checked += 1

    def contradiction(self) -> str | None:
        """Why the worker's times are not credible by the judge's clock, or None. Each request is
        held to its own report (the load it met is the same for both clocks). A round in which
        another side ran is refused first, then one that shared the machine with other work."""
        why = unfair(self.client.name, self.others_ran, self.others_busy)
        if self.fairness != OFF and why:
            return why
        why = self.load.refusal(self.client.name)
        if self.machine_watch and why:
            return why
        if not self.judge_clock or not self.seconds:
            return None
        reported = statistics.median(self.seconds)
        excess = np.subtract(self.judged, self.seconds)
        low, high = np.quantile(excess, [0.25, 0.75])
        if low <= LONGER_SHARE * reported + SLACK_SECONDS:
            if -high <= SHORTER_SHARE * reported + SLACK_SECONDS:
                return None
            which, judged = "at most", reported + high
        else:
            which, judged = "at least", reported + low
        return (
            f"timing not credible: {self.client.name}'s worker reported {reported * 1e3:.2f} ms "
            f"a call (the median), but by the judge's clock three calls in four took {which} "
            f"{judged * 1e3:.2f} ms (each request, less the line's cost measured just after it: "
            f"{self.overhead * 1e3:.2f} ms in the median)"
        )


def worker_of(client: ImplementationClient) -> int | None:
    """The pid of ``client``'s worker, where it has one running."""
    process = getattr(client.channel, "process", None)
    return None if process is None else process.pid


@dataclass(frozen=True)
class SideResult:
    name: str
    seconds: list[float]
    flops: float
    bytes_moved: float
    bound_seconds: float  # the roofline's least time for the call
    credible: bool
    why_not: str | None
    checked: int
    worst_fraction: float
    # the CPU each other side's worker ran during each of this side's timed calls, by name
    others_ran: dict[str, list[float]] = field(default_factory=dict)
    dtype: str = ""  # the dtype this side was timed in (an FP8 subject's baseline: bfloat16)
    load: MachineLoad = field(default_factory=MachineLoad)  # the rest of the machine meanwhile

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.median

    @property
    def fraction_of_bound(self) -> float:
        """The roofline's least time over the median: 1 is the machine's best."""
        return self.bound_seconds / self.median


def side_result(side: TimedSide, machine: Machine) -> SideResult:
    flops = call_flops(side.shape, side.causal, side.backward)
    bytes_moved = call_bytes(side.shape, side.dtype, side.backward)
    bound = machine.bound_seconds(flops, bytes_moved)
    why_not = side.contradiction()
    median = statistics.median(side.seconds)
    if why_not is None and median < bound:
        why_not = (
            f"timing not credible: {side.client.name}'s median {median * 1e3:.3f} ms is below "
            f"the least time the machine allows, {bound * 1e3:.3f} ms ({flops / 1e9:.2f} GFLOP "
            f"and {bytes_moved / 1e6:.1f} MB at {machine.source})"
        )
    return SideResult(
        side.client.name, list(side.seconds), flops, bytes_moved, bound, why_not is None,
        why_not, side.checked, side.worst_fraction, dict(side.others_ran), side.dtype, side.load,
    )  # fmt: skip


@dataclass(frozen=True)
class RatioInterval:
    median: float  # the subject's median time over the baseline's
    low: float
    high: float
    confidence: float = CONFIDENCE


def ratio_interval(subject: list[float], baseline: list[float], seed: int = 0) -> RatioInterval:
    """The ratio of medians, with a bootstrap interval over the rounds (resampled in pairs: a
    round's two calls ran side by side, under the same load)."""
    a, b = np.asarray(subject), np.asarray(baseline)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(a), size=(BOOTSTRAP_RESAMPLES, len(a)))
    ratios = np.median(a[picks], axis=1) / np.median(b[picks], axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return RatioInterval(float(np.median(a) / np.median(b)), float(low), float(high))


PASSES, FAILS, INCONCLUSIVE, NOT_CREDIBLE = "passes", "FAILS", "inconclusive", "not credible"


def gate_verdict(interval: RatioInterval, max_ratio: float) -> str:
    """passes when the whole interval is within the gate, FAILS when all of it is beyond,
    inconclusive when it straddles the gate: the machine was too noisy to tell."""
    if interval.high <= max_ratio:
        return PASSES
    if interval.low > max_ratio:
        return FAILS
    return INCONCLUSIVE


@dataclass(frozen=True)
class ShapeResult:
    shape: BenchShape
    dtype: str
    causal: bool
    sides: list[SideResult]
    ratio: RatioInterval | None  # None without a baseline, or when a side is not credible
    max_ratio: float | None
    verdict: str | None  # of the gate, where there is one
    machine: Machine  # the roofline it was judged by
    backward: bool = False  # forward and backward (vjp) timed, not the forward alone

    @property
    def timed_pass(self) -> str:
        return "forward+backward" if self.backward else "forward"

    @property
    def subject(self) -> SideResult:
        return self.sides[0]


def bench_shape(
    subject: ImplementationClient,
    baseline: ImplementationClient | None,
    shape: BenchShape,
    dtype: str,
    machine: Machine,
    *,
    rounds: int,
    causal: bool = True,
    warm: bool = False,
    max_ratio: float | None = None,
    settle_seconds: float = SETTLE_SECONDS,
    side_options: dict | None = None,
    backward: bool = False,
    query_dtype: str | None = None,
    baseline_dtype: str | None = None,
    baseline_machine: Machine | None = None,
) -> ShapeResult:
    """Validate both sides at ``shape``, then time them in alternation, ``rounds`` calls each,
    each call after ``settle_seconds`` of quiet (a library's threads spinning down). Raises
    WrongAnswer where a checked answer is wrong. ``side_options``: TimedSide's switches, for the
    tests that plant cheaters. An FP8 ``dtype`` (q in ``query_dtype`` where given) is timed
    against the baseline's call in ``baseline_dtype`` on ``baseline_machine``'s roofline."""
    clients = [subject] + ([baseline] if baseline is not None else [])
    options = dict(side_options or {})
    if len(clients) > 1 and any(client.device == "cuda" for client in clients):
        options.setdefault("device_activity", DeviceActivity.of_machine())
    calls = [(dtype, query_dtype, machine), (baseline_dtype or dtype, None,
                                             baseline_machine or machine)]  # fmt: skip
    sides = [
        TimedSide(
            client,
            shape,
            side_dtype,
            causal,
            flush_cache=not warm,
            backward=backward,
            query_dtype=side_query,
            **options,
        )
        for client, (side_dtype, side_query, _) in zip(clients, calls, strict=False)
    ]
    machines = [side_machine for _, _, side_machine in calls[: len(sides)]]
    for side in sides:
        side.probe_line(ECHO_PROBES)
        side.validate()
    for number in range(rounds):
        for side in sides:
            time.sleep(settle_seconds)
            others = [other.client for other in sides if other is not side]
            side.timed_call(others, last=number == rounds - 1)
    results = [side_result(side, m) for side, m in zip(sides, machines, strict=True)]
    if any(result.median < result.bound_seconds for result in results):
        # the peaks again, before a time is called impossible (once a machine: a side's
        # baseline is most often timed on its own)
        again = {id(m): m.at_best() for m in {id(m): m for m in machines}.values()}
        machines = [again[id(m)] for m in machines]
        machine = machines[0]
        results = [side_result(side, m) for side, m in zip(sides, machines, strict=True)]
    ratio = verdict = None
    credible = all(result.credible for result in results)
    if baseline is not None and credible:
        ratio = ratio_interval(results[0].seconds, results[1].seconds)
    if baseline is not None and max_ratio is not None:
        verdict = gate_verdict(ratio, max_ratio) if credible else NOT_CREDIBLE
    return ShapeResult(shape, dtype, causal, results, ratio, max_ratio, verdict, machine, backward)
