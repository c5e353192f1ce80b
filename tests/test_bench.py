"""attnspec bench: its verdicts, and a speed no kernel can fake. Each cheat of
tests/planted/cheats.py is caught with its defence on, and seen succeeding with it off; no test
here passes or fails on how fast anything ran."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conformance.bench.cli import EXIT_FAILS, EXIT_INCONCLUSIVE, EXIT_PASSES, exit_status, refusal
from conformance.bench.device_activity import DeviceActivity
from conformance.bench.fairness import ALLOWED_CPU_SECONDS, FREEZE, MEASURE, OFF, Quiet, unfair
from conformance.bench.gates import GATES_PATH
from conformance.bench.machine_load import (
    ALLOWED_SHARE,
    STANDARD_ERRORS,
    TICK_SECONDS,
    MachineLoad,
)
from conformance.bench.measure import (
    FAILS,
    INCONCLUSIVE,
    NOT_CREDIBLE,
    PASSES,
    RatioInterval,
    TimedSide,
    WrongAnswer,
    bench_shape,
    gate_verdict,
    ratio_interval,
)
from conformance.bench.roofline import Machine, call_bytes, call_flops
from conformance.bench.shapes import NAMED_SHAPES, BenchShape, parse_shape
from conformance.run.worker_clients import open_clients
from impls.device_clock import AnswerStillWritten, DeviceClock
from tests.suite_process import run_attnspec as attnspec

CHEATS = "tests.planted.cheats"
SMALL = BenchShape("small", 1, 2, 2, 64, 64, 16, "a test's")
# Calls of tens of milliseconds, which a clock at half speed shifts beyond the line's noise.
MEDIUM = BenchShape("medium", 1, 8, 8, 1024, 1024, 64, "a test's")
# Calls of about 10 ms, in which a spinning process runs whole milliseconds.
CROWDED = BenchShape("crowded", 1, 4, 4, 512, 512, 64, "a test's")
# A roofline no call comes near: the tests not about it never meet it.
UNBOUNDED = Machine("cpu", 1e18, 1e18, "a machine no call comes near")


def bench(
    selector: str, shape: BenchShape = SMALL, rounds: int = 4, machine=UNBOUNDED,
    backward: bool = False, **switches,
):  # fmt: skip
    """(the bench's result or the WrongAnswer it raised, what the implementation printed). The
    watch of the machine's load is off unless a test turns it on: a test run beside other work
    (CI's) must not be decided by it."""
    switches.setdefault("machine_watch", False)
    [client] = open_clients([selector])
    try:
        try:
            outcome = bench_shape(
                client, None, shape, "float32", machine, rounds=rounds, settle_seconds=0.01,
                side_options=switches, backward=backward,
            )  # fmt: skip
        except WrongAnswer as exc:
            outcome = exc
        return outcome, client.take_output()
    finally:
        client.close()


def test_answers_cached_by_input_gain_nothing():
    # timed as it computes; the judge's clock is off where a test is not about it, so that no
    # timing on a busy machine decides a test
    result, printed = bench(f"{CHEATS}:caches_answers_by_input", judge_clock=False)
    assert "from the cache" not in printed, printed
    assert result.subject.credible, result.subject.why_not
    # its defence off, every timed call is a cache hit
    _, printed = bench(f"{CHEATS}:caches_answers_by_input", fresh_inputs=False)
    assert printed.count("cheat: an answer from the cache") == 4, printed  # the 4 timed calls


@pytest.mark.parametrize(
    ("cheat", "checks", "caught", "printed_when_not"),
    [
        # garbage after the first call: caught by the random checks of timed answers
        ("garbage_after_its_first_call", {}, "is wrong in timed call", "garbage returned"),
        # garbage on the call it counts as the last: caught by the last call's check alone
        ("garbage_on_its_last_timed_call", {"check_share": 0.0}, "is wrong in timed call 4",
         "garbage on the last timed call"),
    ],
)  # fmt: skip
def test_garbage_on_timed_calls_is_checked_without_warning(cheat, checks, caught, printed_when_not):
    outcome, _ = bench(f"{CHEATS}:{cheat}", **checks)
    assert isinstance(outcome, WrongAnswer), outcome
    assert caught in str(outcome)
    # its defence off (no timed answer checked, the last one neither), the garbage goes through
    outcome, printed = bench(f"{CHEATS}:{cheat}", check_share=0.0, check_last=False)
    assert not isinstance(outcome, WrongAnswer), outcome
    assert f"cheat: {printed_when_not}" in printed


def test_work_deferred_past_the_timer_is_a_wrong_answer():
    outcome, _ = bench(f"{CHEATS}:fills_its_answer_on_a_thread")
    assert isinstance(outcome, WrongAnswer), outcome
    outcome, printed = bench(
        f"{CHEATS}:fills_its_answer_on_a_thread", check_share=0.0, check_last=False,
        judge_clock=False,
    )  # fmt: skip
    assert not isinstance(outcome, WrongAnswer), outcome
    assert "cheat: answer deferred to a thread" in printed
    assert outcome.subject.credible


def test_a_patched_clock_is_not_credible():
    result, _ = bench(f"{CHEATS}:halves_its_clock", MEDIUM, rounds=5)
    assert not result.subject.credible
    assert result.subject.why_not.startswith("timing not credible"), result.subject.why_not
    assert "by the judge's clock three calls in four took at least" in result.subject.why_not
    result, _ = bench(f"{CHEATS}:halves_its_clock", MEDIUM, rounds=5, judge_clock=False)
    assert result.subject.credible, result.subject.why_not


def crowded_bench(fairness: str):
    """The crowding cheat timed against the plain formula at CROWDED, with ``fairness`` on both
    sides; the judge's clock off, so that no timing on a busy machine decides a test."""
    crowder, baseline = open_clients([f"{CHEATS}:crowds_the_machine_between_its_calls",
                                      "tests.planted.clock:correct"])  # fmt: skip
    try:
        result = bench_shape(
            crowder, baseline, CROWDED, "float32", UNBOUNDED, rounds=3, settle_seconds=0.01,
            side_options={"fairness": fairness, "judge_clock": False, "machine_watch": False},
        )  # fmt: skip
        return result, crowder.take_output()
    finally:
        crowder.close()
        baseline.close()


def test_a_candidate_crowding_its_baseline_is_frozen_while_the_baseline_is_timed():
    """A rival's speed cannot be bought: while the baseline is timed, the crowding candidate's
    worker (its spinning processes included) is frozen and runs nothing; watched but not frozen,
    it runs, and the ratio is refused; with neither, it runs beside the baseline and its ratio
    is taken as it came (the cheat goes through). What decides is CPU the crowder ran while it
    was not timed, never how fast anything ran."""
    name = f"{CHEATS}:crowds_the_machine_between_its_calls"
    frozen, printed = crowded_bench(FREEZE)
    assert "processes crowd the machine" in printed, printed
    ran = frozen.sides[1].others_ran[name]
    assert max(ran) <= ALLOWED_CPU_SECONDS, ran
    assert all(side.credible for side in frozen.sides), [s.why_not for s in frozen.sides]
    assert frozen.ratio is not None
    watched, _ = crowded_bench(MEASURE)
    assert not watched.sides[1].credible
    assert watched.sides[1].why_not.startswith(f"timing not fair: {name}'s worker ran")
    assert watched.ratio is None
    unguarded, _ = crowded_bench(OFF)
    assert max(unguarded.sides[1].others_ran[name]) > ALLOWED_CPU_SECONDS
    assert all(side.credible for side in unguarded.sides)
    assert unguarded.ratio is not None


def loaded_bench(machine_watch: bool):
    """The formula timed against numpy at MEDIUM, 12 rounds (over half a second of timed calls a
    side), beside a process spinning on every core of the machine, outside both workers; the
    judge's clock off, so that only the load's watch can refuse."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    subject, baseline = open_clients(["tests.planted.clock:correct", "numpy"])
    try:
        return bench_shape(
            subject, baseline, MEDIUM, "float32", UNBOUNDED, rounds=12, settle_seconds=0.01,
            side_options={"judge_clock": False, "machine_watch": machine_watch},
        )  # fmt: skip
    finally:
        subject.close()
        baseline.close()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_a_bench_beside_a_load_outside_both_workers_refuses_its_ratio_naming_the_load():
    """Other work on the machine bends a ratio with a confident interval: the rest of the
    machine's CPU during each side's timed calls is measured, and a side that shared the cores
    is refused, naming the load. Its watch off, the same bench gives a ratio as if all were
    well. What decides is CPU other processes ran, never how fast anything ran."""
    watched = loaded_bench(machine_watch=True)
    for side in watched.sides:
        assert not side.credible
        assert side.why_not.startswith("timing not fair: other processes of the machine ran")
        assert side.load.others_cores(STANDARD_ERRORS) > ALLOWED_SHARE * side.load.cores
    assert watched.ratio is None
    unwatched = loaded_bench(machine_watch=False)
    assert all(side.credible for side in unwatched.sides), [s.why_not for s in unwatched.sides]
    assert unwatched.ratio is not None


def test_a_stray_tick_is_not_a_load_but_a_load_shown_by_many_is():
    """/proc/stat counts in ticks: one tick of another process in a few milliseconds of calls
    is within the count's noise; the same share over a second of calls is not (synthetic
    counts, no timing)."""
    tick = TICK_SECONDS
    stray = MachineLoad(wall_seconds=0.004, machine_ticks=2, own_seconds=0.004)
    assert stray.others_cores() > ALLOWED_SHARE * stray.cores  # on its face, a load
    assert stray.refusal("timed") is None
    shown = MachineLoad(wall_seconds=1.0, machine_ticks=round(1.9 / tick), own_seconds=1.0)
    assert "ran 0.90 of its" in shown.refusal("timed")
    quiet = MachineLoad(wall_seconds=1.0, machine_ticks=round(1.02 / tick), own_seconds=1.0)
    assert quiet.refusal("timed") is None
    assert MachineLoad(1.0, round(1.9 / tick), 1.0, measured=False).refusal("timed") is None


def test_a_rival_left_busy_on_the_gpu_refuses_the_round():
    """Freezing a worker does not stop kernels it queued: on a GPU the other side's processes
    are watched through NVML's samples during each timed call (stand-in samples here, as
    perf/test_gpu.py's planted kernel left running gives them on a device). A sample of its
    worker busy refuses the round; samples of other processes, or none, do not."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for samples, busy in [
            (lambda since: [(sleeper.pid, since + 10, 87)], 87),  # its worker kept the GPU busy
            (lambda since: [(sleeper.pid + 1, since + 10, 99)], 0),  # another process did
            (lambda since: [(sleeper.pid, since - 10, 99)], 0),  # before the call began
            (lambda since: [], 0),
        ]:
            with Quiet({"rival": sleeper.pid}, OFF, DeviceActivity(samples)) as quiet:
                pass
            assert quiet.busy == {"rival": busy}
            why = unfair("timed", {"rival": [0.0]}, {"rival": [quiet.busy["rival"]]})
            assert (why is not None) == (busy > 0), why
        assert "kept the GPU busy (SM 87 %" in unfair("timed", {}, {"rival": [87]})
        assert not DeviceActivity(None).watched  # no NVML: the CPU's watch alone
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_implementation_timed_against_itself_is_not_frozen_under_its_own_call():
    """One selector on both sides is one worker: freezing "the other side" would freeze the
    call being timed (it hung until the call deadline)."""
    [client] = open_clients(["tests.planted.clock:correct"], call_timeout=20)
    try:
        result = bench_shape(client, client, SMALL, "float32", UNBOUNDED, rounds=2,
                             settle_seconds=0.01,
                             side_options={"judge_clock": False, "machine_watch": False},
                             )  # fmt: skip
    finally:
        client.close()
    assert all(side.credible for side in result.sides), [s.why_not for s in result.sides]


