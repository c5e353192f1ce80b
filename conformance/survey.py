"""Where the built-ins sit inside their tolerance budgets: ``python -m conformance.survey``
prints, per implementation and dtype, the worst error as a fraction of the budget and against the
naive baseline's error, over a few shapes, then each dtype's budget and its reason.
``--gradients --seeds N`` does the same for OUT-GRAD's gradients over N seeds of its case, naming
the seed of the worst."""

from __future__ import annotations

import argparse

import numpy as np

from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import (
    BUDGETS,
    GRADIENT_BUDGETS,
    compare_gradients,
    compare_to_oracle,
)
from conformance.report.tables import text_table
from conformance.run.worker_clients import open_clients
from impls.registry import BUILTINS
from spec.dtypes import round_to


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


# OUT-GRAD's case (conformance/test_output.py), causal on even seeds
GRADIENT_SHAPES = {"q": (2, 2, 37, 16), "k": (2, 2, 53, 16), "v": (2, 2, 53, 16)}


def gradient_inputs(seed: int, dtype: str):
    """(q, k, v, grad_out, causal) of the gradient survey's ``seed``, exact in ``dtype``."""
    rng = np.random.default_rng(seed)
    q, k, v = (round_to(rng.standard_normal(shape), dtype) for shape in GRADIENT_SHAPES.values())
    grad_out = round_to(rng.standard_normal(GRADIENT_SHAPES["q"]), dtype)
    return q, k, v, grad_out, seed % 2 == 0


def survey_gradients(implementations, seeds: int) -> list[tuple[str, str, float, float, int]]:
    """(implementation, dtype, worst budget fraction, worst error / baseline error, its seed)."""
    rows = []
    for impl in implementations:
        if impl.unavailable_reason() or not impl.capabilities.autograd:
            continue
        for dtype in impl.capabilities.dtypes:
            worst_fraction = worst_ratio = 0.0
            worst_seed = 0
            for seed in range(seeds):
                q, k, v, grad_out, causal = gradient_inputs(seed, dtype)
                native = (impl.from_numpy(x, dtype) for x in (q, k, v, grad_out))
                grads = [
                    impl.to_numpy(grad).astype(np.float64)
                    for grad in impl.vjp(*native, causal=causal, scale=None)
                ]
                for result in compare_gradients(
                    grads, q, k, v, grad_out, dtype=dtype, causal=causal
                ).values():
                    if result.budget_fraction > worst_fraction:
                        worst_fraction, worst_seed = result.budget_fraction, seed
                    if result.baseline_error > 0:
                        worst_ratio = max(worst_ratio, result.max_abs / result.baseline_error)
            rows.append((impl.name, dtype, worst_fraction, worst_ratio, worst_seed))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m conformance.survey", description=__doc__)
    parser.add_argument(
        "--gradients", action="store_true", help="survey OUT-GRAD's gradients instead of outputs"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=200,
        metavar="N",
        help="seeds of OUT-GRAD's case the gradient survey runs (default: %(default)s)",
    )
    options = parser.parse_args()
    if options.seeds < 1:
        parser.error(f"--seeds={options.seeds}, but should be at least 1")
    if options.gradients:
        main_gradients(options.seeds)
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


def main_gradients(seeds: int) -> None:
    clients = open_clients([name for name in BUILTINS if not name.endswith("_cuda")])
    try:
        rows = [
            (name, dtype, f"{fraction:.3f}", f"{ratio:.2f}" if ratio else "(exact)", str(seed))
            for name, dtype, fraction, ratio, seed in survey_gradients(clients, seeds)
        ]
    finally:
        for client in clients:
            client.close()
    header = ("implementation", "dtype", "of budget", "err/baseline", "worst seed")
    for line in text_table([header, *rows], right=(2, 3, 4)):
        print(line)
    for budget in GRADIENT_BUDGETS.values():
        print(
            f"\n{budget.dtype} gradients: {budget.baseline_factor:g} x baseline + "
            f"{budget.floor_u:g}u floor. {budget.reason}"
        )


if __name__ == "__main__":
    main()
