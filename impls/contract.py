"""The implementation contract: what an attention implementation is and how it is called.

Two ways in:

* a rich :class:`Implementation` subclass, which declares its array family, device, dtypes and
  capabilities (:class:`impls.capabilities.Capabilities`), and converts NumPy test inputs to its
  native arrays and back;
* a plain callable ``fn(q, k, v, *, causal=True, scale=None) -> numpy.ndarray`` on NumPy arrays
  q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv), returning (B, H, Tq, Dv) in q's dtype,
  wrapped by :class:`PlainCallable` and checked in float32 and float64; its backward, where it
  has one, is an attribute ``fn.vjp(q, k, v, grad_out, *, causal, scale, **keywords)``, the
  contract of :meth:`Implementation.vjp`.

Causal attention is bottom-right aligned: query row i sits at absolute position i + Tk - Tq and
sees keys j <= i + Tk - Tq, so Tq = 1 against a cache of Tk keys is one decoding step.
``scale=None`` means 1/sqrt(D).

Beyond the document, an implementation may declare the attention that kernels ship, the features
of :mod:`spec.features` (grouped heads, a left window, key and query lengths, packed sequences),
and inputs that are views rather than dense arrays (``LAYOUTS``). The suite passes a feature's
keyword arguments only to an implementation that declares it; a plain callable declares one by
accepting its keywords (``enable_gqa``, ``window``, ``key_lengths``, ``cu_seqlens_q``...).

An implementation's module needs the names below in one import; they are defined where their
job is (capabilities, validation, the formula's helpers) and named here for that import.
"""

from __future__ import annotations

import contextlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from impls.block_scaled_calls import CONVENTION_KEYWORDS as BLOCK_CONVENTION_KEYWORDS
from impls.capabilities import (
    CONVENTIONS,
    EVERY_EXTENSION,
    EXTENSIONS,
    LAYOUTS,
    PADDED_QUERY_ROWS,
    RAISES_ON_ALL,
    Capabilities,
)
from impls.validation import AttentionInputError, validate_inputs
from spec.dtypes import DTYPES, numpy_storage
from spec.features import FEATURES
from spec.formula import causal_mask, each_item_or_sequence, resolve_scale
from spec.fp8 import FP8_FORMATS
from spec.fp8 import SCALE_KEYWORDS as FP8_SCALE_KEYWORDS
from spec.fp8 import numpy_dtype as fp8_numpy_dtype
from spec.masks import LISTED_KEYWORDS, mask_options, visible_keys

PLAIN_SIGNATURE = "fn(q, k, v, *, causal=True, scale=None) -> numpy.ndarray"