def test_the_backward_is_timed_with_its_gradients_checked_and_a_wrong_one_is_not_timed():
    """--backward times vjp, forward and backward, and checks its gradients as outputs are: a
    backward that drops the keys of a last partial tile (Tk = 100) is not timed, one that does
    not is, with FLOPs 3.5x the forward's."""
    shape = BenchShape("partial", 1, 2, 2, 100, 100, 16, "a test's")
    timed, _ = bench("tests.zoo.backward:flash_backward_from_the_lse", shape, backward=True)
    assert not isinstance(timed, WrongAnswer), timed
    assert timed.timed_pass == "forward+backward"
    assert timed.subject.checked >= 2  # the first call and the last timed one
    assert timed.subject.flops == call_flops(shape, causal=True, backward=True)
    wrong, _ = bench("tests.zoo.backward:last_partial_tile_without_gradient", shape, backward=True)
    assert isinstance(wrong, WrongAnswer), wrong
    assert "dk is wrong in its first call" in str(wrong)
    assert "forward and backward" in str(wrong)


def fp8_bench(selector: str, baseline: str | None = None, query_dtype: str | None = None):
    """An FP8 bench of ``selector`` in e4m3fn at a grouped-heads shape (two items): its result
    or the WrongAnswer it raised."""
    shape = BenchShape("fp8", 2, 4, 2, 64, 64, 16, "a test's")
    clients = open_clients([selector] + ([baseline] if baseline else []))
    try:
        return bench_shape(
            clients[0], clients[1] if baseline else None, shape, "float8_e4m3fn", UNBOUNDED,
            rounds=2, settle_seconds=0.01, query_dtype=query_dtype, baseline_dtype="float32",
        )  # fmt: skip
    except WrongAnswer as exc:
        return exc
    finally:
        for client in clients:
            client.close()


