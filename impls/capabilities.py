"""What an implementation declares: its dtypes, what it computes, the conventions it follows where
kernels disagree on purpose, the features it implements and the layouts it reads.

The vocabularies live here with :class:`Capabilities`, which checks a declaration against them
when it is made; the features themselves are declared once, in :mod:`spec.features`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.block_scaled import BLOCK_CONVENTIONS, BLOCK_FORMATS, CACHE_CONVENTIONS
from spec.dtypes import check_dtype
from spec.features import FEATURES
from spec.fp8 import (
    FP8_CONVENTIONS,
    FP8_FORMATS,
    KV_SCALE_GRANULARITIES,
    NAN_HANDLINGS,
    P_ROUNDINGS,
)
from spec.masks import LISTED_KEYWORDS, MASK_CONVENTIONS

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

# What impls.validation.validate_inputs enforces: the convention of every built-in calling it.
RAISES_ON_ALL = tuple((name, "raise") for name in CONVENTIONS)

# The attention kernels ship beyond the document, each as the convention it follows.
EXTENSIONS: dict[str, str] = {feature.name: feature.convention for feature in FEATURES}

# What an implementation taking query_lengths leaves in the padded query rows.
PADDED_QUERY_ROWS = {
    "zeros": "rows past an item's query length are 0 (FlashAttention's padded outputs)",
    "unspecified": "rows past an item's query length hold anything and are not compared",
}

# What the rows of a batch item or packed sequence with no key at all hold (EMPTY-KV).
EMPTY_ROWS = {
    "zeros": "rows that see no key are 0, their log-sum-exp -inf (FlashAttention varlen, "
    "FlashInfer)",
    "nan": "rows that see no key are NaN, their log-sum-exp -inf: the formula's 0/0",
}

# The base of a returned log-sum-exp (the lse feature).
LSE_BASES = {
    "e": "the natural logarithm of sum_j exp(x_j) (FlashAttention, FlashInfer's merge_state)",
    "2": "log2 of sum_j 2^(x_j log2 e), as kernels computing with exp2 keep it",
}

# How inputs may arrive: views into other arrays, as a model's projections hand them over.
LAYOUTS: dict[str, str] = {
    "contiguous": "dense (B, H, T, D) arrays",
    "heads_last": "(B, T, H, D) arrays seen as (B, H, T, D) through a transposed view",
    "packed_qkv": "q, k and v as views of one (B, T, 3, H, D) projection",
    "row_gaps": "rows of D values at a pitch of D + 8: a slice of a wider array",
    "broadcast_kv": "k and v of one head broadcast along H with stride 0",
}

# The views one operand may be given alone, beside the others in theirs (LAYOUT-STRIDES' mixed
# layouts): a kernel that builds one operand's pointers with another's strides reads right only
# while the strides agree. A mixed layout is written "k=heads_last,v=row_gaps", the operands it
# leaves out dense; "broadcast_kv" there means that operand alone broadcast along H.
OPERAND_VIEWS = ("heads_last", "row_gaps", "broadcast_kv")
OPERANDS = ("q", "k", "v")


def operand_layouts(layout: str) -> dict[str, str]:
    """q's, k's and v's layouts in ``layout``: a name of LAYOUTS for all three, or a mixed one."""
    if layout == "broadcast_kv":
        return {"q": "contiguous", "k": layout, "v": layout}
    if layout in LAYOUTS:
        return dict.fromkeys(OPERANDS, layout)
    named = dict.fromkeys(OPERANDS, "contiguous")
    for part in layout.split(","):
        operand, _, view = part.partition("=")
        if (
            operand not in OPERANDS
            or view not in OPERAND_VIEWS
            or (view == "broadcast_kv" and operand == "q")
        ):
            raise ValueError(
                f"layout {layout!r}: {part!r} should be OPERAND=VIEW, OPERAND one of q, k, v and "
                f"VIEW one of {', '.join(OPERAND_VIEWS)} (broadcast_kv for k or v)"
            )
        named[operand] = view
    return named


def layout_views(layout: str) -> set[str]:
    """The layouts of LAYOUTS an implementation must declare to be held to ``layout``."""
    if layout in LAYOUTS:
        return {layout}
    return set(operand_layouts(layout).values()) - {"contiguous"}