class ContractViolation(TypeError):
    """An implementation returned something the contract does not allow."""


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
        of a packed batch, joined by :meth:`concatenate` and :meth:`zeros` (with return_lse, the
        outputs and the log-sum-exps each); None for a batch that is neither (see
        :func:`spec.formula.each_item_or_sequence`)."""

        def piece(q, k, v, **piece_options):
            if k.shape[-2] == 0:  # a sequence with no key at all (EMPTY-KV): its lse is -inf
                out = self.empty_rows(q, v)
                if not piece_options.get("return_lse"):
                    return out
                return out, self.zeros(q.shape[:-1], q) - float("inf")
            return self.attention(q, k, v, **piece_options)

        return each_item_or_sequence(
            piece, q, k, v, concatenate=self.concatenate, zeros=self.zeros, **options
        )

    def empty_rows(self, q: Any, v: Any) -> Any:
        """The output of query rows that see no key at all, (B, H, Tq, Dv): zeros, or NaN, as
        ``capabilities.empty_rows`` declares."""
        rows = self.zeros((*q.shape[:-1], v.shape[-1]), q)
        return rows if self.capabilities.empty_rows == "zeros" else rows * float("nan")

    def attention_weights(self, q: Any, k: Any, *, causal: bool = True, scale: float | None = None):
        """The (B, H, Tq, Tk) attention weights, where ``capabilities.exposes_weights``."""
        raise NotImplementedError(f"{self.name} does not expose attention weights")

    def merge_states(self, outputs: Any, lses: Any) -> Any:
        """Where ``capabilities.merges_states``: one state from P partial ones over disjoint
        keys, outputs (P, B, H, Tq, Dv) and lses (P, B, H, Tq) in ``capabilities.lse_base``:
        o = sum_i exp(lse_i - L) o_i, L = logsumexp_i lse_i; returns (out, lse)."""
        raise NotImplementedError(f"{self.name} does not merge states")

    def vjp(
        self, q, k, v, grad_out, *, causal: bool = True, scale: float | None = None,
        grad_lse=None, **variant,
    ):  # fmt: skip
        """The backward pass, where ``capabilities.autograd``: the gradients (dq, dk, dv) of
        L = sum(out * grad_out), out = attention(q, k, v, causal=..., scale=..., **variant),
        each of its input's shape (dk and dv summed over each group of grouped heads), native
        arrays. It takes the keywords of every feature it declares but ``paged`` and
        ``query_lengths`` (spec.features: ``differentiated``). With ``sinks``, the sinks are an
        input too: (dq, dk, dv, dsinks), dsinks (H,). Where it declares ``lse``, ``grad_lse``
        (B, H, Tq), a native array or None, adds sum(lse * grad_lse) to L, lse in the declared
        base. A row that sees no key has gradient 0, never NaN (``docs/gradients.md``)."""
        raise NotImplementedError(f"{self.name} does not declare a backward (autograd)")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.family}, {self.device})>"


class NumpyArrays:
    """Conversions for implementations whose native arrays are NumPy arrays."""

    family = "numpy"

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def from_numpy(self, array: np.ndarray, dtype: str) -> np.ndarray:
        # NumPy has no bfloat16 or FP8 dtypes: ml_dtypes' (bfloat16 only where an implementation
        # declares it, as an FP8 call's q). The values are exact: the cast only stores them.
        if dtype in FP8_FORMATS or dtype == "bfloat16":
            return np.ascontiguousarray(array, dtype=fp8_numpy_dtype(dtype))
        if dtype == "uint8":  # packed FP4 (spec.block_scaled): two e2m1 codes a byte
            return np.ascontiguousarray(array, dtype=np.uint8)
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

    def check_float_dtype(self, q: np.ndarray) -> None:
        """q of float32 or float64, the dtypes NumPy computes in; else a TypeError naming it."""
        if q.dtype not in (np.float32, np.float64):
            raise TypeError(f"q.dtype={q.dtype}, but should be float32 or float64 [{self.name}]")

    def with_blind_rows(self, out: np.ndarray, lse=None, *, causal: bool, tk: int, **options):
        """``out`` (and ``lse``) with the rows that see no key (spec.masks: an item with no key,
        a row its mask leaves none) set as ``capabilities.empty_rows`` declares (their lse
        -inf), whatever the arithmetic left there (0 / 0). ``tk``: the keys the call had."""
        mask = {name: value for name, value in mask_options(options).items() if name != "causal"}
        lengths = mask.get("key_lengths")
        if not any(name in mask for name in LISTED_KEYWORDS):
            # Without a listed mask only an item with no key has such rows (causal rows with
            # Tq <= Tk, a window, a chunk each see their own key): no (Tq, Tk) mask is built
            if lengths is None or min(lengths) > 0:
                return out if lse is None else (out, lse)
            blind = np.broadcast_to((np.asarray(lengths) == 0)[:, None, None], out.shape[:-1])
        else:
            seen = visible_keys(out.shape[-2], tk, causal=causal, heads=out.shape[1], **mask)
            blind = np.broadcast_to(~seen.any(axis=-1), out.shape[:-1])  # (B, H, Tq)
        if not blind.any():
            return out if lse is None else (out, lse)
        out = out.copy()
        out[blind] = 0 if self.capabilities.empty_rows == "zeros" else np.nan
        if lse is None:
            return out
        lse = lse.copy()
        lse[blind] = -np.inf
        return out, lse


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
            **{
                feature.name: all(keyword in accepted for keyword in feature.plain_keywords)
                for feature in FEATURES
            },
            # its padded query rows: an attribute, as in fn.padded_query_rows = "zeros"
            padded_query_rows=getattr(fn, "padded_query_rows", "unspecified"),
            layouts=tuple(getattr(fn, "layouts", ("contiguous",))),  # as fn.layouts = (...)
            # its log-sum-exp's base and its merge: attributes, as fn.lse_base = "2" and
            # fn.merge_states = my_merge
            lse_base=getattr(fn, "lse_base", "e"),
            empty_rows=getattr(fn, "empty_rows", "zeros"),  # as fn.empty_rows = "nan"
            sparse_duplicates=getattr(fn, "sparse_duplicates", "once"),  # or "count"
            merges_states="return_lse" in accepted and callable(getattr(fn, "merge_states", None)),
            # the page sizes its paged cache takes: as fn.page_sizes = (16,); None: any
            page_sizes=None if getattr(fn, "page_sizes", None) is None else tuple(fn.page_sizes),
            # its backward: an attribute, as fn.vjp = my_backward (Implementation.vjp's contract),
            # and whether it takes the lse's gradient, as fn.lse_backward = False
            autograd=callable(getattr(fn, "vjp", None)),
            lse_backward=getattr(fn, "lse_backward", True),
            # the head dims and lengths its kernels take: as fn.head_dims = (64, 128),
            # fn.length_multiple = 128, fn.min_length, fn.max_length
            head_dims=None if getattr(fn, "head_dims", None) is None else tuple(fn.head_dims),
            **{
                name: getattr(fn, name)
                for name in ("length_multiple", "min_length", "max_length")
                if hasattr(fn, name)
            },
            **fp8_declaration(fn, accepted),
            **block_declaration(fn, accepted),
        )

    def version(self) -> str:
        module = inspect.getmodule(self.fn)
        version = getattr(module, "__version__", None) if module else None
        return f"{self.name} {version}" if version else f"plain callable, numpy {np.__version__}"

    def merge_states(self, outputs, lses):
        return self.fn.merge_states(outputs, lses)

    def attention(self, q, k, v, *, causal=True, scale=None, **variant):
        return self.fn(q, k, v, causal=causal, scale=scale, **self.told_of_groups(q, k, variant))

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, **variant):
        if grad_lse is not None:
            variant["grad_lse"] = grad_lse
        variant = self.told_of_groups(q, k, variant)
        return self.fn.vjp(q, k, v, grad_out, causal=causal, scale=scale, **variant)

    def told_of_groups(self, q, k, variant: dict) -> dict:
        """``variant`` with enable_gqa=True where k has fewer heads than q and the callable
        declares grouped heads, as PyTorch's SDPA asks to be told."""
        if k.shape[-3] != q.shape[-3] and self.capabilities.gqa:
            return {**variant, "enable_gqa": True}
        return variant