def test_an_fp8_call_is_timed_against_its_baseline_in_another_dtype_and_checked_as_fp8():
    """An FP8 subject's answers are held to the formula on its dequantized inputs, within the
    budget of the arithmetic it declares (FlashAttention 3's P in e4m3 for numpy_flash), its
    baseline timed in its own dtype; an FP8 kernel that drops v's scale, or reads e4m3fn bytes
    as e4m3fnuz, is not timed."""
    timed = fp8_bench("numpy_flash", baseline="numpy")
    assert not isinstance(timed, WrongAnswer), timed
    assert [side.dtype for side in timed.sides] == ["float8_e4m3fn", "float32"]
    assert timed.subject.checked >= 2
    assert timed.subject.bytes_moved == call_bytes(timed.shape, "float8_e4m3fn")
    assert timed.sides[1].bytes_moved == 4 * timed.subject.bytes_moved
    kv_cache = fp8_bench("numpy_flash", query_dtype="float32")
    assert not isinstance(kv_cache, WrongAnswer), kv_cache
    dropped = fp8_bench("tests.zoo.fp8:v_scale_never_applied", query_dtype="float32")
    assert isinstance(dropped, WrongAnswer), dropped
    assert "k and v float8_e4m3fn with per-kv-head scales" in str(dropped)
    misread = fp8_bench("tests.zoo.fp8:e4m3fn_read_as_fnuz")
    assert isinstance(misread, WrongAnswer), misread
    assert "||out|| / ||truth||" in str(misread)


