"""Where the built-ins sit inside their tolerance budgets: ``python -m conformance.survey``
prints, per implementation and dtype, the worst error as a fraction of the budget and against the
naive baseline's error, over a few shapes, then each dtype's budget and its reason."""

from __future__ import annotations

from conformance.judge.harness import Case, Subject
from conformance.judge.tolerance import BUDGETS, compare_to_oracle
from conformance.report.tables import text_table
from conformance.run.workers import open_clients
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


def main() -> None:
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


if __name__ == "__main__":
    main()
