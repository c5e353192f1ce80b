"""The first call of an implementation: does what it returns meet the contract at all?

A kernel that returns a list, None or a wrong shape would fail every test the same way, and
hundreds of identical failures hide the one sentence that matters. The suite calls each
implementation once, before its tests, on one small case; if the answer breaks the contract, it
says so once (see ``fold_broken`` in :mod:`conformance.run.collection`).
"""

from __future__ import annotations

import numpy as np

from conformance.run.selection import Selected
from conformance.run.worker_clients import (
    ImplementationBroke,
    ImplementationClient,
    ImplementationDied,
    ImplementationRaised,
)

PREFLIGHT_SHAPE = (1, 2, 16, 16)  # (B, H, T, D)


def preflight_failure(client: ImplementationClient) -> str | None:
    """Why the implementation's first call breaks the contract, or None when it does not (or
    when it raises or dies: those are judged test by test)."""
    caps = client.capabilities
    head_dim = PREFLIGHT_SHAPE[-1]
    if caps.head_dims is not None and head_dim not in caps.head_dims:
        head_dim = min(caps.head_dims)
    batch, heads, length, _ = PREFLIGHT_SHAPE
    shape = (batch, heads, caps.fit_length(length), head_dim)
    dtype = caps.dtypes[0]
    inputs = [client.from_numpy(np.zeros(shape), dtype) for _ in range(3)]
    described = f"q, k, v of shape {shape} and dtype {dtype}, causal=True"
    try:
        out = client.attention(*inputs, causal=True, scale=None)
    except ImplementationBroke as exc:
        return f"{exc} (its first call: {described}); not judged further"
    except (ImplementationRaised, ImplementationDied):
        return None
    finally:
        # In a worker of its own: a first call that writes out of bounds without crashing must
        # not be the worker every later test is decided in.
        client.restart_worker()
    if out.shape != shape:
        return (
            f"{client.name} returned shape {out.shape} at its first call ({described}), but "
            f"should return {shape}; not judged further"
        )
    return None


def broken_implementations(selection: list[Selected]) -> dict[str, str]:
    """name -> why its first call breaks the contract, for each selected implementation that
    can run here and whose first call does."""
    broken = {}
    for selected in selection:
        if selected.skip_reason:
            continue
        failure = preflight_failure(selected.client)
        if failure:
            broken[selected.client.name] = failure
    return broken
