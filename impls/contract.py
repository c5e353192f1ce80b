"""The implementation contract: what an attention implementation declares and how it is called.

Two ways in:

* a rich :class:`Implementation` subclass, which declares its array family, device, dtypes and
  capabilities, and converts NumPy test inputs to its native arrays and back;
* a plain callable ``fn(q, k, v, *, causal=True, scale=None) -> numpy.ndarray`` on NumPy arrays
  q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv), returning (B, H, Tq, Dv) in q's dtype,
  wrapped by :class:`PlainCallable` and checked in float32 and float64.

Causal attention is bottom-right aligned: query row i sits at absolute position i + Tk - Tq and
sees keys j <= i + Tk - Tq, so Tq = 1 against a cache of Tk keys is one decoding step.
``scale=None`` means 1/sqrt(D).

Beyond the document, an implementation may declare the attention that kernels ship
(:data:`EXTENSIONS`): k and v with fewer heads than q, a left ``window=w``, per-item
``key_lengths=(L_0, ..., L_{B-1})`` and packed ``cu_seqlens_q``/``cu_seqlens_k`` keyword
arguments, and inputs that are views rather than dense arrays (:data:`LAYOUTS`). The suite passes
an extension's argument only to an implementation that declares it; a plain callable declares one
by accepting its keyword (``enable_gqa``, ``window``, ``key_lengths``, ``cu_seqlens_q``).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from spec.dtypes import DTYPES, check_dtype, numpy_storage
from spec.formula import causal_mask, each_item_or_sequence, resolve_scale

PLAIN_SIGNATURE = "fn(q, k, v, *, causal=True, scale=None) -> numpy.ndarray"


class AttentionInputError(ValueError):
    """Inputs that no attention implementation can give a meaningful answer for."""


class ContractViolation(TypeError):
    """An implementation returned something the contract does not allow."""


# Where widely used kernels disagree on purpose, the contract names the conventions and accepts
# each; an implementation may declare the one it follows (Capabilities.conventions), and the
# suite reports the one it saw. Anything else - a wrong shape, wrong values - is silent garbage.
CONVENTIONS: dict[str, dict[str, str]] = {
    "batch_axes": {
        "raise": "q, k, v of another rank, or batch or head axes of size 1 against n, raise",
        "broadcast": "leading axes broadcast as in NumPy (PyTorch's SDPA does so on purpose)",
    },
    "unseen_rows": {
        "raise": "causal attention with Tq > Tk raises",
        "zeros": "query rows that see no key are zero (FlashAttention, ONNX Attention, FlashInfer)",
        "nan": "query rows that see no key are NaN: the literal formula's 0/0",
    },
    "nonfinite_scale": {
        "raise": "a NaN or infinite scale raises",
        "nan": "a NaN or infinite scale gives NaN everywhere: the formula's own arithmetic",
    },
    "mixed_dtypes": {
        "raise": "q, k, v of different dtypes raise",
        "promote": "q, k, v of different dtypes are promoted to one of them (NumPy, PyTorch)",
    },
}

# What validate_inputs enforces: the convention of every built-in that calls it.
RAISES_ON_ALL = tuple((name, "raise") for name in CONVENTIONS)

# The attention kernels ship beyond the document, each as the convention it follows.
EXTENSIONS: dict[str, str] = {
    "gqa": "k and v with Hkv heads, Hq = g * Hkv: query head h reads head h // g (PyTorch "
    "enable_gqa, FlashAttention); Hkv = 1 is multi-query attention",
    "window": "window=w: the query at absolute position p sees keys p - w <= j <= p "
    "(FlashAttention window_size=(w, 0)); causal attention only",
    "key_lengths": "key_lengths=(L_0, ..., L_{B-1}): item b holds its first L_b keys, its query "
    "row i sits at position i + L_b - Tq (FlashAttention cache_seqlens), and the padding past "
    "L_b, whatever it holds, is never read",
    "query_lengths": "query_lengths=(Lq_0, ..., Lq_{B-1}), with key lengths or without: item b's "
    "first Lq_b query rows are its queries, row i at position i + L_b - Lq_b; the rows past Lq_b "
    "are padding and hold what Capabilities.padded_query_rows declares (zeros, or unspecified)",
    "packed": "cu_seqlens_q=(0, ..., Tq), cu_seqlens_k=(0, ..., Tk): sequences packed along the "
    "token axis of a batch of one, sequence s holding query rows cu_seqlens_q[s] .. "
    "cu_seqlens_q[s+1] - 1 and the keys likewise, each attending to its own keys alone, "
    "bottom-right aligned (FlashAttention flash_attn_varlen_func)",
}

# What an implementation taking query_lengths leaves in the padded query rows.
PADDED_QUERY_ROWS = {
    "zeros": "rows past an item's query length are 0 (FlashAttention's padded outputs)",
    "unspecified": "rows past an item's query length hold anything and are not compared",
}

# How inputs may arrive: views into other arrays, as a model's projections hand them over.
LAYOUTS: dict[str, str] = {
    "contiguous": "dense (B, H, T, D) arrays",
    "heads_last": "(B, T, H, D) arrays seen as (B, H, T, D) through a transposed view",
    "packed_qkv": "q, k and v as views of one (B, T, 3, H, D) projection",
    "row_gaps": "rows of D values at a pitch of D + 8: a slice of a wider array",
    "broadcast_kv": "k and v of one head broadcast along H with stride 0",
}

# The Capabilities fields of an implementation with every extension, its padded query rows zeroed,
# computing every layout right: Capabilities(dtypes=..., **EVERY_EXTENSION).
EVERY_EXTENSION: dict[str, Any] = dict(
    gqa=True,
    window=True,
    key_lengths=True,
    query_lengths=True,
    padded_query_rows="zeros",
    packed=True,
    layouts=tuple(LAYOUTS),
)


@dataclass(frozen=True)
class Capabilities:
    """What an implementation declares; tests needing more are skipped, naming what is missing."""

    dtypes: tuple[str, ...]
    autograd: bool = False
    cross_length: bool = True  # Tq < Tk, bottom-right aligned
    explicit_scale: bool = True
    non_causal: bool = True
    head_dims: tuple[int, ...] | None = None  # None: every D >= 1
    distinct_value_dim: bool = True  # v's head dim Dv may differ from q's and k's D
    exposes_weights: bool = False  # has attention_weights(), the (B, H, Tq, Tk) softmax
    # (name, value) pairs from CONVENTIONS; a name left out accepts any of its values
    conventions: tuple[tuple[str, str], ...] = ()
    # The extensions it implements (see EXTENSIONS)
    gqa: bool = False
    window: bool = False
    key_lengths: bool = False
    query_lengths: bool = False
    padded_query_rows: str = "unspecified"  # what padded query rows hold: PADDED_QUERY_ROWS
    packed: bool = False
    # LAYOUTS it computes right; one left out must compute right or raise a clear error
    layouts: tuple[str, ...] = ("contiguous",)

    def __post_init__(self) -> None:
        if not self.dtypes:
            raise ValueError("Capabilities.dtypes is empty: declare at least one dtype")
        for dtype in self.dtypes:
            check_dtype(dtype)
        for name, value in self.conventions:
            if name not in CONVENTIONS:
                raise ValueError(
                    f"Capabilities.conventions names {name!r}, but should name one of "
                    + ", ".join(CONVENTIONS)
                )
            if value not in CONVENTIONS[name]:
                raise ValueError(
                    f"Capabilities.conventions {name}={value!r}, but should be one of "
                    + ", ".join(CONVENTIONS[name])
                )
        if self.padded_query_rows not in PADDED_QUERY_ROWS:
            raise ValueError(
                f"Capabilities.padded_query_rows={self.padded_query_rows!r}, but should be one of "
                + ", ".join(PADDED_QUERY_ROWS)
            )
        unknown = [layout for layout in self.layouts if layout not in LAYOUTS]
        if unknown or "contiguous" not in self.layouts:
            raise ValueError(
                f"Capabilities.layouts={self.layouts!r}, but should include 'contiguous' and name "
                "only " + ", ".join(LAYOUTS)
            )

    def convention(self, name: str) -> str | None:
        """The declared convention ``name`` (a key of CONVENTIONS), or None: any is accepted."""
        return dict(self.conventions).get(name)

    def supports_head_dim(self, head_dim: int) -> bool:
        return self.head_dims is None or head_dim in self.head_dims

    def describe(self) -> str:
        flags = [
            name
            for name, on in (
                ("autograd", self.autograd),
                ("Tq<Tk", self.cross_length),
                ("scale", self.explicit_scale),
                ("non-causal", self.non_causal),
                ("Dv!=D", self.distinct_value_dim),
                ("weights", self.exposes_weights),
                ("gqa", self.gqa),
                ("window", self.window),
                ("key lengths", self.key_lengths),
                ("query lengths", self.query_lengths),
                ("packed", self.packed),
            )
            if on
        ]
        dims = "any D" if self.head_dims is None else "D in " + ",".join(map(str, self.head_dims))
        text = f"{'/'.join(self.dtypes)}; {', '.join(flags) or 'causal only'}; {dims}"
        if set(self.layouts) == set(LAYOUTS):
            text += "; every layout"
        elif self.layouts != ("contiguous",):
            text += "; layouts " + ",".join(self.layouts)
        if self.query_lengths:
            text += f"; padded query rows {self.padded_query_rows}"
        if self.conventions == RAISES_ON_ALL:
            return text + "; raises on every convention"
        if self.conventions:
            return text + "; " + ", ".join(f"{n}={v}" for n, v in self.conventions)
        return text


class Implementation(ABC):
    """An attention implementation under test.

    Subclasses set ``name``, ``family`` and ``capabilities`` and implement :meth:`attention` on
    native arrays, plus the conversions. Everything else has a working default.
    """

    name: str
    family: str  # the array library: numpy, torch, cupy, ...
    capabilities: Capabilities
    device: str = "cpu"
    # Seconds one call may take before the suite calls it a hang (None: the suite's default, see
    # --call-timeout); an interpreter or a compile-per-shape library declares more.
    call_timeout: float | None = None

    def version(self) -> str:
        return "unknown"

    def unavailable_reason(self) -> str | None:
        """Why this implementation cannot run on this machine, or None when it can."""
        return None

    # --- conversions -------------------------------------------------------------------------

    @abstractmethod
    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        """A native array of ``dtype`` holding ``array`` (float64, already exact in ``dtype``)."""

    @abstractmethod
    def to_numpy(self, native: Any) -> np.ndarray:
        """A NumPy copy of a native array (bfloat16 may come back as float32)."""

    @abstractmethod
    def dtype_name(self, native: Any) -> str:
        """The name (as in :data:`spec.dtypes.DTYPES`) of a native array's dtype."""

    def device_of(self, native: Any) -> str:
        return self.device

    def permuted(self, native: Any, axes: tuple[int, ...]) -> Any:
        """A view of ``native`` with its axes in the order ``axes`` (NumPy's ``transpose``)."""
        return native.transpose(axes)

    def broadcast(self, native: Any, shape: tuple[int, ...]) -> Any:
        """A view of ``native`` broadcast to ``shape``, stride 0 along the broadcast axes."""
        return native.__array_namespace__().broadcast_to(native, shape)

    def concatenate(self, parts: list[Any], axis: int) -> Any:
        """Native arrays joined along ``axis`` (the array API's ``concat``)."""
        return parts[0].__array_namespace__().concat(parts, axis=axis)

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        """A native array of zeros of ``like``'s dtype."""
        return like.__array_namespace__().zeros(shape, dtype=like.dtype)

    def poisoned_allocations(self) -> contextlib.AbstractContextManager:
        """A context in which the array library's fresh allocations are filled with NaN, so an
        output element a call never writes shows as NaN rather than as whatever a recycled buffer
        held (often the previous call's right answer). The default does nothing: a library whose
        arrays are never uninitialised (JAX) needs nothing more."""
        return contextlib.nullcontext()

    # --- the computation ---------------------------------------------------------------------

    @abstractmethod
    def attention(self, q: Any, k: Any, v: Any, *, causal: bool = True, scale: float | None = None):
        """softmax(mask(q k^T * scale)) v on native arrays, returning a native array. An
        implementation declaring ``window`` or ``key_lengths`` also takes that keyword."""

    def each_item_or_sequence(self, q: Any, k: Any, v: Any, **options) -> Any:
        """:meth:`attention` on each item of a batch with padded query rows, or on each sequence
        of a packed batch, joined by :meth:`concatenate` and :meth:`zeros`; None for a batch that
        is neither (see :func:`spec.formula.each_item_or_sequence`)."""
        return each_item_or_sequence(
            self.attention, q, k, v, concatenate=self.concatenate, zeros=self.zeros, **options
        )

    def attention_weights(self, q: Any, k: Any, *, causal: bool = True, scale: float | None = None):
        """The (B, H, Tq, Tk) attention weights, where ``capabilities.exposes_weights``."""
        raise NotImplementedError(f"{self.name} does not expose attention weights")

    def vjp(self, q, k, v, grad_out, *, causal: bool = True, scale: float | None = None):
        """Gradients (dq, dk, dv) of sum(out * grad_out), where ``capabilities.autograd``."""
        raise NotImplementedError(f"{self.name} does not support autograd")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.family}, {self.device})>"


