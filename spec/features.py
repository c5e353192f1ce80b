"""The attention that kernels ship beyond the document, one declaration per feature.

A feature is what an implementation declares (``Capabilities(window=True)``), what an extension
claim's ``capability`` names in ``claims.toml``, the keyword arguments a call of it carries, and
the convention it follows, with the names the ecosystem uses. Everything that needs to know the
features - the capabilities, the plain-callable contract, a test's case, its skips, the catalogue
- reads :data:`FEATURES`: a new feature is its entry here, its Case field (the value a test sets),
its claim, its formula and its tests.
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
    # whether the catalogue's general mistakes (spec/mistakes/forward.py: the plain formula with one
    # thing wrong) apply to calls with it; a score modifier's calls get its own mistakes instead,
    # which model every modifier, and the log-sum-exp its own (spec/mistakes/state.py); a paged
    # call is the dense one laid out otherwise, so the general mistakes apply, and the pages'
    # own besides
    in_mistakes: bool = True
    # whether it only lays the same inputs out otherwise (a page pool): the truth is the dense
    # call's, computed without its keywords
    layout_only: bool = False
    # whether an implementation declaring a backward (Capabilities.autograd) differentiates
    # calls with it: every feature training runs through; not the two that serving alone uses
    # (a page pool, padded query rows), whose calls vjp is never given
    differentiated: bool = True


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
        differentiated=False,
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
    Feature(
        "paged",
        "k and v as page pools (pages, page_size, Hkv, D) with block_table (B, max_pages), a "
        "NumPy int32 array, and key_lengths: item b's keys are its pages in table order, cut at "
        "L_b (vLLM, FlashInfer kv_indices/kv_last_page_len, FlashAttention block_table); pages no "
        "table points to and slots past L_b are never read",
        keywords=("page_size",),
        plain_keywords=("block_table",),
        flag="paged",
        missing="a paged key/value cache (block_table)",
        layout_only=True,
        differentiated=False,
    ),
    Feature(
        "softcap",
        "softcap=c: the scaled scores are capped as x <- c * tanh(x / c) before the mask (Gemma 2; "
        "FlashAttention softcap, FlashInfer logits_soft_cap)",
        keywords=("softcap",),
        plain_keywords=("softcap",),
        flag="softcap",
        missing="softcap",
        in_mistakes=False,
    ),
    Feature(
        "alibi",
        "alibi_slopes=(m_0, ..., m_{H-1}): query head h adds -m_h * |p - j| to the score of the "
        "query at absolute position p (bottom-right aligned) and key j, after the softcap "
        "(FlashAttention alibi_slopes; under a causal mask FlashInfer's +m_h * (j - p))",
        keywords=("alibi_slopes",),
        plain_keywords=("alibi_slopes",),
        flag="alibi",
        missing="alibi_slopes",
        in_mistakes=False,
    ),
    Feature(
        "sinks",
        "sinks=(s_0, ..., s_{H-1}): a learned logit per query head, not scaled, joins each row's "
        "softmax denominator alone, p_j = exp(x_j) / (sum_k exp(x_k) + exp(s_h)) (gpt-oss; "
        "FlashAttention learnable_sink, FlashInfer's sink attention); s_h = -inf is no sink",
        keywords=("sinks",),
        plain_keywords=("sinks",),
        flag="sinks",
        missing="sinks",
        in_mistakes=False,
    ),
    Feature(
        "lse",
        "return_lse=True: the call returns (out, lse), lse (B, H, Tq) the log-sum-exp of each "
        "row's scaled, modified, masked scores, the sink's logit not included, in the base the "
        "implementation declares (Capabilities.lse_base: e, or 2); with padded query rows or "
        "packed sequences each item's or sequence's rows have its own keys' (the padded rows' "
        "are not compared), a row that sees no key -inf; merge_states(outputs, lses), "
        "where an implementation ships one, merges parts over disjoint keys as "
        "o = sum_i exp(lse_i - L) o_i, L = logsumexp_i lse_i (FlashAttention softmax_lse and "
        "flash_attn_combine, FlashInfer merge_state, vLLM merge_attn_states)",
        keywords=("return_lse",),
        plain_keywords=("return_lse",),
        flag="lse",
        missing="return_lse (the log-sum-exp)",
        in_mistakes=False,
    ),
    Feature(
        "chunked",
        "chunk=C: the query at absolute position p sees key j only when j <= p and "
        "j // C == p // C (Llama 4's chunked attention, FlashAttention attention_chunk); causal "
        "attention only",
        keywords=("chunk",),
        plain_keywords=("chunk",),
        flag="chunked",
        missing="chunk",
        in_mistakes=False,
    ),
    Feature(
        "custom_mask",
        "attn_mask: a boolean array broadcastable to (B, H, Tq, Tk), True where the query may see "
        "the key (PyTorch scaled_dot_product_attention's boolean attn_mask), a NumPy array as "
        "block_table is; intersected with the causal mask (bottom-right aligned), a window and "
        "key lengths; a row it leaves no key follows the declared empty-row convention",
        keywords=("attn_mask",),
        plain_keywords=("attn_mask",),
        flag="custom mask",
        missing="attn_mask (a boolean mask of which keys each query sees)",
    ),
    Feature(
        "tree_mask",
        "tree_mask: a boolean array (B or 1, Tq, Tq), a NumPy array as block_table is: the Tq "
        "query rows are draft tokens, the Tq newest keys theirs, and draft i sees every earlier "
        "key and the drafts its row marks (its ancestors and itself in the draft tree); "
        "intersected with the causal mask (TensorRT-LLM's and EAGLE's speculative decoding)",
        keywords=("tree_mask",),
        plain_keywords=("tree_mask",),
        flag="tree mask",
        missing="tree_mask (speculative decoding's draft tree)",
    ),
    Feature(
        "packed_mask",
        "packed_mask with mask_indptr: FlashInfer's custom mask bit-packed, a uint8 NumPy array "
        "holding each packed sequence's (or each batch item's) boolean (Tq_s x Tk_s) block, "
        "row-major, eight bits a byte, the first in the lowest bit (little-endian, as "
        "FlashInfer's prefill wrappers pack it; flashinfer.packbits alone defaults to "
        "big-endian), block s's bytes from mask_indptr[s] on (in bytes, not bits); True where "
        "the query may see the key, intersected with the causal mask; a row it leaves no key "
        "follows the declared empty-row convention",
        keywords=("packed_mask", "mask_indptr"),
        plain_keywords=("packed_mask", "mask_indptr"),
        flag="packed mask",
        missing="packed_mask (FlashInfer's bit-packed custom mask)",
        differentiated=False,
    ),
    Feature(
        "sparse",
        "kv_indices: an int32 or int64 array (B, Hkv, Tq, K), a NumPy array as block_table is: "
        "query row i of every query head of key/value head h' sees the keys its row lists, each "
        "once however often listed (a set: FlashAttention 4's gather_kv_indices reference; "
        "Capabilities.sparse_duplicates = 'count' declares cuDNN's multiset, a key listed m "
        "times weighing m), -1 an empty slot; intersected with the causal mask (bottom-right "
        "aligned) and key lengths "
        "(DeepSeek's sparse attention: FlashMLA's sparse kernels, cuDNN's DSA); a row that "
        "lists no key it may see follows the declared empty-row convention",
        keywords=("kv_indices",),
        plain_keywords=("kv_indices",),
        flag="sparse",
        missing="kv_indices (index-sparse attention)",
    ),
    Feature(
        "topk_length",
        "topk_length=(n_0, ..., n_{B-1}) with kv_indices: only the first n_b slots of item b's "
        "rows count, whatever the slots past them hold (FlashMLA's topk_length)",
        keywords=("topk_length",),
        plain_keywords=("topk_length",),
        flag="topk length",
        missing="topk_length (slots past it not read)",
    ),
    Feature(
        "sparse_blocks",
        "kv_block_size=b with kv_indices: each index names a block of b keys, index j the keys "
        "j * b .. j * b + b - 1 (the last block partial where b does not divide Tk), -1 an empty "
        "slot; the blocks' keys are then seen as kv_indices' keys are (native sparse "
        "attention's block_indices, blocks of 32 to 64 keys)",
        keywords=("kv_block_size",),
        plain_keywords=("kv_block_size",),
        flag="sparse blocks",
        missing="kv_block_size (indices that name blocks of keys)",
    ),
)

FEATURE_NAMES = tuple(feature.name for feature in FEATURES)
# The call keywords a backward takes (spec.formula.reference_feature_vjp knows each); a sink's
# logits are an input the backward differentiates, return_lse becomes the lse's gradient.
DIFFERENTIATED_KEYWORDS = frozenset(
    keyword
    for feature in FEATURES
    if feature.differentiated
    for keyword in feature.keywords
    if keyword != "return_lse"
)
# The call keywords of the features the catalogue of mistakes does not model.
UNMODELLED_KEYWORDS = tuple(
    keyword for feature in FEATURES if not feature.in_mistakes for keyword in feature.keywords
)
# A claim that needs no declaration (any implementation is held to it): claims.toml's "none".
NO_FEATURE = "none"


def feature_named(name: str) -> Feature:
    for feature in FEATURES:
        if feature.name == name:
            return feature
    raise KeyError(f"{name!r} is not a feature; features are: {', '.join(FEATURE_NAMES)}")