BLOCK_SHAPE = BenchShape("block", 2, 4, 2, 64, 64, 64, "a test's")


LATENT_SHAPE = BenchShape("latent", 1, 4, 1, 8, 64, 576, "a test's", value_dim=512)


def block_bench(selector: str, fmt: str, query_dtype: str | None = None, shape=BLOCK_SHAPE):
    """A bench of ``selector``'s block-scaled call in ``fmt`` at a grouped-heads shape (two
    items), against numpy in float32: its result or the WrongAnswer it raised."""
    subject, baseline = open_clients([selector, "numpy"])
    try:
        return bench_shape(
            subject, baseline, shape, fmt, UNBOUNDED, rounds=2, settle_seconds=0.01,
            baseline_dtype="float32", query_dtype=query_dtype,
        )  # fmt: skip
    except WrongAnswer as exc:
        return exc
    finally:
        subject.close()
        baseline.close()


@pytest.mark.parametrize(
    ("fmt", "mutant"),
    [("mxfp8_e4m3", "e8m0_decoded_with_bias_128"), ("nvfp4", "nvfp4_output_halved")],
)
def test_a_block_scaled_call_is_timed_in_its_convention_and_checked_on_its_blocks(fmt, mutant):
    """--dtype mxfp8_e4m3 times MXFP8 attention, --dtype nvfp4 an NVFP4 key/value cache (q in
    bfloat16, or --kv-cache-query's dtype), each drawn afresh and quantized by its recipe in the
    worker, each answer held to the formula on its dequantized inputs; the zoo's kernels that
    decode e8m0 with a bias of 128 or halve NVFP4's output are not timed."""
    timed = block_bench("numpy_flash", fmt)
    assert not isinstance(timed, WrongAnswer), timed
    assert [side.dtype for side in timed.sides] == [fmt, "float32"]
    assert timed.subject.checked >= 2
    assert timed.subject.bytes_moved == call_bytes(timed.shape, fmt)
    # the zoo's kernels take q in float32 under fp4_cache
    query_dtype = "float32" if fmt == "nvfp4" else None
    wrong = block_bench(f"tests.zoo.block_scaled:{mutant}", fmt, query_dtype)
    assert isinstance(wrong, WrongAnswer), wrong
    assert "is wrong in its first call" in str(wrong)
    assert f"{fmt} (" in str(wrong)  # the call's format and convention


