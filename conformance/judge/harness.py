"""How a conformance test calls an implementation: cases, inputs, calls and reproducers.

A test describes *what* to compute as a :class:`Case`, gets inputs from :meth:`Subject.inputs`
(float64 arrays already rounded to the case's dtype, so the oracle sees exactly what the
implementation sees), and calls :meth:`Subject.call`. Everything a failure message needs to
reproduce the call - implementation, seed, test id, shapes, dtype, causal, scale - lives here.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from conformance.judge.mask_draws import IndexDraw, MaskDraw, PackedMaskDraw, TreeDraw
from conformance.judge.regimes import regimes_of_call, regimes_of_merge
from conformance.run.recording import TestNotes
from conformance.run.worker_clients import ImplementationBroke, ImplementationClient
from spec.block_scaled import CACHE_CONVENTIONS, block_format
from spec.dtypes import round_to
from spec.features import FEATURES, Feature
from spec.formula import causal_mask
from spec.masks import CASE_KEYWORDS, with_mask_fields

# What a Case field may hold instead of a value: a recipe drawn for the case's shape.
DRAWS = (MaskDraw, IndexDraw, TreeDraw, PackedMaskDraw)


@dataclass(frozen=True)
@functools.partial(with_mask_fields, keywords=CASE_KEYWORDS)
class Case:
    """One attention call: shapes (B, H, Tq, Tk, D, Dv), dtype, causal and scale, and where a
    test of the extensions sets them, k's and v's heads, a window, key lengths and a layout."""

    batch: int = 1
    heads: int = 2
    tq: int = 64
    tk: int | None = None  # None: same as tq
    head_dim: int = 64
    value_dim: int | None = None  # None: same as head_dim
    dtype: str = "float32"
    causal: bool = True
    scale: float | None = None
    # k's and v's heads; None: as many as q's, whatever with_(heads=...) makes that (fewer is
    # grouped-query attention)
    kv_heads: int | None = None
    # A field per keyword of spec.features.FEATURES; None: not set
    window: int | None = None
    key_lengths: tuple[int, ...] | None = None
    query_lengths: tuple[int, ...] | None = None
    cu_seqlens_q: tuple[int, ...] | None = None  # packed sequences: a batch of one
    cu_seqlens_k: tuple[int, ...] | None = None
    softcap: float | None = None
    alibi_slopes: tuple[float, ...] | None = None  # one per query head
    sinks: tuple[float, ...] | None = None  # one per query head
    chunk: int | None = None
    # and a field per keyword of the other mask kinds (spec.masks.CASE_KEYWORDS, default None):
    # a listed mask as the recipe its call's array is drawn by for the case's shape (MaskDraw,
    # TreeDraw, PackedMaskDraw with its mask_indptr, IndexDraw: DRAWS), the others as values
    # (topk_length, kv_block_size)
    #
    # how a key listed twice counts, as the implementation declares it (Subject.fit): the
    # truth's convention, not a keyword of the call
    sparse_duplicates: str = "once"
    return_lse: bool | None = None  # Subject.call_with_lse sets it
    page_size: int | None = None  # the worker lays k and v out as page pools of this size
    layout: str = "contiguous"  # how the worker lays the inputs out (impls.capabilities.LAYOUTS)
    # An FP8 call (spec.fp8, conformance.judge.fp8): the format of its FP8 operands (k and v, and
    # q too under the descale convention, whose dtype is then the format), the convention of its
    # scales and, under kv_scale, how fine they are (spec.fp8.KV_SCALE_GRANULARITIES)
    fp8_format: str | None = None
    fp8_convention: str | None = None
    fp8_kv_scale: str | None = None
    # A block-scaled call (spec.block_scaled, conformance.judge.block_scaled): its convention and
    # format; the case's dtype is q's (the element format's under mx_attention)
    block_convention: str | None = None
    block_format: str | None = None
    poison_allocations: bool = False  # fresh allocations read as NaN during the call

    def __post_init__(self) -> None:
        if self.tk is None:
            object.__setattr__(self, "tk", self.tq)
        if self.value_dim is None:
            object.__setattr__(self, "value_dim", self.head_dim)

    def with_(self, **changes) -> Case:
        return replace(self, **changes)

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.tq, self.head_dim)

    @property
    def block_element(self) -> str | None:
        """The element format of a block-scaled case's operands, or None."""
        return None if self.block_format is None else block_format(self.block_format).element

    @property
    def key_value_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def k_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.key_value_heads, self.tk, self.head_dim)

    @property
    def v_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.key_value_heads, self.tk, self.value_dim)

    @property
    def variant(self) -> dict:
        """The features' keyword arguments this case sets (none for the document's cases), a
        mask as the array drawn for the case's shape."""
        variant = {}
        for name, value in self.shown_variant.items():
            drawn = value.for_case(self) if isinstance(value, DRAWS) else value
            # a draw of several keywords (a packed mask and its offsets) gives them all
            variant.update(drawn if isinstance(drawn, dict) else {name: drawn})
        return variant

    @property
    def shown_variant(self) -> dict:
        """:attr:`variant` as reports show it: a mask by what it is, not its bits."""
        return {
            keyword: getattr(self, keyword)
            for feature in FEATURES
            for keyword in feature.keywords
            # a keyword another's draw gives (mask_indptr) has no field of its own
            if getattr(self, keyword, None) is not None
        }

    @property
    def formula_variant(self) -> dict:
        """The keywords of :attr:`variant` that change what is computed: the truth's and the
        diagnosis's (a page size only lays the same keys out otherwise)."""
        layout_only = {k for feature in FEATURES if feature.layout_only for k in feature.keywords}
        variant = {name: value for name, value in self.variant.items() if name not in layout_only}
        if self.kv_indices is not None and self.sparse_duplicates != "once":
            variant["sparse_duplicates"] = self.sparse_duplicates
        return variant

    def needs(self, feature: Feature) -> bool:
        """Whether calling this case needs ``feature`` declared: a keyword of it set, or, for
        grouped heads, which no keyword carries, fewer k/v heads than q heads."""
        if feature.keywords:
            return any(getattr(self, keyword, None) is not None for keyword in feature.keywords)
        return feature.name == "gqa" and self.key_value_heads != self.heads

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.tq, self.value_dim)

    @property
    def visible(self) -> np.ndarray:
        """(Tq, Tk) True where query i may attend to key j under this case's masking."""
        if self.causal:
            return causal_mask(self.tq, self.tk)
        return np.ones((self.tq, self.tk), dtype=bool)

    def describe(self) -> str:
        extras = "".join(
            f" {name}={value}"
            for name, value, default in (
                ("Hkv", self.key_value_heads, self.heads),
                *((name, value, None) for name, value in self.shown_variant.items()),
                ("layout", self.layout, "contiguous"),
                ("fp8", self.fp8_format, None),
                ("scales", self.fp8_convention, None),
                ("per", self.fp8_kv_scale, None),
                ("blocks", self.block_format, None),
                ("poison_allocations", self.poison_allocations, False),
                ("duplicates", self.sparse_duplicates, "once"),
            )
            if value != default
        )
        return (
            f"B={self.batch} H={self.heads} Tq={self.tq} Tk={self.tk} D={self.head_dim} "
            f"Dv={self.value_dim} dtype={self.dtype} causal={self.causal} scale={self.scale}"
            + extras
        )

    def call_signature(self) -> str:
        variant = "".join(f", {name}={value}" for name, value in self.shown_variant.items())
        return f"attention(causal={self.causal}, scale={self.scale}{variant})"


