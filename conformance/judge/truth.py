"""The float64 truth of a case, computed once per run and shared by every implementation judged
on the same inputs, across tests and across pytest-xdist workers.

Every implementation in a test gets the same inputs (they come from the seed, the test and its
case), so the oracle's output and the naive baseline need not be computed again for each one.
Entries are content-addressed: the key hashes what is computed, its parameters, the inputs'
bytes, shapes and dtypes, and the source of ``spec/formula.py``, so a changed formula never meets
an old entry. Entries are sealed under the run's secret, a random key that only the judge's
processes hold (the controller draws it; pytest-xdist hands it to its workers over their own
channel, never through the environment, argv or a file): a file's name is the HMAC of its key, its
payload is enciphered with a SHAKE-256 keystream and authenticated by an HMAC-SHA256 tag. An
implementation that reaches the directory (unconfined, or a cwd of /tmp) can then neither find the
entry for its inputs, nor read one, nor forge one; an entry whose tag does not match (torn,
tampered with, another run's), or that cannot be read, is recomputed and rewritten, never trusted,
and counted as rejected. A process keeps the entries it
has read or written (up to :data:`REMEMBERED_BYTES`), read-only, since the next implementation
asks for the same ones. Without a directory (the ``--no-truth-cache`` option, or code outside a
run) everything is computed where it is asked for.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import io
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

import spec.formula
import spec.masks
import spec.mistakes.forward
from spec.formula import (
    naive_baseline,
    reference_attention,
    reference_scores,
    repeat_kv_heads,
    score_rounding_sensitivity,
)
from spec.mistakes import find_mistake
from spec.mistakes.forward import output_of

# The sources of what is computed: a changed formula or mistake never meets an old entry.
FORMULA_DIGEST = hashlib.sha256(
    b"".join(
        Path(module.__file__).read_bytes()
        for module in (spec.formula, spec.masks, spec.mistakes.forward)
    )
).hexdigest()
DIGEST_BYTES = 32
REMEMBERED_BYTES = 256 << 20  # a process's own copies of entries, the least recently used dropped


class TruthCache:
    """Content-addressed float64 arrays in one directory shared by the run's processes."""

    def __init__(self, directory: Path | None = None, secret: bytes | None = None):
        self.directory = directory
        self.secret = os.urandom(32) if secret is None else secret
        self.computed = self.reused = self.rejected = 0
        self.remembered: OrderedDict[Path, np.ndarray] = OrderedDict()
        self.remembered_bytes = 0

    def get(
        self, kind: str, inputs: str, params: dict, compute: Callable[[], np.ndarray]
    ) -> np.ndarray:
        """The value of ``compute()`` for the inputs whose :func:`inputs_digest` is ``inputs``:
        from the directory when a sound entry is there, else computed now (and stored for the
        others). Needs a directory: without one, callers compute in place and hash nothing."""
        path = self.path_of(kind, inputs, params)
        value = self.remembered.get(path)
        if value is not None:
            self.remembered.move_to_end(path)
            self.reused += 1
            return value
        value = self._read(path)
        if value is not None:
            self.reused += 1
        else:
            value = np.asarray(compute())
            self.computed += 1
            self._write(path, value)
        return self._remember(path, value)

    def path_of(self, kind: str, inputs: str, params: dict) -> Path:
        """Where the entry of ``kind`` for these inputs and parameters lies."""
        # An array among the parameters (a mask) is named by its digest: its repr elides.
        named = {name: inputs_digest(value) if isinstance(value, np.ndarray) else value
                 for name, value in params.items()}  # fmt: skip
        key = f"{FORMULA_DIGEST} {kind} {inputs} {sorted(named.items())!r}"
        return self.directory / f"{self._mac(key.encode()).hex()}.npy"

    def _mac(self, data: bytes) -> bytes:
        return hmac.digest(self.secret, data, "sha256")

    def _keystream(self, path: Path, size: int) -> np.ndarray:
        stream = hashlib.shake_256(self.secret + path.name.encode()).digest(size)
        return np.frombuffer(stream, dtype=np.uint8)

    def _enciphered(self, path: Path, data: bytes) -> bytes:
        """``data`` XOR the entry's keystream: enciphers and deciphers alike."""
        return (np.frombuffer(data, dtype=np.uint8) ^ self._keystream(path, len(data))).tobytes()

    def _remember(self, path: Path, value: np.ndarray) -> np.ndarray:
        """``value``, made read-only (every later caller gets this same array) and kept."""
        value = value.view()  # compute() may have returned an array its caller still holds
        value.flags.writeable = False
        self.remembered[path] = value
        self.remembered_bytes += value.nbytes
        while self.remembered_bytes > REMEMBERED_BYTES:
            _, dropped = self.remembered.popitem(last=False)
            self.remembered_bytes -= dropped.nbytes
        return value

    def entries(self) -> int:
        """How many truths the run's processes have stored: each computed once, then shared."""
        return len(list(self.directory.glob("*.npy"))) if self.directory else 0

    def _read(self, path: Path) -> np.ndarray | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        tag, sealed = data[:DIGEST_BYTES], data[DIGEST_BYTES:]
        if not hmac.compare_digest(tag, self._mac(path.name.encode() + sealed)):
            self.rejected += 1  # torn, tampered with, or another run's: recomputed, not trusted
            return None
        try:
            return np.load(io.BytesIO(self._enciphered(path, sealed)), allow_pickle=False)
        except ValueError:
            self.rejected += 1
            return None

    def _write(self, path: Path, value: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        sealed = self._enciphered(path, buffer.getvalue())
        # Written aside and renamed, so another process never reads half an entry.
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".part")
        with os.fdopen(handle, "wb") as out:
            out.write(self._mac(path.name.encode() + sealed) + sealed)
        os.replace(temporary, path)