def test_a_latent_cache_is_timed_at_its_widths_and_checked_on_its_bytes():
    """--dtype deepseek_v32 times DeepSeek's latent cache at a shape of its widths (D = 576, Dv =
    512, one key/value head), each answer held to the formula on the decoded tokens; the zoo's
    kernel that reads the rotary part as e4m3 is not timed."""
    timed = block_bench("numpy_flash", "deepseek_v32", shape=LATENT_SHAPE)
    assert not isinstance(timed, WrongAnswer), timed
    assert timed.subject.checked >= 2
    wrong = block_bench("tests.zoo.block_scaled:mla_rope_read_as_e4m3", "deepseek_v32",
                        "float32", shape=LATENT_SHAPE)  # fmt: skip
    assert isinstance(wrong, WrongAnswer), wrong
    assert "deepseek_v32 (mla_fp8_cache, q float32)" in str(wrong)


def test_a_block_scaled_bench_refuses_what_cannot_be_timed_naming_why():
    [numpy_flash, plain] = open_clients(["numpy_flash", "tests.planted.clock:correct"])
    try:
        assert "does not declare block_scaled" in refusal(plain, BLOCK_SHAPE, "mxfp8_e4m3")
        odd = BenchShape("odd", 1, 2, 2, 64, 64, 48, "a test's")  # D = 48: no blocks of 32
        assert "not a multiple of the block (32)" in refusal(numpy_flash, odd, "mxfp8_e4m3")
        assert "timed forward only" in refusal(numpy_flash, BLOCK_SHAPE, "nvfp4", backward=True)
        assert "keys and values have D=576, Dv=512" in refusal(numpy_flash, BLOCK_SHAPE,
                                                               "deepseek_v32")  # fmt: skip
        assert "is a cache's" in refusal(numpy_flash, BLOCK_SHAPE, "mxfp8_e4m3",
                                         query_dtype="bfloat16")  # fmt: skip
    finally:
        numpy_flash.close()
        plain.close()


def test_a_time_below_the_roofline_is_not_credible_whatever_the_clocks_say():
    slow_machine = Machine("cpu", 1.0, 1.0, "a machine of one FLOP and one byte a second")
    result, _ = bench("tests.planted.clock:correct", machine=slow_machine)
    assert not result.subject.credible
    assert "below the least time the machine allows" in result.subject.why_not


def test_peaks_measured_low_are_measured_again_before_a_time_is_called_impossible():
    """A busy machine measures its peaks low: a time below the bound they give is judged again
    against a new measurement, the better of each peak kept (here the new one never binds)."""
    measured_low = Machine(
        "cpu", 1.0, 1.0, "peaks measured on a busy machine", measure_again=lambda: UNBOUNDED
    )
    result, _ = bench("tests.planted.clock:correct", machine=measured_low, judge_clock=False)
    assert result.subject.credible, result.subject.why_not
    assert result.machine.flops_per_second == UNBOUNDED.flops_per_second
    assert "measured again before calling a time impossible" in result.machine.source


