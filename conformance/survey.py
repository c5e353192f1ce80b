"""Where the built-ins sit inside their tolerance budgets: ``python -m conformance.survey``
prints, per implementation and dtype, the worst error as a fraction of the budget and against the
naive baseline's error, over a few shapes, then each dtype's budget and its reason.
``--gradients --seeds N`` does the same for every gradient claim's cases over N seeds, with the
median of each seed's worst and the case and seed of the worst; ``--fp8 --seeds N`` for every FP8
claim's calls, per implementation declaring FP8 and output dtype."""

from __future__ import annotations

import argparse

import numpy as np

from conformance.judge.fp8 import fp8_budget
from conformance.judge.gradients import judged_gradients, undefined_gradient
from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import BUDGETS, GRADIENT_BUDGETS, compare_to_oracle
from conformance.report.tables import text_table
from conformance.run.worker_clients import open_clients
from impls.registry import BUILTINS


def survey(implementations, cases) -> list[tuple[str, str, float, float]]:
    """(implementation, dtype, worst budget fraction, worst error / baseline error) per dtype."""
    rows = []
    for impl in implementations:
        if impl.unavailable_reason():
            continue
        for dtype in impl.capabilities.dtypes:
            worst_fraction = worst_ratio = 0.0
            for number, case in enumerate(cases):
                case = case.with_(dtype=dtype)
                subject = Subject(impl, impl.name, seed=number, test_id="survey")
                q, k, v = subject.inputs(case)
                result = compare_to_oracle(
                    subject.call(case, q, k, v),
                    q,
                    k,
                    v,
                    dtype=dtype,
                    causal=case.causal,
                    scale=case.scale,
                )
                worst_fraction = max(worst_fraction, result.budget_fraction)
                if result.baseline_error > 0:
                    worst_ratio = max(worst_ratio, result.max_abs / result.baseline_error)
            rows.append((impl.name, dtype, worst_fraction, worst_ratio))
    return rows


def gradient_cases() -> dict[str, tuple[Case, float]]:
    """Every gradient test's case by id, with its inputs' spread: OUT-GRAD's
    (conformance/test_output.py) and each feature's (conformance/test_gradients.py)."""
    from conformance.judge.tables import BACKWARD_CASES, GRADIENT_CASES

    return {
        **{f"OUT-GRAD {name}": case for name, case in GRADIENT_CASES.items()},
        **{f"{row.marks[0].args[0]} {row.id}": tuple(row.values) for row in BACKWARD_CASES},
    }


def survey_gradients(implementations, seeds) -> list[tuple]:
    """(implementation, dtype, worst budget fraction, median of each run's worst, worst error /
    baseline error, the case and seed of the worst) over every gradient case and ``seeds``, each
    case's inputs drawn as its test draws them from that seed."""
    rows = []
    cases = gradient_cases()
    for impl in implementations:
        if impl.unavailable_reason() or not impl.capabilities.autograd:
            continue
        for dtype in impl.capabilities.dtypes:
            worst, ratio, fractions = (0.0, "", 0), 0.0, []
            for seed in seeds:
                run_worst = 0.0
                for name, (case, spread) in cases.items():
                    subject = Subject(impl, impl.name, seed=seed, test_id=f"survey {name}")
                    case = subject.fit(case.with_(dtype=dtype))
                    if subject.missing(case, autograd=True) or undefined_gradient(subject, case):
                        continue
                    _, comparisons, _ = judged_gradients(subject, case, spread=spread)
                    for result in comparisons.values():
                        run_worst = max(run_worst, result.budget_fraction)
                        if result.budget_fraction > worst[0]:
                            worst = (result.budget_fraction, name, seed)
                        if result.baseline_error > 0:
                            ratio = max(ratio, result.max_abs / result.baseline_error)
                fractions.append(run_worst)
            rows.append((impl.name, dtype, worst[0], float(np.median(fractions)), ratio,
                         f"{worst[1]}, seed {worst[2]}"))  # fmt: skip
    return rows


