"""Timing an implementation in its own worker, and checking the worker's clock against the
judge's.

A kernel judged for speed in the judge's process could patch the clock it is timed by. Timed in
its worker, it can still patch that process's clock; what it cannot touch is the judge's. Each
request is a batch of calls: before each, the worker sleeps ``settle_seconds``; it times each
call and reports them, while the judge times the whole request. What the judge's clock leaves for
the batch's calls (the request, less the pauses and the line's own cost, measured beforehand with
requests that time nothing) must match the sum the worker reported, within the bounds below; a
report the judge's clock contradicts is a timing that is not credible. A batch spreads what
follows a call (a thread pool winding down, which the next pause absorbs but the reply does not)
over several calls.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from conformance.run.worker_clients import ImplementationClient
from impls.messages import InputArray

OVERHEAD_PROBES = 5  # requests that time no call, for the line's own cost
# A call's time as the judge's clock bounds it may exceed the worker's report by this share of
# the report, or fall short of it by SHORTER_SHARE, each plus SLACK_SECONDS (a scheduler's
# slice), before the report is not credible. A busy machine only lengthens the judge's view, so
# short of the report is held closer: a clock at half speed is twice off, a skipped pause short
# by the whole pause.
LONGER_SHARE, SHORTER_SHARE = 0.5, 0.1
SLACK_SECONDS = 0.002
BATCH = 5  # calls per request


@dataclass
class WorkerClock:
    """One implementation's timed calls on fixed inputs, as a call for perf.timing.interleaved
    (with ``timer=WorkerClock.timed``): each returns the worker's seconds for one call."""

    client: ImplementationClient
    inputs: list[InputArray]
    causal: bool = True
    settle_seconds: float = 0.0
    batch: int = BATCH
    reported: list[float] = field(default_factory=list)  # the worker's sum, batch by batch
    # The judge's clock over each request, less the pauses and the line's own cost: what the
    # batch's calls can have taken.
    judged: list[float] = field(default_factory=list)
    overhead: float = field(init=False)  # the median request that times no call

    def __post_init__(self) -> None:
        probes = []
        for _ in range(OVERHEAD_PROBES):
            started = time.perf_counter()
            self.client.timed_attention(
                *self.inputs, repeats=0, settle_seconds=0.0, causal=self.causal
            )
            probes.append(time.perf_counter() - started)
        self.overhead = statistics.median(probes)

    def __call__(self) -> float:
        """One batch; the median of its calls, as the worker timed them."""
        started = time.perf_counter()
        seconds = self.client.timed_attention(
            *self.inputs, repeats=self.batch, settle_seconds=self.settle_seconds, causal=self.causal
        )
        elapsed = time.perf_counter() - started
        self.judged.append(elapsed - self.batch * self.settle_seconds - self.overhead)
        self.reported.append(sum(seconds))
        return statistics.median(seconds)

    @staticmethod
    def timed(call: WorkerClock) -> float:
        return call()

    def contradiction(self) -> str | None:
        """Why the worker's times are not credible by the judge's clock, or None (medians over
        the batches, so that one slow request on a busy machine decides nothing)."""
        reported, judged = statistics.median(self.reported), statistics.median(self.judged)
        longer, shorter = judged - reported, reported - judged
        if (
            longer <= LONGER_SHARE * reported + SLACK_SECONDS
            and shorter <= SHORTER_SHARE * reported + SLACK_SECONDS
        ):
            return None
        return (
            f"timing not credible: {self.client.name}'s worker reported {reported * 1e3:.2f} ms "
            f"for a batch of {self.batch} calls (the median batch), but the judge's clock puts it "
            f"at {judged * 1e3:.2f} ms (its requests, less {self.batch} pauses of "
            f"{self.settle_seconds * 1e3:.0f} ms and the line's {self.overhead * 1e3:.2f} ms)"
        )