def test_the_roofline_counts_the_flops_and_bytes_of_the_call():
    andrea = NAMED_SHAPES["andrea"]
    assert call_flops(andrea, causal=True) == 4 * 12 * 1024 * 1024 * 64 / 2
    assert call_bytes(andrea, "float32") == 4 * 4 * 12 * 1024 * 64
    # forward and backward: 3.5x the FLOPs; q, k, v, dO read and dq, dk, dv written
    assert call_flops(andrea, causal=True, backward=True) == 3.5 * 4 * 12 * 1024 * 1024 * 64 / 2
    assert call_bytes(andrea, "float32", backward=True) == 7 * 4 * 12 * 1024 * 64
    decode = NAMED_SHAPES["llama3-8b-decode"]  # k and v of 8 heads of 4096 keys dominate
    assert call_bytes(decode, "bfloat16") == 2 * 16 * 128 * (2 * 32 * 1 + 2 * 8 * 4096)
    machine = Machine("cpu", 1e11, 1e10, "")
    assert machine.bound_seconds(1e11, 1e9) == 1.0
    assert machine.bound_seconds(1e9, 1e11) == 10.0


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [(0.8, 0.95, PASSES), (1.02, 1.3, FAILS), (0.9, 1.1, INCONCLUSIVE)],
)
def test_the_gate_passes_fails_or_says_it_cannot_tell(low, high, verdict):
    assert gate_verdict(RatioInterval((low + high) / 2, low, high), max_ratio=1.0) == verdict


def test_a_ratio_interval_from_noisy_rounds_straddles_a_gate_near_it():
    subject = [1.0, 1.3, 0.9, 1.2, 1.1, 0.8, 1.25, 0.95]  # synthetic seconds, no timing
    baseline = [1.0] * 8
    interval = ratio_interval(subject, baseline)
    assert interval.low < 1.05 < interval.high
    assert gate_verdict(interval, 1.05) == INCONCLUSIVE
    assert exit_status([INCONCLUSIVE], []) == EXIT_INCONCLUSIVE
    assert exit_status([PASSES, INCONCLUSIVE], ["a wrong answer"]) == EXIT_FAILS
    assert exit_status([PASSES], []) == EXIT_PASSES


def test_a_gate_file_with_a_gate_the_subject_cannot_meet_fails_the_run(tmp_path):
    # Calls of about 10 ms: the judge's clock allows half a call plus 3 ms, which sub-millisecond
    # calls on a busy machine (T = 64: judged 3.5 ms late beside a CI run) could exceed, so that
    # the machine's load, not the gate, decided the verdict.
    gates = tmp_path / "gates.toml"
    gates.write_text(
        '[[gate]]\nid = "IMPOSSIBLE"\ndevice = "cpu"\nsubject = "numpy"\nbaseline = "numpy"\n'
        'shape = { batch = 1, heads = 8, t = 512, head_dim = 64 }\ndtype = "float32"\n'
        'causal = true\nmax_time_ratio = 0.01\nreason = "no implementation is 100x faster '
        'than itself"\n'
    )
    report = tmp_path / "bench.json"
    run = attnspec("bench", "--impl", "numpy", "--gates", str(gates), "--rounds", "5",
                   "--report-json", str(report))  # fmt: skip
    assert run.returncode == EXIT_FAILS, run.stdout + run.stderr
    data = json.loads(report.read_text())
    assert data["schema"] == "attnspec-bench/1"
    [result] = data["results"]
    # A loaded machine can still make the judge's clock call a side not credible, which fails
    # the run as well and leaves the gate unjudged (the table says which): the load, not the
    # gate, must not decide whether this test passes. Quiet, the gate itself FAILS.
    assert result["verdict"] in (FAILS, NOT_CREDIBLE), result
    if result["verdict"] == FAILS:
        assert "vs <= 0.01: FAILS" in run.stdout
    else:
        assert "timing not credible" in run.stdout or "timing not fair" in run.stdout, run.stdout
    assert [side["name"] for side in result["implementations"]] == ["numpy", "numpy"]
    assert result["implementations"][0]["answers_checked"] >= 2