TRUTH = TruthCache()  # the run's cache; the plugin points it at the run's directory


def inputs_digest(*arrays: np.ndarray) -> str:
    """SHA-256 of the arrays' dtypes, shapes and bytes: what an entry's key says of its inputs."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class CaseTruth:
    """The truth of one (q, k, v): its inputs hashed once, whatever is asked of them."""

    def __init__(self, q, k, v):
        self.q, self.k, self.v = q, k, v

    @functools.cached_property
    def digest(self) -> str:
        # Only asked for when the run shares its truth: without a directory nothing is hashed.
        return inputs_digest(self.q, self.k, self.v)

    def _shared(self, kind: str, params: dict, compute: Callable[[], np.ndarray]) -> np.ndarray:
        if TRUTH.directory is None:
            return compute()
        return TRUTH.get(kind, self.digest, params, compute)

    def attention(self, *, causal: bool = True, scale: float | None = None, **variant):
        """``spec.formula.reference_attention``, once per inputs in a run."""
        params = dict(causal=causal, scale=scale, **variant)
        return self._shared(
            "attention",
            params,
            lambda: reference_attention(self.q, self.k, self.v, **params),
        )

    def baseline(self, *, dtype: str, causal: bool = True, scale=None, **variant) -> np.ndarray:
        """``spec.formula.naive_baseline``, once per inputs and dtype in a run."""
        if dtype == "float64":
            # In float64, every intermediate rounded to float64 and float64 sums: the formula
            # itself, the oracle (tests/test_truth_cache.py holds the two equal bit for bit).
            return self.attention(causal=causal, scale=scale, **variant)
        params = dict(dtype=dtype, causal=causal, scale=scale, **variant)
        return self._shared(
            "naive baseline",
            params,
            lambda: naive_baseline(self.q, self.k, self.v, **params),
        )

    def mistake(
        self, name: str, *, dtype: str, causal: bool = True, scale=None, in_dtype=False, **variant
    ) -> np.ndarray:
        """The output of the output mistake ``name``'s variant (spec.mistakes.forward;
        ``in_dtype``: computed in the dtype's arithmetic), once per inputs and dtype in a run:
        every implementation failing on these inputs is compared with the same variants."""
        params = dict(dtype=dtype, causal=causal, scale=scale, in_dtype=in_dtype, **variant)
        return self._shared(
            f"mistake {name}",
            params,
            lambda: output_of(find_mistake(name), self.q, self.k, self.v, **params),
        )

    def score_rounding(self, *, causal: bool = True, scale=None, **variant) -> float:
        """The largest of ``spec.formula.score_rounding_sensitivity``, once per inputs in a run."""
        params = dict(causal=causal, scale=scale, **variant)

        def compute():
            return largest_finite(score_rounding_sensitivity(self.q, self.k, self.v, **params))

        return float(self._shared("score rounding", params, compute))

    def largest_score(self, scale: float | None = None) -> float:
        """max |q k^T * scale|, once per inputs in a run."""
        return float(
            self._shared(
                "largest score",
                dict(scale=scale),
                lambda: largest_finite(
                    reference_scores(self.q, repeat_kv_heads(self.q, self.k), scale)
                ),
            )
        )


def largest_finite(values: np.ndarray) -> float:
    """max |value| over the finite values (0 for none): an inf or NaN planted where no row reads
    it does not size anyone's budget."""
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size else 0.0


def oracle_attention(q, k, v, *, causal: bool = True, scale: float | None = None, **variant):
    """``spec.formula.reference_attention``, once per inputs in a run."""
    return CaseTruth(q, k, v).attention(causal=causal, scale=scale, **variant)
