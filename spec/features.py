"""The attention that kernels ship beyond the document, one declaration per feature.

A feature is what an implementation declares (``Capabilities(window=True)``), what an extension
claim's ``capability`` names in ``claims.toml``, the keyword arguments a call of it carries, and
the convention it follows, with the names the ecosystem uses. Everything that needs to know the
features - the capabilities, the plain-callable contract, a test's case, its skips, the catalogue
- reads :data:`FEATURES`: a new feature is its entry here, its claim, its formula and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str  # Capabilities(name=True), and a claim's capability
    convention: str  # what the contract means by it
    keywords: tuple[str, ...]  # the call's keyword arguments it brings (none: its shapes tell)
    plain_keywords: tuple[str, ...]  # a plain callable declares it by accepting all of these
    flag: str  # how Capabilities.describe() names it
    missing: str  # how a test skipped for want of it names it


FEATURES: tuple[Feature, ...] = (
    Feature(
        "gqa",
        "k and v with Hkv heads, Hq = g * Hkv: query head h reads head h // g (PyTorch "
        "enable_gqa, FlashAttention); Hkv = 1 is multi-query attention",
        keywords=(),
        plain_keywords=("enable_gqa",),
        flag="gqa",
        missing="gqa (fewer k/v heads than q heads)",
    ),
    Feature(
        "window",
        "window=w: the query at absolute position p sees keys p - w <= j <= p "
        "(FlashAttention window_size=(w, 0)); causal attention only",
        keywords=("window",),
        plain_keywords=("window",),
        flag="window",
        missing="window",
    ),
    Feature(
        "key_lengths",
        "key_lengths=(L_0, ..., L_{B-1}): item b holds its first L_b keys, its query row i sits "
        "at position i + L_b - Tq (FlashAttention cache_seqlens), and the padding past L_b, "
        "whatever it holds, is never read",
        keywords=("key_lengths",),
        plain_keywords=("key_lengths",),
        flag="key lengths",
        missing="key_lengths",
    ),
    Feature(
        "query_lengths",
        "query_lengths=(Lq_0, ..., Lq_{B-1}), with key lengths or without: item b's first Lq_b "
        "query rows are its queries, row i at position i + L_b - Lq_b; the rows past Lq_b are "
        "padding and hold what Capabilities.padded_query_rows declares (zeros, or unspecified)",
        keywords=("query_lengths",),
        plain_keywords=("query_lengths",),
        flag="query lengths",
        missing="query_lengths",
    ),
    Feature(
        "packed",
        "cu_seqlens_q=(0, ..., Tq), cu_seqlens_k=(0, ..., Tk): sequences packed along the token "
        "axis of a batch of one, sequence s holding query rows cu_seqlens_q[s] .. "
        "cu_seqlens_q[s+1] - 1 and the keys likewise, each attending to its own keys alone, "
        "bottom-right aligned (FlashAttention flash_attn_varlen_func)",
        keywords=("cu_seqlens_q", "cu_seqlens_k"),
        plain_keywords=("cu_seqlens_q", "cu_seqlens_k"),
        flag="packed",
        missing="packed sequences",
    ),
)

FEATURE_NAMES = tuple(feature.name for feature in FEATURES)
# A claim that needs no declaration (any implementation is held to it): claims.toml's "none".
NO_FEATURE = "none"


def feature_named(name: str) -> Feature:
    for feature in FEATURES:
        if feature.name == name:
            return feature
    raise KeyError(f"{name!r} is not a feature; features are: {', '.join(FEATURE_NAMES)}")