def packed_rows(case: Case, *arrays):
    """Each item's valid rows of (B, H, T, D) arrays laid end to end in a batch of one, (1, H, sum
    of lengths, D), with the cu_seqlens of that packing: a padded batch is a packed one with
    gaps. q and out take query lengths; k and v key lengths."""
    queries = case.query_lengths
    keys = case.key_lengths or (case.tk,) * case.batch
    out_rows, q_rows, k_rows, v_rows = (
        np.concatenate([x[b : b + 1, :, :n] for b, n in enumerate(lengths)], axis=-2)
        for x, lengths in zip(arrays, (queries, queries, keys, keys), strict=True)
    )
    offsets = dict(
        cu_seqlens_q=tuple(int(n) for n in np.cumsum((0, *queries))),
        cu_seqlens_k=tuple(int(n) for n in np.cumsum((0, *keys))),
    )
    return out_rows, q_rows, k_rows, v_rows, offsets


def random_stream(seed: int, inputs_id: str) -> np.random.Generator:
    """A generator fixed by the run's seed and the test's id without the implementation's name
    (``inputs_id``), so each test's data is stable whatever else is selected, two tests never
    share a stream, and every implementation gets the same data in the same test."""
    return np.random.default_rng([seed, zlib.crc32(inputs_id.encode())])