def survey_fp8(implementations, seeds) -> list[tuple]:
    """As :func:`survey_gradients`, over every FP8 test's call (conformance/test_fp8.py's
    FP8_CALLS) as it draws it from each seed, per implementation declaring FP8 and output dtype
    (a descale call's declared, a key/value cache call's q's)."""
    from conformance.judge.fp8 import call_fp8, compare_fp8, output_dtype
    from conformance.judge.fp8_calls import FP8_CALLS

    rows = []
    for impl in implementations:
        if impl.unavailable_reason() or not impl.capabilities.fp8:
            continue
        results = {}  # output dtype -> (worst, its call and seed, ratio, each seed's worst)
        for seed in seeds:
            seed_worst = {}
            for name, (make, arguments) in FP8_CALLS.items():
                subject = Subject(impl, impl.name, seed=seed, test_id=f"survey {name}")
                case, inputs = make(subject, *arguments)
                if subject.missing(case):
                    continue
                out_dtype = output_dtype(subject, case)
                result = compare_fp8(call_fp8(subject, case, inputs), inputs,
                                     causal=case.causal, scale=case.scale,
                                     p_rounding=impl.capabilities.fp8_p,
                                     out_dtype=out_dtype).elements  # fmt: skip
                worst, where, ratio, _ = results.setdefault(out_dtype, (0.0, "", 0.0, []))
                if result.budget_fraction > worst:
                    worst, where = result.budget_fraction, f"{name}, seed {seed}"
                if result.baseline_error > 0:
                    ratio = max(ratio, result.max_abs / result.baseline_error)
                results[out_dtype] = (worst, where, ratio, results[out_dtype][3])
                seed_worst[out_dtype] = max(seed_worst.get(out_dtype, 0.0), result.budget_fraction)
            for out_dtype, fraction in seed_worst.items():
                results[out_dtype][3].append(fraction)
        for out_dtype, (worst, where, ratio, fractions) in results.items():
            rows.append((impl.name, f"{impl.capabilities.fp8_p} -> {out_dtype}", worst,
                         float(np.median(fractions)), ratio, where))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m conformance.survey", description=__doc__)
    parser.add_argument(
        "--gradients",
        action="store_true",
        help="survey the gradient claims' cases instead of outputs",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=50,
        metavar="N",
        help="seeds of every gradient case the gradient survey runs (default: %(default)s)",
    )
    parser.add_argument(
        "--fp8",
        action="store_true",
        help="survey the FP8 claims' calls of the built-ins declaring FP8 instead of outputs",
    )
    parser.add_argument(
        "--impl",
        action="append",
        metavar="SPEC",
        help="with --gradients or --fp8: survey this implementation (a built-in's name or "
        "package.module:attr; repeatable) instead of the CPU built-ins",
    )
    options = parser.parse_args()
    if options.impl and not (options.gradients or options.fp8):
        parser.error("--impl takes --gradients or --fp8")
    if options.seeds < 1:
        parser.error(f"--seeds={options.seeds}, but should be at least 1")
    if options.gradients and options.fp8:
        parser.error("--gradients and --fp8 are two surveys: choose one")
    if options.gradients or options.fp8:
        main_seeded(range(options.seeds), fp8=options.fp8, selectors=options.impl)
        return
    cases = [
        Case(batch=1, heads=2, tq=tq, tk=tk, head_dim=d, causal=causal)
        for tq, tk, d in (
            (1024, 1024, 64),
            (129, 129, 64),
            (65, 65, 256),
            (64, 1024, 32),
            (17, 17, 1),
        )
        for causal in (True, False)
    ]
    clients = open_clients(list(BUILTINS))
    try:
        rows = [
            (name, dtype, f"{fraction:.3f}", f"{ratio:.2f}" if ratio else "(exact)")
            for name, dtype, fraction, ratio in survey(clients, cases)
        ]
    finally:
        for client in clients:
            client.close()
    for line in text_table(
        [("implementation", "dtype", "of budget", "err/baseline"), *rows], right=(2, 3)
    ):
        print(line)
    for budget in BUDGETS.values():
        print(
            f"\n{budget.dtype}: {budget.baseline_factor:g} x baseline + {budget.floor_u:g}u floor. "
            f"{budget.reason}"
        )


def main_seeded(seeds, *, fp8: bool, selectors: list[str] | None = None) -> None:
    """The gradient survey, or with ``fp8`` the FP8 one, over ``seeds``, of ``selectors`` or the
    CPU built-ins."""
    clients = open_clients(selectors or [name for name in BUILTINS if not name.endswith("_cuda")])
    surveyed = survey_fp8 if fp8 else survey_gradients
    try:
        rows = [
            (name, dtype, f"{worst:.3f}", f"{median:.3f}", f"{ratio:.2f}" if ratio else "(exact)",
             where)
            for name, dtype, worst, median, ratio, where in surveyed(clients, seeds)
        ]  # fmt: skip
    finally:
        for client in clients:
            client.close()
    header = ("implementation", "P -> out" if fp8 else "dtype", "worst", "median", "err/baseline",
              "worst at")  # fmt: skip
    for line in text_table([header, *rows], right=(2, 3, 4)):
        print(line)
    if fp8:
        print(f"\nFP8: {fp8_budget('<out>', '<P>').reason}.")
        return
    for budget in GRADIENT_BUDGETS.values():
        print(
            f"\n{budget.dtype} gradients: {budget.baseline_factor:g} x baseline + "
            f"{budget.floor_u:g}u floor. {budget.reason}"
        )


if __name__ == "__main__":
    main()
