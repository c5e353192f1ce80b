"""The float64 truth of a case, computed once per run and shared by every implementation judged
on the same inputs, across tests and across pytest-xdist workers.

Every implementation in a test gets the same inputs (they come from the seed, the test and its
case), so the oracle's output and the naive baseline need not be computed again for each one.
Entries are content-addressed: the key hashes what is computed, its parameters, the inputs'
bytes, shapes and dtypes, and the source of ``spec/formula.py``, so a changed formula never meets
an old entry. Each file holds the SHA-256 of its payload; an entry whose payload does not match,
or that cannot be read, is recomputed and rewritten, never trusted. Without a directory (the
``--no-truth-cache`` option, or code outside a run) everything is computed where it is asked for.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

import spec.formula
from spec.formula import naive_baseline, reference_attention, reference_scores

FORMULA_DIGEST = hashlib.sha256(Path(spec.formula.__file__).read_bytes()).hexdigest()
DIGEST_BYTES = 32


class TruthCache:
    """Content-addressed float64 arrays in one directory shared by the run's processes."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory
        self.computed = self.reused = self.rejected = 0

    def key(self, kind: str, arrays: tuple[np.ndarray, ...], params: dict) -> str:
        digest = hashlib.sha256(f"{FORMULA_DIGEST} {kind} {sorted(params.items())!r}".encode())
        for array in arrays:
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def get(
        self,
        kind: str,
        arrays: tuple[np.ndarray, ...],
        params: dict,
        compute: Callable[[], np.ndarray],
    ) -> np.ndarray:
        """The value of ``compute()`` for these inputs: from the directory when a sound entry is
        there, else computed now (and stored for the others)."""
        if self.directory is None:
            return compute()
        path = self.directory / f"{self.key(kind, arrays, params)}.npy"
        value = self._read(path)
        if value is not None:
            self.reused += 1
            return value
        value = np.asarray(compute())
        self.computed += 1
        self._write(path, value)
        return value

    def _read(self, path: Path) -> np.ndarray | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        digest, payload = data[:DIGEST_BYTES], data[DIGEST_BYTES:]
        if hashlib.sha256(payload).digest() != digest:
            self.rejected += 1  # torn, truncated or tampered with: recomputed, never trusted
            return None
        try:
            return np.load(io.BytesIO(payload), allow_pickle=False)
        except ValueError:
            self.rejected += 1
            return None

    def _write(self, path: Path, value: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        payload = buffer.getvalue()
        # Written aside and renamed, so another process never reads half an entry.
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".part")
        with os.fdopen(handle, "wb") as out:
            out.write(hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, path)


TRUTH = TruthCache()  # the run's cache; the plugin points it at the run's directory


def oracle_attention(q, k, v, *, causal: bool = True, scale: float | None = None) -> np.ndarray:
    """``spec.formula.reference_attention``, once per inputs in a run."""
    params = dict(causal=causal, scale=scale)
    return TRUTH.get("attention", (q, k, v), params, lambda: reference_attention(q, k, v, **params))


def baseline_attention(q, k, v, *, dtype: str, causal: bool = True, scale=None) -> np.ndarray:
    """``spec.formula.naive_baseline``, once per inputs and dtype in a run."""
    params = dict(dtype=dtype, causal=causal, scale=scale)
    return TRUTH.get("naive baseline", (q, k, v), params, lambda: naive_baseline(q, k, v, **params))


def largest_score(q, k, scale: float | None = None) -> float:
    """max |q k^T * scale|, once per inputs in a run."""
    return float(
        TRUTH.get(
            "largest score",
            (q, k),
            dict(scale=scale),
            lambda: np.max(np.abs(reference_scores(q, k, scale))),
        )
    )