def rerun_command(test_id: str) -> str:
    """The command that runs one conformance test again, from the directory the run started in,
    whether the suite is a checkout (its conftest.py loads the plugin) or an installed package
    (its pytest11 entry point does): the test named by module, not by a path relative to
    wherever pytest settled its rootdir."""
    path, _, rest = test_id.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    return f"python -m pytest --pyargs '{module}::{rest}'"


@dataclass
class Document:
    """The document itself as a test's subject: the mathematics tests check its claims on no
    implementation, and say so in their failure messages."""

    test_id: str
    claims: tuple[str, ...]  # the test's claims, from its marker
    notes: TestNotes = field(default_factory=TestNotes)
    name = None  # no implementation

    def reproducer(self, case: Case | None = None) -> str:
        return rerun_command(self.test_id)


@dataclass
class Subject:
    """An implementation under test, bound to one test: its claims, its random stream, its
    reproducer and what the judge notes along the way."""

    client: ImplementationClient
    selector: str  # what to pass to --impl to select it again
    seed: int
    test_id: str
    claims: tuple[str, ...] = ()  # the test's claims, from its marker
    rerun_options: str = ""  # further options the reproducer needs (hypothesis profile, seed)
    notes: TestNotes = field(default_factory=TestNotes)
    inputs_id: str | None = None  # what the inputs are drawn from (None: the test id)
    # Which regimes its calls draw is read by the JSON report alone, and reading a call's scores
    # for them is about a tenth of the judge's time: a run without one does not note them.
    notes_regimes: bool = True

    def __post_init__(self) -> None:
        self.rng = random_stream(self.seed, self.inputs_id or self.test_id)

    @property
    def name(self) -> str:
        return self.client.name

    def inputs(
        self, case: Case, spread: float = 1.0, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Standard normal q, k, v times ``spread``, rounded to the case's dtype, as float64,
        drawn from ``rng`` (a generated case's own seed) or else this test's stream."""
        rng = self.rng if rng is None else rng
        return tuple(
            round_to(spread * rng.standard_normal(shape), case.dtype)
            for shape in (case.q_shape, case.k_shape, case.v_shape)
        )

    def fit(self, case: Case) -> Case:
        """``case`` with a head dim and lengths the implementation declares, for tests whose claim
        does not depend on them: the nearest declared head dim above the test's (else the
        largest), so that a kernel compiled for a few head dims is still checked rather than
        skipped, a Dv equal to D following it; and the nearest declared lengths above the
        test's, keeping Tq = Tk or Tq < Tk as it was."""
        case = self.fit_lengths(self.fit_page_size(case))
        case = case.with_(sparse_duplicates=self.client.capabilities.sparse_duplicates)
        declared = self.client.capabilities.head_dims
        if declared is None or case.head_dim in declared:
            return case
        above = [d for d in sorted(declared) if d >= case.head_dim]
        head_dim = above[0] if above else max(declared)
        value_dim = head_dim if case.value_dim == case.head_dim else case.value_dim
        return case.with_(head_dim=head_dim, value_dim=value_dim)

    def fit_lengths(self, case: Case) -> Case:
        """``case`` with Tq and Tk the implementation declares (Capabilities.length_multiple,
        min_length, max_length). A case whose lengths are spelled out per item (key or query
        lengths, packed offsets, a paged cache's) is left as it is, to be skipped where its
        lengths are not declared."""
        caps = self.client.capabilities
        spelled_out = (case.key_lengths, case.query_lengths, case.cu_seqlens_q, case.page_size)
        if any(value is not None for value in spelled_out):
            return case
        tq = caps.fit_length(case.tq)
        longer = max(case.tk - case.tq, 0)  # how far Tk reaches past Tq, kept where it does
        tk = caps.fit_length(tq + longer if longer else case.tk)
        return case.with_(tq=tq, tk=tk)

    def fit_page_size(self, case: Case) -> Case:
        """``case`` with a page size the implementation declares: the largest declared one up to
        the test's, so that an item still spans several pages, its last one part full (else the
        smallest)."""
        declared = self.client.capabilities.page_sizes
        if case.page_size is None or declared is None or case.page_size in declared:
            return case
        below = [n for n in sorted(declared) if n <= case.page_size]
        return case.with_(page_size=below[-1] if below else min(declared))

    def require(self, case: Case, *, weights: bool = False, autograd: bool = False) -> None:
        """Skip, naming the missing capability, when the implementation does not declare what
        ``case`` needs."""
        declared = self.client.capabilities.sparse_duplicates
        if case.kv_indices is not None and case.sparse_duplicates != declared:
            raise RuntimeError(  # the suite's own slip: the truth would be another convention's
                f"a sparse case judged under sparse_duplicates={case.sparse_duplicates!r} where "
                f"{self.name} declares {declared!r}: the test did not fit it (Subject.fit)"
            )
        missing = self.missing(case, weights=weights, autograd=autograd)
        if missing:
            pytest.skip(f"{self.name} does not declare {', '.join(missing)}")

    @staticmethod
    def query_only(case: Case) -> bool:
        """Whether the case's dtype is q's alone, k and v being in a narrower format."""
        return case.fp8_convention == "kv_scale" or case.block_convention in CACHE_CONVENTIONS

    def missing(self, case: Case, *, weights: bool = False, autograd: bool = False) -> list[str]:
        """What ``case`` needs that the implementation does not declare, in words."""
        caps = self.client.capabilities
        return [
            what
            for what, needed, declared in (
                (
                    f"dtype {case.dtype}" + (" for q" if self.query_only(case) else ""),
                    True,
                    case.dtype in (case.fp8_format, case.block_element)
                    or case.dtype in (caps.fp8_queries if self.query_only(case) else caps.dtypes),
                ),
                ("fp8 (FP8 operands with scales)", case.fp8_format is not None, caps.fp8),
                (
                    f"FP8 format {case.fp8_format}",
                    case.fp8_format is not None,
                    case.fp8_format in caps.fp8_formats,
                ),
                (
                    f"the FP8 {case.fp8_convention} convention",
                    case.fp8_convention is not None,
                    case.fp8_convention in caps.fp8_conventions,
                ),
                (
                    f"k and v scales per {case.fp8_kv_scale}",
                    case.fp8_kv_scale is not None,
                    case.fp8_kv_scale in caps.fp8_kv_scales,
                ),
                (
                    "block_scaled (block-scaled operands)",
                    case.block_format is not None,
                    caps.block_scaled,
                ),
                (
                    f"block format {case.block_format}",
                    case.block_format is not None,
                    case.block_format in caps.block_formats,
                ),
                (
                    f"the {case.block_convention} block-scaled convention",
                    case.block_convention is not None,
                    case.block_convention in caps.block_conventions,
                ),
                ("non-causal attention", not case.causal, caps.non_causal),
                ("Tq != Tk", case.tq != case.tk, caps.cross_length),
                ("an explicit scale", case.scale is not None, caps.explicit_scale),
                (f"head dim {case.head_dim}", True, caps.supports_head_dim(case.head_dim)),
                *(
                    (f"{which}: {caps.length_problem(length)}", True, False)
                    for which, length in (("Tq", case.tq), ("Tk", case.tk))
                    if caps.length_problem(length)
                ),
                (
                    "the log-sum-exp's gradient (lse_backward)",
                    autograd and case.return_lse is not None,
                    caps.lse_backward,
                ),
                (
                    f"page size {case.page_size}",
                    case.page_size is not None,
                    case.page_size is None or caps.supports_page_size(case.page_size),
                ),
                ("Dv != D", case.value_dim != case.head_dim, caps.distinct_value_dim),
                ("attention weights", weights, caps.exposes_weights),
                ("autograd", autograd, caps.autograd),
                *(
                    (feature.missing, case.needs(feature), caps.declares(feature.name))
                    for feature in FEATURES
                ),
            )
            if needed and not declared
        ]

    def note_regimes_of_call(self, case: Case, q, k, v) -> None:
        """Note the regimes a call of ``case`` on float64 q, k, v draws, if the run reads them."""
        if self.notes_regimes:
            self.notes.note_regimes(regimes_of_call(case, q, k, v))

    def to_native(self, case: Case, *arrays: np.ndarray) -> list[Any]:
        return [self.client.from_numpy(a, case.dtype) for a in arrays]

    def call_native(self, case: Case, q, k, v) -> Any:
        """The implementation's native output for float64 arrays q, k, v (exact in the dtype).

        Skips, with the reason, when the implementation does not declare what the case needs."""
        self.require(case)
        self.note_regimes_of_call(case, q, k, v)
        nq, nk, nv = self.to_native(case, q, k, v)
        return self.client.attention(
            nq,
            nk,
            nv,
            causal=case.causal,
            scale=case.scale,
            layout=case.layout,
            poison=case.poison_allocations,
            **case.variant,
        )

    def call(self, case: Case, q, k, v) -> np.ndarray:
        """The implementation's output as a float64 NumPy array of the case's output shape."""
        out = self.client.to_numpy(self.call_native(case, q, k, v))
        if out.shape != case.out_shape:
            raise ImplementationBroke(
                f"{self.name} returned shape {out.shape}, but should return {case.out_shape} "
                f"[{case.describe()}]"
            )
        return out.astype(np.float64)

    def call_with_lse(self, case: Case, q, k, v) -> tuple[np.ndarray, np.ndarray]:
        """The implementation's (out, lse) with return_lse=True, as float64 arrays of shapes
        (B, H, Tq, Dv) and (B, H, Tq); the lse as returned, in the base it declares."""
        answer = self.call_native(case.with_(return_lse=True), q, k, v)
        out, lse = (self.client.to_numpy(x) for x in answer)
        for what, got, shape in (("out", out, case.out_shape), ("lse", lse, case.q_shape[:-1])):
            if got.shape != shape:
                raise ImplementationBroke(
                    f"{self.name} returned {what} of shape {got.shape} with return_lse=True, but "
                    f"should return {shape} [{case.describe()}]"
                )
        return out.astype(np.float64), lse.astype(np.float64)

    def merge(self, case: Case, outputs, lses) -> tuple[np.ndarray, np.ndarray]:
        """The implementation's own merge_states of float64 states exact in the case's dtype,
        outputs (P, B, H, Tq, Dv) and lses (P, B, H, Tq): (out, lse) as float64."""
        caps = self.client.capabilities
        if not caps.merges_states:
            pytest.skip(f"{self.name} does not declare merge_states")
        if self.notes_regimes:
            self.notes.note_regimes(regimes_of_merge(lses))
        answer = self.client.merge_states(*self.to_native(case, outputs, lses))
        out, lse = (self.client.to_numpy(x).astype(np.float64) for x in answer)
        if out.shape != outputs.shape[1:] or lse.shape != lses.shape[1:]:
            raise ImplementationBroke(
                f"{self.name}'s merge_states returned shapes {out.shape} and {lse.shape}, but "
                f"should return {outputs.shape[1:]} and {lses.shape[1:]}"
            )
        return out, lse

    def reproducer(self, case: Case | None = None) -> str:
        line = (
            f"{rerun_command(self.test_id)} --impl {self.selector} --attnspec-seed {self.seed}"
            + (f" {self.rerun_options}" if self.rerun_options else "")
        )
        return f"{line}   # {case.describe()}" if case else line