def fp8_declaration(fn: Callable, accepted: set[str]) -> dict:
    """A plain callable's FP8 declaration: a convention by accepting its scales' keywords
    (q_descale, k_descale, v_descale; k_scale, v_scale), the rest as attributes, as in
    fn.fp8_formats = ("float8_e4m3fn",), fn.fp8_p = "e4m3_offset8", fn.fp8_output = "float32",
    fn.fp8_kv_scales = ("kv_head",), fn.fp8_nan = "unspecified", fn.fp8_query_dtypes =
    ("bfloat16",); their defaults are Capabilities'."""
    conventions = tuple(
        convention
        for convention, keywords in FP8_SCALE_KEYWORDS.items()
        if all(keyword in accepted for keyword in keywords)
    )
    if not conventions:
        return {}
    attributes = (
        "fp8_formats", "fp8_kv_scales", "fp8_p", "fp8_output", "fp8_nan", "fp8_query_dtypes",
    )  # fmt: skip
    declared = {name: getattr(fn, name) for name in attributes if hasattr(fn, name)}
    declared = {n: tuple(v) if isinstance(v, list | tuple) else v for n, v in declared.items()}
    return {"fp8": True, "fp8_conventions": conventions, **declared}


def block_declaration(fn: Callable, accepted: set[str]) -> dict:
    """A plain callable's block-scaled declaration: a convention by accepting its keywords
    (q_block_scales, k_block_scales, v_block_scales for mx_attention; k_block_scales and
    v_block_scales for fp4_cache, with k_global_scale and v_global_scale for NVFP4;
    kv_cache_layout for mla_fp8_cache), the rest as
    attributes, as in fn.block_conventions = ("mx_attention",), fn.block_formats =
    ("mxfp8_e4m3",), fn.block_p = "e4m3_offset8", fn.block_cache_p = "bfloat16", fn.block_output
    = "bfloat16"; their defaults are Capabilities'."""
    conventions = tuple(
        convention
        for convention, keywords in BLOCK_CONVENTION_KEYWORDS.items()
        if all(keyword in accepted for keyword in keywords)
    )
    if not conventions:
        return {}
    attributes = ("block_conventions", "block_formats", "block_p", "block_cache_p", "block_output")
    declared = {name: getattr(fn, name) for name in attributes if hasattr(fn, name)}
    declared = {n: tuple(v) if isinstance(v, list | tuple) else v for n, v in declared.items()}
    return {"block_scaled": True, "block_conventions": conventions} | declared


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
    "validate_inputs",
]
