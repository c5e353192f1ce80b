"""Adapters for the attention that people call from popular libraries, judged as they ship.

Each adapter calls its library the way the library's documentation tells users to, declares what
the library supports, and validates nothing itself: the suite judges the library, not the
adapter. Where a library's own convention differs from the contract (causal masks aligned
top-left when Tq < Tk, (B, T, H, D) layout), there are two adapters: ``*_naive``, the call a user
writes from the documentation, and ``*_bridged``, the same call with the smallest change that
meets the contract, named in its docstring. ``python -m conformance.report.ecosystem`` turns a
run over them into the ecosystem table (docs/ecosystem.md).

The libraries are optional: an adapter whose library is missing reports why it cannot run.
"""
