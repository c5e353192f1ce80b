"""What the suite found in the ecosystem's attention, one finding per behaviour, each with the
adapters and claims it explains and a reproducer that uses the library alone.

A finding is a *deviation* (the library computes or accepts what the contract rejects, and does
not document it) or a *convention* (documented behaviour that differs from the contract; the
bridged adapter shows the way around it). It explains the failing tests of its adapters that
match its patterns (shell-style, on the test's name with the adapter left out of its parameters:
``test_unattendable_inputs_raise[*-kv-length-mismatch]``). ``python -m
conformance.report.ecosystem`` refuses to write the table while a test that an adapter failed
matches no finding, and
tests/test_ecosystem.py runs every reproducer whose library is installed: each asserts what it
shows, so a library that changes its behaviour fails that test until the finding is updated.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

DEVIATION = "deviation"
CONVENTION = "convention"


@dataclass(frozen=True)
class Finding:
    summary: str  # one line
    kind: str  # DEVIATION or CONVENTION
    library: str  # the module the reproducer needs
    reproducer: str  # Python source using the library alone; asserts the behaviour it shows
    adapters: tuple[str, ...]  # the adapters whose failures it explains
    tests: tuple[str, ...]  # patterns of the failing tests it explains

    def explains(self, adapter: str, test: str) -> bool:
        """Whether this finding explains ``adapter`` failing ``test`` (a node id)."""
        return adapter in self.adapters and any(
            fnmatch.fnmatchcase(test_name(test, adapter), pattern) for pattern in self.tests
        )

    def __post_init__(self) -> None:
        if self.kind not in (DEVIATION, CONVENTION):
            raise ValueError(
                f"Finding.kind={self.kind!r}, but should be {DEVIATION} or {CONVENTION}"
            )


def test_name(node_id: str, adapter: str) -> str:
    """``path::test_x[adapter-float32-case]`` -> ``test_x[float32-case]``."""
    name = node_id.rsplit("::", 1)[-1]
    return name.replace(f"[{adapter}-", "[", 1).replace(f"[{adapter}]", "")


FINDINGS: list[Finding] = []


TOP_LEFT_TESTS = (
    "*Tq<Tk*",
    "*causal-Tq>Tk*",
    "test_formula_with_fewer_queries_than_keys*",
    "test_incremental_computation_reproduces_every_row*",
    "test_every_output_element_is_written[*-decode]",
    "test_gradients_match_the_oracle[*-causal]",
)

FINDINGS += [
    Finding(
        summary="torch SDPA's `is_causal=True` aligns the mask top-left when Tq != Tk, as its "
        "documentation says: a chunk of queries against a longer cache misses the cache's last "
        "Tk - Tq keys",
        kind=CONVENTION,
        library="torch",
        adapters=("torch_sdpa_naive",),
        tests=TOP_LEFT_TESTS,
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
bottom_right = torch.ones(2, 5, dtype=torch.bool).tril(diagonal=5 - 2)
cache_aware = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right)
# the last query (position 4) sees all five keys only with the bottom-right mask
assert not torch.allclose(top_left[..., -1, :], cache_aware[..., -1, :])
assert torch.allclose(cache_aware[..., -1, :], F.scaled_dot_product_attention(q[..., -1:, :], k, v))
""",
    ),
    Finding(
        summary="torch SDPA accepts keys and values of different lengths (8 keys, 9 values) on "
        "its `is_causal` path and returns an answer instead of raising",
        kind=DEVIATION,
        library="torch",
        adapters=("torch_sdpa_naive", "transformers_sdpa_naive"),
        tests=("test_unattendable_inputs_raise[*-kv-length-mismatch]",),
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 9, 4)
out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # no error
assert out.shape == (1, 2, 8, 4)
""",
    ),
    Finding(
        summary="torch SDPA accepts queries and keys of head dim 0 and returns an answer instead "
        "of raising",
        kind=DEVIATION,
        library="torch",
        adapters=(
            "torch_sdpa_naive",
            "torch_sdpa_bridged",
            "transformers_sdpa_naive",
            "transformers_sdpa_bridged",
        ),
        tests=("test_unattendable_inputs_raise[*-head-dim-0]",),
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.zeros(1, 2, 8, 0), torch.zeros(1, 2, 8, 0), torch.randn(1, 2, 8, 4)
for options in ({"is_causal": True}, {"attn_mask": torch.ones(8, 8, dtype=torch.bool).tril()}):
    assert F.scaled_dot_product_attention(q, k, v, **options).shape == (1, 2, 8, 4)
""",
    ),
    Finding(
        summary="torch SDPA with `is_causal=True` and a NaN or infinite scale returns finite "
        "values (zeros for NaN) instead of NaN or an error",
        kind=DEVIATION,
        library="torch",
        adapters=("torch_sdpa_naive", "transformers_sdpa_naive"),
        tests=("*-scale-nan]", "*-scale-inf]"),
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=float("nan"))
assert not out.isnan().any()  # the formula's arithmetic gives NaN everywhere
""",
    ),
    Finding(
        summary="transformers' `sdpa_attention_forward` with no mask relies on `is_causal`, "
        "top-left aligned: right for a decoding step (Tq = 1), wrong for a chunk of 1 < Tq < Tk "
        "queries against a cache (its own mask functions pass a mask there)",
        kind=CONVENTION,
        library="transformers",
        adapters=("transformers_sdpa_naive",),
        tests=TOP_LEFT_TESTS,
        reproducer="""
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