# The Capabilities fields of an implementation with every feature, its padded query rows zeroed,
# computing every layout right: Capabilities(dtypes=..., **EVERY_EXTENSION).
EVERY_EXTENSION: dict[str, Any] = {
    **{feature.name: True for feature in FEATURES},
    "padded_query_rows": "zeros",
    "layouts": tuple(LAYOUTS),
    "merges_states": True,
}
# The features that change the scores or cut the causal mask into chunks: softcap, ALiBi,
# sinks, chunks. An implementation with the others: Capabilities(**every_extension_but(...)).
SCORE_FEATURES = ("softcap", "alibi", "sinks", "chunked")
# The features of 2026 beyond the score modifiers: the log-sum-exp and merged partial states, and
# paged key/value caches.
STATE_FEATURES = ("lse", "paged")
# The features whose call carries which keys each row sees as an array (spec.masks): a custom
# mask, the keys each row lists and how many of them count.
LISTED_FEATURES = tuple(
    feature.name for feature in FEATURES if set(feature.keywords) & set(LISTED_KEYWORDS)
)


def every_extension_but(*features: str) -> dict[str, Any]:
    """EVERY_EXTENSION with ``features`` (names in spec.features.FEATURES) left undeclared."""
    unknown = [name for name in features if name not in EVERY_EXTENSION]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a feature of spec.features")
    undeclared = dict.fromkeys(features, False)
    if "lse" in features:
        undeclared["merges_states"] = False  # no merge without a log-sum-exp to merge by
    return EVERY_EXTENSION | undeclared


def with_feature_flags(cls: type) -> type:
    """Gives the class a bool field per feature of spec.features (default False), before
    @dataclass makes its fields: Capabilities(window=True) declares the window feature."""
    for feature in FEATURES:
        cls.__annotations__[feature.name] = "bool"
        setattr(cls, feature.name, False)
    return cls