class NumpyArrays:
    """Conversions for implementations whose native arrays are NumPy arrays."""

    family = "numpy"

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        if dtype == "bfloat16":
            raise ContractViolation("NumPy has no bfloat16 dtype")
        return np.ascontiguousarray(array, dtype=numpy_storage(dtype))

    def to_numpy(self, native: Any) -> np.ndarray:
        if not isinstance(native, np.ndarray):
            raise ContractViolation(
                f"{self.name} returned {type(native).__module__}.{type(native).__qualname__}, "
                "but should return numpy.ndarray"
            )
        return native

    @contextlib.contextmanager
    def poisoned_allocations(self):
        """numpy.empty and numpy.empty_like give NaN-filled arrays (of inexact dtypes) meanwhile:
        what an implementation allocates and means to overwrite."""
        empty, empty_like = np.empty, np.empty_like

        def poisoned(array):
            if np.issubdtype(array.dtype, np.inexact):
                array.fill(np.nan)
            return array

        np.empty = lambda *args, **kwargs: poisoned(empty(*args, **kwargs))
        np.empty_like = lambda *args, **kwargs: poisoned(empty_like(*args, **kwargs))
        try:
            yield
        finally:
            np.empty, np.empty_like = empty, empty_like

    def dtype_name(self, native: Any) -> str:
        return str(self.to_numpy(native).dtype)


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def validate_inputs(
    q,
    k,
    v,
    *,
    causal: bool,
    scale: float | None,
    gqa: bool = False,
    window: int | None = None,
    key_lengths=None,
    query_lengths=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
) -> None:
    """Raise :class:`AttentionInputError` naming the problem when (q, k, v, scale) are invalid.

    Works on any array with ``.ndim``, ``.shape`` and ``.dtype``; shared by the built-ins so every
    one of them rejects the same inputs with the same words. ``gqa`` accepts k and v with fewer
    heads than q (a divisor of q's); ``window``, ``key_lengths`` and the packed sequences'
    offsets are checked where given.
    """
    for label, array in (("q", q), ("k", k), ("v", v)):
        if array.ndim != 4:
            raise AttentionInputError(
                f"{label}.ndim={array.ndim} (shape {tuple(array.shape)}), "
                "but should be 4: (B, H, T, D)"
            )
    (bq, hq, tq, dq), (bk, hk, tk, dk), (bv, hv, tv, _) = q.shape, k.shape, v.shape
    grouped = gqa and hk == hv and hk > 0 and hq % hk == 0
    if not (bq == bk == bv and (hq == hk == hv or grouped)):
        raise AttentionInputError(
            f"batch and head dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}; "
            + ("B must match, and k's and v's heads divide q's" if gqa else "B and H must match")
        )
    if dq != dk:
        raise AttentionInputError(f"q has D={dq} but k has D={dk}: query and key dims must match")
    if tk != tv:
        raise AttentionInputError(f"k has Tk={tk} but v has Tk={tv}: keys and values must pair up")
    if 0 in tuple(q.shape) + tuple(k.shape) + tuple(v.shape):
        raise AttentionInputError(
            f"empty dimension in q {tuple(q.shape)}, k {tuple(k.shape)} or v {tuple(v.shape)}: "
            "every dim must be at least 1"
        )
    packed = cu_seqlens_q is not None or cu_seqlens_k is not None
    if packed:
        validate_packed(cu_seqlens_q, cu_seqlens_k, batch=bq, tq=tq, tk=tk, causal=causal)
        if key_lengths is not None or query_lengths is not None:
            raise AttentionInputError(
                "key_lengths or query_lengths with packed sequences: give one form or the other"
            )
    if causal and tq > tk and not packed:
        raise AttentionInputError(
            f"causal attention with Tq={tq} > Tk={tk}: bottom-right alignment leaves the first "
            f"{tq - tk} query rows with no key to attend to"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionInputError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
            raise AttentionInputError(f"scale={scale!r}, but should be a real number or None")
        if not math.isfinite(float(scale)):
            raise AttentionInputError(f"scale={scale!r}, but should be finite")
    if window is not None:
        validate_window(window, causal=causal)
    if key_lengths is not None or query_lengths is not None:
        validate_lengths(key_lengths, query_lengths, batch=bq, tq=tq, tk=tk, causal=causal)


def validate_packed(cu_seqlens_q, cu_seqlens_k, *, batch: int, tq: int, tk: int, causal: bool):
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise AttentionInputError(
            "packed sequences need both cu_seqlens_q and cu_seqlens_k, "
            f"not cu_seqlens_q={cu_seqlens_q!r} and cu_seqlens_k={cu_seqlens_k!r}"
        )
    if batch != 1:
        raise AttentionInputError(f"packed sequences with B={batch}, but should be a batch of one")
    offsets = {}
    for label, cu, total in (
        ("cu_seqlens_q", cu_seqlens_q, tq),
        ("cu_seqlens_k", cu_seqlens_k, tk),
    ):
        cu = np.asarray(cu)
        if cu.ndim != 1 or len(cu) < 2 or not np.issubdtype(cu.dtype, np.integer):
            raise AttentionInputError(f"{label}={cu.tolist()!r}, but should be at least 2 integers")
        if cu[0] != 0 or cu[-1] != total or np.any(np.diff(cu) < 1):
            raise AttentionInputError(
                f"{label}={cu.tolist()}, but should rise from 0 to {total}, "
                "by at least 1 per sequence"
            )
        offsets[label] = cu
    lengths_q, lengths_k = (np.diff(offsets[label]) for label in ("cu_seqlens_q", "cu_seqlens_k"))
    if len(lengths_q) != len(lengths_k):
        raise AttentionInputError(
            f"cu_seqlens_q has {len(lengths_q)} sequences but cu_seqlens_k {len(lengths_k)}"
        )
    if causal and np.any(lengths_q > lengths_k):
        s = int(np.argmax(lengths_q > lengths_k))
        raise AttentionInputError(
            f"packed sequence {s} has {lengths_q[s]} queries but {lengths_k[s]} keys: causal "
            "bottom-right alignment leaves its first queries with no key"
        )


def validate_window(window, *, causal: bool) -> None:
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise AttentionInputError(f"window={window!r}, but should be an integer >= 0 or None")
    if not causal:
        raise AttentionInputError(
            f"window={window} with causal=False: the window is a left window of causal attention"
        )


def validate_lengths(key_lengths, query_lengths, *, batch: int, tq: int, tk: int, causal: bool):
    """Per-item key and query lengths: one integer per batch item, 1 <= Lq_b <= Tq, 1 <= L_b <= Tk,
    and causal rows that all see a key (L_b >= Lq_b, Lq_b = Tq without query lengths)."""
    given = {}
    for label, lengths, total in (
        ("key_lengths", key_lengths, tk),
        ("query_lengths", query_lengths, tq),
    ):
        if lengths is None:
            given[label] = np.full(batch, total)
            continue
        array = np.asarray(lengths)
        if array.shape != (batch,) or not np.issubdtype(array.dtype, np.integer):
            raise AttentionInputError(
                f"{label}={lengths!r}, but should be {batch} integers, one per batch item"
            )
        if array.min() < 1 or array.max() > total:
            raise AttentionInputError(
                f"{label}={array.tolist()}, but each should be between 1 and {total}"
            )
        given[label] = array
    keys, queries = given["key_lengths"], given["query_lengths"]
    if causal and np.any(keys < queries):
        b = int(np.argmax(keys < queries))
        raise AttentionInputError(
            f"batch item {b} has {queries[b]} queries but {keys[b]} keys: causal bottom-right "
            "alignment leaves its first queries with no key"
        )


class PlainCallable(NumpyArrays, Implementation):
    """A plain callable with the :data:`PLAIN_SIGNATURE` contract, as an implementation."""

    capabilities = Capabilities(dtypes=("float64", "float32"))

    def __init__(self, fn: Callable, name: str):
        check_plain_signature(fn, name)
        self.fn = fn
        self.name = name
        accepted = accepted_keywords(fn)
        self.capabilities = replace(
            PlainCallable.capabilities,
            gqa="enable_gqa" in accepted,
            window="window" in accepted,
            key_lengths="key_lengths" in accepted,
            query_lengths="query_lengths" in accepted,
            # its padded query rows: an attribute, as in fn.padded_query_rows = "zeros"
            padded_query_rows=getattr(fn, "padded_query_rows", "unspecified"),
            layouts=tuple(getattr(fn, "layouts", ("contiguous",))),  # as fn.layouts = (...)
            packed="cu_seqlens_q" in accepted and "cu_seqlens_k" in accepted,
        )

    def version(self) -> str:
        module = inspect.getmodule(self.fn)
        version = getattr(module, "__version__", None) if module else None
        return f"{self.name} {version}" if version else f"plain callable, numpy {np.__version__}"

    def attention(self, q, k, v, *, causal=True, scale=None, **variant):
        if k.shape[-3] != q.shape[-3] and self.capabilities.gqa:
            variant["enable_gqa"] = True  # as PyTorch's SDPA asks to be told
        return self.fn(q, k, v, causal=causal, scale=scale, **variant)


def accepted_keywords(fn: Callable) -> set[str]:
    """The keyword arguments ``fn`` names (a ``**kwargs`` catch-all declares nothing)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def check_plain_signature(fn: Callable, name: str) -> None:
    """Raise TypeError unless ``fn`` can be called as (q, k, v, causal=..., scale=...)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: the first call will tell
    try:
        signature.bind(None, None, None, causal=True, scale=None)
    except TypeError as exc:
        raise TypeError(
            f"{name} has signature {signature}, which cannot be called as {PLAIN_SIGNATURE} ({exc})"
        ) from None


__all__ = [
    "CONVENTIONS",
    "DTYPES",
    "EVERY_EXTENSION",
    "EXTENSIONS",
    "LAYOUTS",
    "PADDED_QUERY_ROWS",
    "PLAIN_SIGNATURE",
    "RAISES_ON_ALL",
    "AttentionInputError",
    "Capabilities",
    "ContractViolation",
    "Implementation",
    "NumpyArrays",
    "PlainCallable",
    "causal_mask",
    "check_plain_signature",
    "resolve_scale",
    "usable_cores",
    "validate_inputs",
]