@pytest.mark.optional_libraries
def test_a_sweep_times_each_length_and_plots_throughput_against_it(tmp_path):
    png, page = tmp_path / "sweep.png", tmp_path / "sweep.html"
    run = attnspec("bench", "--impl", "numpy", "--baseline", "none", "--shape", "1,2,2,64,64,16",
                   "--sweep", "T=32,64", "--rounds", "3", "--plot", str(png),
                   "--report-html", str(page))  # fmt: skip
    # Sub-millisecond calls: on a loaded machine the judge's clock may call one not credible, or
    # the load's watch refuse it, which the table says and the status counts; the sweep and its
    # plot are this test's
    problems = [line for line in run.stdout.splitlines() if line.startswith("attnspec bench: 1,")]
    refusals = ("timing not credible", "timing not fair: other processes of the machine")
    assert all(any(why in line for why in refusals) for line in problems), run.stdout + run.stderr
    assert run.returncode == (EXIT_FAILS if problems else EXIT_PASSES), run.stdout + run.stderr
    assert "torch_sdpa" not in run.stdout  # --baseline none: no baseline opened
    rows = [line for line in run.stdout.splitlines() if "@T=" in line and line not in problems]
    assert [row.split()[0] for row in rows] == [
        "1,2,2,64,64,16@T=32", "1,2,2,64,64,16@T=64",
    ]  # fmt: skip
    if importlib.util.find_spec("matplotlib"):
        assert png.read_bytes().startswith(b"\x89PNG"), run.stdout
        assert "data:image/png;base64," in page.read_text()
        assert "@T=64" in page.read_text()  # the table under the plot
    else:
        assert "no plot: matplotlib is not installed" in run.stdout
        assert not png.exists()


def test_bad_options_get_a_clear_error():
    run = attnspec("bench", "--impl", "numpy", "--shape", "1,2,3")
    assert run.returncode == 2
    assert "is neither a named shape" in run.stderr
    run = attnspec("bench", "--impl", "numpy", "--max-ratio", "-1")
    assert run.returncode == 2
    assert "a ratio is a number above 0" in run.stderr
    run = attnspec("bench", "--impl", "no_such_module:attention", "--baseline", "none")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "no_such_module" in run.stderr
    run = attnspec("bench")
    assert run.returncode == 2
    assert "give --impl SELECTOR (what to time), or --gates FILE" in run.stderr
    run = attnspec("bench", "--impl", "numpy", "--kv-cache-query", "bfloat16")
    assert run.returncode == 2
    assert "give an FP8 or FP4 --dtype too" in run.stderr
    assert "not the default" in run.stderr
    run = attnspec("bench", "--gates", str(GATES_PATH), "--shape", "andrea", "--max-ratio", "2")
    assert run.returncode == 2
    assert "--shape and --max-ratio beside --gates" in run.stderr
    run = attnspec("bench", "--gates", str(GATES_PATH), "--impl", "mykernel:attention")
    assert run.returncode == 2
    assert "has no gate for mykernel:attention (its subjects: cupy_flash, numpy)" in run.stderr


def test_named_shapes_say_where_they_come_from_and_custom_ones_parse():
    assert all(shape.source for shape in NAMED_SHAPES.values())
    assert parse_shape("2,32,8,1,4096,128").dims == (2, 32, 8, 1, 4096, 128)


def side_with(reported: list[float], judged: list[float]) -> TimedSide:
    """A TimedSide holding these measurements, without a worker (no timing here decides)."""
    side = TimedSide.__new__(TimedSide)
    side.client, side.echoes, side.judge_clock = SimpleNamespace(name="k"), [0.003], True
    side.seconds, side.judged = reported, judged
    side.fairness, side.others_ran, side.others_busy = FREEZE, {}, {}
    side.load, side.machine_watch = MachineLoad(), True
    return side


def test_what_the_judges_clock_allows_and_what_it_contradicts():
    calls = [0.030, 0.031, 0.029, 0.030, 0.032]  # judged: each request less the line before it
    assert side_with(calls, [c + 0.001 for c in calls]).contradiction() is None  # the line
    assert side_with(calls, [c * 1.4 for c in calls]).contradiction() is None  # a busy machine
    assert side_with(calls, [c * 2 for c in calls]).contradiction()  # a clock at half speed
    assert side_with(calls, [c * 0.7 for c in calls]).contradiction()  # shorter than reported
    # torch_sdpa's 2 ms calls at T = 256, a scheduler's slice late on some (seen on four of eight)
    short = [0.0016, 0.0019, 0.0026, 0.0018, 0.0017, 0.0020, 0.0019, 0.0023]
    late = [c + (0.011 if n in (2, 5, 7) else 0.0015) for n, c in enumerate(short)]
    assert side_with(short, late).contradiction() is None
    assert side_with(calls, [c * 3 for c in calls]).contradiction()  # a clock at a third