@dataclass(frozen=True)
@with_feature_flags
class Capabilities:
    """What an implementation declares; tests needing more are skipped, naming what is missing.
    Beyond the fields below, one bool per feature (spec.features.FEATURES): gqa, window, ..."""

    dtypes: tuple[str, ...]
    autograd: bool = False
    cross_length: bool = True  # Tq < Tk, bottom-right aligned
    explicit_scale: bool = True
    non_causal: bool = True
    head_dims: tuple[int, ...] | None = None  # None: every D >= 1
    # The sequence lengths its kernels take, Tq and Tk alike (the whole packed length for packed
    # sequences, the dense Tk for a paged cache): multiples of length_multiple from min_length up
    # to max_length (None: no maximum); a kernel that loads whole blocks of 128 rows unmasked
    # declares length_multiple=128
    length_multiple: int = 1
    min_length: int = 1
    max_length: int | None = None
    distinct_value_dim: bool = True  # v's head dim Dv may differ from q's and k's D
    exposes_weights: bool = False  # has attention_weights(), the (B, H, Tq, Tk) softmax
    # (name, value) pairs from CONVENTIONS; a name left out accepts any of its values
    conventions: tuple[tuple[str, str], ...] = ()
    padded_query_rows: str = "unspecified"  # with query_lengths: PADDED_QUERY_ROWS
    lse_base: str = "e"  # with lse: LSE_BASES
    # with lse and autograd: whether its backward takes the log-sum-exp's gradient (grad_lse);
    # False: the lse is returned for merging, its gradient not taken (GRAD-LSE is not checked)
    lse_backward: bool = True
    empty_rows: str = "zeros"  # with key_lengths or packed, an item with no key: EMPTY_ROWS
    # with sparse: how a key listed twice in a row counts (spec.masks.SPARSE_DUPLICATES)
    sparse_duplicates: str = "once"
    merges_states: bool = False  # with lse: it has merge_states(outputs, lses)
    # with paged: the page sizes its kernels take (vLLM's 16, FlashAttention's multiples of 256);
    # None: any
    page_sizes: tuple[int, ...] | None = None
    # LAYOUTS it computes right; one left out must compute right or raise a clear error
    layouts: tuple[str, ...] = ("contiguous",)
    # FP8 inputs with their scales (spec.fp8): the conventions it takes (FP8_CONVENTIONS), the
    # formats its FP8 operands may have (FP8_FORMATS), the key/value cache's scale granularities
    # (KV_SCALE_GRANULARITIES), where it rounds P (P_ROUNDINGS), and the dtype of its output
    # under FlashAttention 3's descale convention (the kv_scale convention's is q's); what it
    # does with a NaN stored in an FP8 operand (NAN_HANDLINGS); the dtypes q may have under the
    # key/value cache's convention (None: its dtypes; a NumPy kernel may take a bfloat16 q there,
    # through ml_dtypes, without declaring bfloat16 for every call)
    fp8: bool = False
    fp8_conventions: tuple[str, ...] = ("descale", "kv_scale")
    fp8_formats: tuple[str, ...] = ("float8_e4m3fn",)
    fp8_kv_scales: tuple[str, ...] = tuple(KV_SCALE_GRANULARITIES)
    fp8_p: str = "float32"
    fp8_output: str = "bfloat16"
    fp8_nan: str = "propagate"
    fp8_query_dtypes: tuple[str, ...] | None = None
    # Block-scaled inputs (spec.block_scaled): the conventions it takes (BLOCK_CONVENTIONS), the
    # formats (BLOCK_FORMATS), where it rounds P (P_ROUNDINGS: MXFP8 kernels round it to e4m3 at
    # 2^8, "e4m3_offset8"; block_cache_p, where set, under a cache's convention instead: a kernel
    # that decodes a cache for its 16-bit path rounds P to q's 16 bits) and the dtype of
    # mx_attention's output (the caches' is q's, one of fp8_queries)
    block_scaled: bool = False
    block_conventions: tuple[str, ...] = tuple(BLOCK_CONVENTIONS)
    block_formats: tuple[str, ...] = tuple(BLOCK_FORMATS)
    block_p: str = "float32"
    block_cache_p: str | None = None
    block_output: str = "bfloat16"

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
        if self.empty_rows not in EMPTY_ROWS:
            raise ValueError(
                f"Capabilities.empty_rows={self.empty_rows!r}, but should be one of "
                + ", ".join(EMPTY_ROWS)
            )
        for name, values in MASK_CONVENTIONS.items():
            if getattr(self, name) not in values:
                raise ValueError(
                    f"Capabilities.{name}={getattr(self, name)!r}, but should be one of "
                    + ", ".join(values)
                )
        if self.lse_base not in LSE_BASES:
            raise ValueError(
                f"Capabilities.lse_base={self.lse_base!r}, but should be one of "
                + ", ".join(LSE_BASES)
            )
        if self.merges_states and not self.lse:
            raise ValueError("Capabilities.merges_states=True, but lse is not declared")
        if self.page_sizes is not None and (
            not self.page_sizes
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.page_sizes)
        ):
            raise ValueError(
                f"Capabilities.page_sizes={self.page_sizes!r}, but should be None (any) or "
                "positive integers"
            )
        self.check_lengths()
        self.check_fp8()
        self.check_block_scaled()
        unknown = [layout for layout in self.layouts if layout not in LAYOUTS]
        if unknown or "contiguous" not in self.layouts:
            raise ValueError(
                f"Capabilities.layouts={self.layouts!r}, but should include 'contiguous' and name "
                "only " + ", ".join(LAYOUTS)
            )

    def check_lengths(self) -> None:
        for field in ("length_multiple", "min_length", "max_length"):
            value = getattr(self, field)
            if (value is not None or field != "max_length") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"Capabilities.{field}={value!r}, but should be a positive integer"
                    + (" or None (no maximum)" if field == "max_length" else "")
                )
        if self.max_length is not None and self.shortest_length > self.max_length:
            raise ValueError(
                f"Capabilities declares lengths that are multiples of {self.length_multiple} from "
                f"{self.min_length} to {self.max_length}: there is none"
            )

    def length_problem(self, length: int) -> str | None:
        """Why a sequence length of ``length`` is outside the declared lengths, or None."""
        if (
            length % self.length_multiple
            or length < self.min_length
            or (self.max_length is not None and length > self.max_length)
        ):
            return f"sequence length {length} (it declares {self.describe_lengths()})"
        return None

    @property
    def shortest_length(self) -> int:
        """The shortest declared length: the first multiple from min_length."""
        return -(-self.min_length // self.length_multiple) * self.length_multiple

    def fit_length(self, length: int) -> int:
        """The declared length nearest ``length`` from above (else the largest declared)."""
        step = self.length_multiple
        fitted = max(-(-length // step) * step, self.shortest_length)
        if self.max_length is not None and fitted > self.max_length:
            fitted = self.max_length // step * step
        return fitted

    def describe_lengths(self) -> str:
        words = f"multiples of {self.length_multiple} " if self.length_multiple > 1 else ""
        most = "" if self.max_length is None else f" to {self.max_length}"
        return f"{words}from {self.shortest_length}{most}"

    def check_fp8(self) -> None:
        self.check_vocabularies(
            self.fp8,
            ("fp8_conventions", FP8_CONVENTIONS),
            ("fp8_formats", FP8_FORMATS),
            ("fp8_kv_scales", KV_SCALE_GRANULARITIES),
            ("fp8_p", P_ROUNDINGS),
            ("fp8_nan", NAN_HANDLINGS),
        )
        for dtype in self.fp8_query_dtypes or ():
            check_dtype(dtype)
        for field in ("fp8_output", "block_output"):
            if getattr(self, field) not in ("float32", "float16", "bfloat16"):
                raise ValueError(
                    f"Capabilities.{field}={getattr(self, field)!r}, but should be one of "
                    "float32, float16, bfloat16"
                )

    def check_block_scaled(self) -> None:
        self.check_vocabularies(
            self.block_scaled,
            ("block_conventions", BLOCK_CONVENTIONS),
            ("block_formats", BLOCK_FORMATS),
            ("block_p", P_ROUNDINGS),
        )
        if self.block_cache_p is not None:
            self.check_vocabularies(self.block_scaled, ("block_cache_p", P_ROUNDINGS))

    def block_p_of(self, convention: str) -> str:
        """Where P is rounded in a block-scaled call of ``convention``: block_cache_p under a
        cache's, where declared, else block_p."""
        if self.block_cache_p is not None and convention in CACHE_CONVENTIONS:
            return self.block_cache_p
        return self.block_p

    def check_vocabularies(self, declared: bool, *fields: tuple[str, dict]) -> None:
        """Each field names values of its vocabulary: one for a string, at least one for a tuple
        where ``declared``."""
        for field, vocabulary in fields:
            value = getattr(self, field)
            values = value if isinstance(value, tuple) else (value,)
            if (declared and not values) or any(v not in vocabulary for v in values):
                raise ValueError(
                    f"Capabilities.{field}={value!r}, but should name "
                    + ("at least one of " if isinstance(value, tuple) else "one of ")
                    + ", ".join(vocabulary)
                )

    @property
    def fp8_queries(self) -> tuple[str, ...]:
        """The dtypes q may have under the key/value cache's FP8 convention."""
        return self.dtypes if self.fp8_query_dtypes is None else self.fp8_query_dtypes

    def declares(self, feature: str) -> bool:
        """Whether it implements the feature ``feature`` (a name in spec.features.FEATURES)."""
        return getattr(self, feature)

    def convention(self, name: str) -> str | None:
        """The declared convention ``name`` (a key of CONVENTIONS), or None: any is accepted."""
        return dict(self.conventions).get(name)

    def supports_head_dim(self, head_dim: int) -> bool:
        return self.head_dims is None or head_dim in self.head_dims

    def supports_page_size(self, page_size: int) -> bool:
        return self.page_sizes is None or page_size in self.page_sizes

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
            )
            if on
        ] + [feature.flag for feature in FEATURES if self.declares(feature.name)]
        dims = "any D" if self.head_dims is None else "D in " + ",".join(map(str, self.head_dims))
        text = f"{'/'.join(self.dtypes)}; {', '.join(flags) or 'causal only'}; {dims}"
        if self.length_problem(1) or self.max_length is not None:
            text += f"; T {self.describe_lengths()}"
        if set(self.layouts) == set(LAYOUTS):
            text += "; every layout"
        elif self.layouts != ("contiguous",):
            text += "; layouts " + ",".join(self.layouts)
        if self.query_lengths:
            text += f"; padded query rows {self.padded_query_rows}"
        if self.lse:
            text += f"; lse base {self.lse_base}" + (", merge_states" if self.merges_states else "")
            text += ", not differentiated" if self.autograd and not self.lse_backward else ""
        if self.key_lengths or self.packed:
            text += f"; empty rows {self.empty_rows}"
        if self.sparse:
            text += f"; duplicates {'counted' if self.sparse_duplicates == 'count' else 'once'}"
        if self.fp8:
            text += (
                f"; fp8 {','.join(self.fp8_conventions)} in {','.join(self.fp8_formats)}, "
                f"P in {self.fp8_p}, NaN {self.fp8_nan}"
            )
        if self.block_scaled:
            text += (
                f"; block-scaled {','.join(self.block_conventions)} in "
                f"{','.join(self.block_formats)}, P in {self.block_p}"
                + ("" if self.block_cache_p is None else f" (in {self.block_cache_p} in caches)")
            )
        if self.paged and self.page_sizes is not None:
            text += "; page sizes " + ",".join(map(str, self.page_sizes))
        if self.conventions == RAISES_ON_ALL:
            return text + "; raises on every convention"
        if self.conventions:
            return text + "; " + ", ".join(f"{n}={v}" for n, v in self.conventions)
        return text