layer = torch.nn.Module()
layer.is_causal, layer.num_key_value_groups = True, 1
q, k, v = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 7, 8), torch.randn(1, 1, 7, 8)
decode, _ = sdpa_attention_forward(layer, q[..., -1:, :], k, v, None)
chunk, _ = sdpa_attention_forward(layer, q, k, v, None)  # (B, T, H, D)
# the chunk's last query sits where the decoding step does, yet sees only its first 3 keys
assert not torch.allclose(chunk[:, -1], decode[:, -1])
""",
    ),
    Finding(
        summary="transformers' `sdpa_attention_forward` takes Tq from `query.shape[2]` and "
        "transposes dims 1 and 2 of its answer: a query or key of another rank, which torch "
        "broadcasts, comes back in a wrong shape instead of an error",
        kind=DEVIATION,
        library="transformers",
        adapters=("transformers_sdpa_naive", "transformers_sdpa_bridged"),
        tests=("*-q-rank-3]", "*-k-rank-5]"),
        reproducer="""
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

layer = torch.nn.Module()
layer.is_causal, layer.num_key_value_groups = True, 1
q, k, v = torch.randn(2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
out, _ = sdpa_attention_forward(layer, q, k, v, None)
assert out.shape == (1, 4, 4, 4)  # torch itself gives (1, 2, 8, 4), i.e. (1, 8, 2, 4) here
""",
    ),
    Finding(
        summary="transformers' additive masks (0 or the dtype's lowest value) give a query row "
        "that sees no key the mean of all values: neither zeros, NaN nor an error",
        kind=DEVIATION,
        library="transformers",
        adapters=("transformers_sdpa_bridged", "transformers_llama_eager"),
        tests=("*causal-Tq>Tk*",),
        reproducer="""
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

layer = torch.nn.Module()
layer.num_key_value_groups = 1
q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4)
# bottom-right: the first of 3 queries against 2 keys sees none of them
hidden = ~torch.ones(3, 2, dtype=torch.bool).tril(-1)
mask = torch.zeros(3, 2).masked_fill(hidden, torch.finfo(torch.float32).min)
out, _ = eager_attention_forward(layer, q, k, v, mask[None, None], scaling=0.5)
assert torch.allclose(out[0, 0, 0], v[0, 0].mean(dim=0))
""",
    ),
    Finding(
        summary="Llama's eager attention computes float64 at float32 precision: its softmax is "
        "computed in float32 whatever the input dtype (`softmax(..., dtype=torch.float32)`)",
        kind=DEVIATION,
        library="transformers",
        adapters=("transformers_llama_eager",),
        tests=("*[float64*",),
        reproducer="""
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

layer = torch.nn.Module()
layer.num_key_value_groups, layer.training = 1, False
q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(3))
out, _ = eager_attention_forward(layer, q, k, v, None, scaling=8**-0.5)
exact = torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5, dim=-1) @ v
assert out.dtype == torch.float64
assert (out.transpose(1, 2) - exact).abs().max() > 1e-9  # float64 rounding is about 1e-16
""",
    ),
    Finding(
        summary="MLX's `mask='causal'` with more queries than keys gives the rows that see no "
        "key values that are neither zeros, NaN nor an error",
        kind=DEVIATION,
        library="mlx",
        adapters=("mlx_fast",),
        tests=("*causal-Tq>Tk*",),
        reproducer="""
import mlx.core as mx

with mx.stream(mx.cpu):
    q = mx.random.normal((1, 1, 3, 4))
    k, v = mx.random.normal((1, 1, 2, 4)), mx.random.normal((1, 1, 2, 4))
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask="causal")
    first = out[0, 0, 0]  # bottom-right, the first of 3 queries sees neither key
    assert not mx.all(first == 0).item() and not mx.any(mx.isnan(first)).item()
""",
    ),
]