def test_the_cuda_kernels_own_code_is_benched_where_no_gpu_is():
    """impls/cupy_flash.cu's kernels, emulated on the host (tests/cuda_emulation): validated,
    timed and checked as on a GPU, by the CPU's clock (the emulation cannot time a GPU)."""
    # A timing refused is the bench refusing a clock a loaded machine skewed (numpy's
    # half-millisecond calls beside CI's other processes), or the load itself: asked again, up
    # to three times; any other outcome stands at once. Refused all three times, the table
    # still says what was timed, and the load, not the kernel, decided nothing.
    for _ in range(3):
        run = attnspec("bench", "--impl", "tests.cuda_emulation:flash", "--baseline", "numpy",
                       "--shape", "1,2,2,64,64,32", "--rounds", "3")  # fmt: skip
        said = run.stdout + run.stderr
        refused = "timing not credible" in said or "timing not fair" in said
        if run.returncode == EXIT_PASSES or not refused:
            break
    if "no C++20 compiler" in said:
        pytest.skip("the emulation needs a C++20 compiler")
    rows = [line.split() for line in run.stdout.splitlines()]
    assert ["1,2,2,64,64,32", "cupy_flash_emulated"] in [row[:2] for row in rows], run.stdout
    if run.returncode == EXIT_FAILS and refused and "is wrong" not in said:
        return
    assert run.returncode == EXIT_PASSES, said
    assert any(row[:1] == ["ratio"] for row in rows), run.stdout


class Recorded:
    """A CUDA event that records when it was recorded and synchronised, in one shared log."""

    def __init__(self, log: list):
        self.log = log

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("event synchronize")


def stand_in_clock(log: list, flush: bool = True, device=None) -> DeviceClock:
    """The GPU path of the worker's clock with stand-ins that write what they do in ``log``."""
    return DeviceClock(
        lambda: Recorded(log),
        lambda first, last: 0.004,
        (lambda: log.append("flush")) if flush else None,
        device or (lambda: log.append("device idle")),
        lambda: log.append("persisting L2 set to 0"),
    )


def test_a_gpu_clock_flushes_first_and_reads_the_answer_outside_its_window():
    """The GPU path of the worker's clock (impls.device_clock.DeviceClock) with stand-ins: the
    whole device idle before the window (nothing of an earlier call, or of another stream, still
    running), the L2's persisting carve-out set to 0 before the flush (a persisting window
    survives a flush), the copy to the host after the last event, and the device idle again
    before a second reading; without a flush or a carve-out when warm."""
    log: list[str] = []
    clock = stand_in_clock(log)
    clock.start()
    log.append("call")
    assert clock.stop(lambda: log.append("read") or [1.0]) == 0.004
    assert log == ["device idle", "persisting L2 set to 0", "flush", "record", "call", "record",
                   "event synchronize", "read", "device idle", "read"]  # fmt: skip
    warm = stand_in_clock(log, flush=False)
    log.clear()
    warm.start()
    assert log == ["device idle", "record"]
    cpu = DeviceClock()  # the CPU's clock: the answer is read inside the window
    cpu.start()
    cpu.stop(lambda: log.append("read on the cpu"))
    assert log[-1] == "read on the cpu"


def test_an_answer_still_written_after_the_call_returned_breaks_the_contract():
    """A kernel whose answer is finished on a stream the call did not wait for: read at the
    last event it is not yet written, read once the whole device is idle it is. The stand-in
    device finishes the pending write when it is synchronised."""
    answer = np.zeros(4)
    pending = [lambda: answer.__setitem__(slice(None), 1.0)]

    def device_idle():
        while pending:
            pending.pop()()

    clock = stand_in_clock([], device=device_idle)
    pending.clear()  # nothing in flight before the window opens
    clock.start()
    pending.append(lambda: answer.__setitem__(slice(None), 1.0))  # the call's hidden stream
    with pytest.raises(AnswerStillWritten, match="still being written"):
        clock.stop(lambda: answer.copy())
    honest = stand_in_clock([], device=device_idle)
    honest.start()
    assert honest.stop(lambda: answer.copy()) == 0.004  # written before it returned
