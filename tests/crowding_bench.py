"""The crowding candidate (tests/planted/cheats.py) timed against the formula it wraps at the
ANDREA shape, with the bench's fairness defence as each argument says (docs/performance.md):

    python -m tests.crowding_bench off freeze      # about a minute each

``off``: neither frozen nor watched; ``measure``: watched only; ``freeze``: what attnspec bench
does. Prints each side's median, whether it is credible, and the ratio's interval.
"""

from __future__ import annotations

import sys

from conformance.bench.fairness import FREEZE, MEASURE, OFF
from conformance.bench.measure import bench_shape
from conformance.bench.roofline import measure_cpu
from conformance.bench.shapes import NAMED_SHAPES
from conformance.run.worker_clients import open_clients

CROWDER = "tests.planted.cheats:crowds_the_machine_between_its_calls"
FORMULA = "tests.planted.clock:correct"


def main(argv: list[str]) -> int:
    modes = argv or [OFF, FREEZE]
    unknown = [mode for mode in modes if mode not in (OFF, MEASURE, FREEZE)]
    if unknown:
        print(f"crowding_bench: {unknown}, but each should be {OFF}, {MEASURE} or {FREEZE}")
        return 2
    machine = measure_cpu("float32")
    for mode in modes:
        crowder, formula = open_clients([CROWDER, FORMULA])
        try:
            result = bench_shape(
                crowder, formula, NAMED_SHAPES["andrea"], "float32", machine, rounds=15,
                side_options={"fairness": mode},
            )  # fmt: skip
        finally:
            crowder.close()
            formula.close()
        sides = ", ".join(
            f"{side.name.split(':')[-1]} {side.median * 1e3:.1f} ms"
            + ("" if side.credible else f" (not credible: {side.why_not})")
            for side in result.sides
        )
        ratio = result.ratio
        interval = f"{ratio.median:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]" if ratio else "none"
        print(f"{mode}: {sides}; ratio {interval}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
