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
        name = test_name(test, adapter)
        # "[" opens a character class in fnmatch; in a test's name it is the parameters' bracket
        return adapter in self.adapters and any(
            fnmatch.fnmatchcase(name, pattern.replace("[", "[[]")) for pattern in self.tests
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


# Tests that put fewer queries than keys under a causal mask (or more: causal-Tq>Tk), where a
# top-left mask differs from the contract's bottom-right one; generated cases draw such shapes too,
# and every extension's decode case is one query against a longer cache.
TOP_LEFT_TESTS = (
    "*Tq<Tk*",
    "*causal-Tq>Tk*",
    "*[*-decode]",
    "test_formula_with_fewer_queries_than_keys*",
    "test_formula_with_value_dim_unlike_head_dim*",
    "test_formula_on_generated_cases*",
    "test_incremental_computation_reproduces_every_row*",
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
        adapters=("torch_sdpa_naive", "transformers_sdpa_naive", "keras_torch_naive"),
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
        adapters=("torch_sdpa_naive", "transformers_sdpa_naive", "keras_torch_naive"),
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


def top_left_reproducer(setup: str, causal_call: str) -> str:
    """A reproducer of a top-left causal flag: 2 queries against 5 keys; the last query sits at
    position 4, where a decoding step of one query sees all 5 keys. ``setup`` defines
    ``attend(q, k, v)`` (the library's causal call, (B, H, T, D) NumPy in and out) and
    ``attend_all(q, k, v)`` (no mask)."""
    return f"""
import numpy as np
{setup.strip()}


rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, t, 8)).astype(np.float32) for t in (2, 5, 5))
chunk = attend(q, k, v)  # {causal_call}
decode = attend_all(q[..., -1:, :], k, v)
assert not np.allclose(chunk[..., -1, :], decode[..., -1, :], atol=1e-5)
"""


FINDINGS += [
    Finding(
        summary="torch SDPA with `is_causal=True` and scale 0 returns NaN in every row but the "
        "last (CPU); the formula gives the mean of the visible values",
        kind=DEVIATION,
        library="torch",
        adapters=("torch_sdpa_naive", "transformers_sdpa_naive", "keras_torch_naive"),
        tests=("test_formula_with_explicit_scale[*-0.0-causal]",),
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.0)
assert out[..., :-1, :].isnan().all() and not out[..., -1, :].isnan().any()
""",
    ),
    Finding(
        summary="`nn.MultiheadAttention`'s usual causal `attn_mask`, "
        "`torch.triu(ones(Tq, Tk), diagonal=1)` (as `Transformer.generate_square_subsequent_mask` "
        "builds it for Tq = Tk), is top-left aligned when Tq != Tk",
        kind=CONVENTION,
        library="torch",
        adapters=("torch_mha_naive",),
        tests=TOP_LEFT_TESTS,
        reproducer=top_left_reproducer(
            """
import torch


def mha(q, k, v, mask):
    module = torch.nn.MultiheadAttention(8, 1, bias=False, batch_first=True)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.eye(8).repeat(3, 1))
        module.out_proj.weight.copy_(torch.eye(8))
    q, k, v = (torch.from_numpy(x[:, 0]) for x in (q, k, v))
    return module(q, k, v, attn_mask=mask, need_weights=False)[0][:, None].detach().numpy()


def attend(q, k, v):
    return mha(q, k, v, torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1))


def attend_all(q, k, v):
    return mha(q, k, v, None)
""",
            "attn_mask=torch.triu(ones(2, 5), diagonal=1)",
        ),
    ),
    Finding(
        summary="flex_attention's documented causal `mask_mod`, `q_idx >= kv_idx`, is top-left "
        "aligned when Tq != Tk",
        kind=CONVENTION,
        library="torch",
        adapters=("torch_flex_naive",),
        tests=TOP_LEFT_TESTS,
        reproducer=top_left_reproducer(
            """
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def attend(q, k, v):
    tq, tk = q.shape[2], k.shape[2]
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, tq, tk, device="cpu")
    q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    return flex_attention(q, k, v, block_mask=mask).numpy()


def attend_all(q, k, v):
    q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    return flex_attention(q, k, v).numpy()
""",
            "block_mask of q_idx >= kv_idx",
        ),
    ),
    Finding(
        summary="flex_attention with an infinite scale and a causal block mask returns finite "
        "values in some rows (zeros in the first) instead of NaN everywhere or an error",
        kind=DEVIATION,
        library="torch",
        adapters=("torch_flex_naive", "torch_flex_bridged"),
        tests=("*-scale-inf]",),
        reproducer="""
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
causal = create_block_mask(lambda b, h, i, j: i >= j, None, None, 8, 8, device="cpu")
out = flex_attention(q, k, v, block_mask=causal, scale=float("inf"))
assert not out.isnan().all()  # the formula's arithmetic gives NaN everywhere
""",
    ),
    Finding(
        summary="a NaN or inf in a future *value* reaches past rows: a dense `A @ V` multiplies "
        "it by its weight of 0 (0 x NaN is NaN); every library does so",
        kind=DEVIATION,
        library="torch",
        adapters=(
            "torch_sdpa_naive",
            "torch_sdpa_bridged",
            "torch_mha_naive",
            "torch_mha_bridged",
            "torch_flex_naive",
            "torch_flex_bridged",
            "transformers_sdpa_naive",
            "transformers_sdpa_bridged",
            "transformers_llama_eager",
            "keras_numpy_naive",
            "keras_numpy_bridged",
            "keras_torch_naive",
            "keras_torch_bridged",
            "keras_jax_naive",
            "keras_jax_bridged",
            "flax_nnx_naive",
            "flax_nnx_bridged",
            "mlx_fast",
            "tinygrad_naive",
            "tinygrad_bridged",
        ),
        tests=("test_nonfinite_future_values_do_not_reach_past_rows*",),
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
v[..., 3, :] = float("nan")  # seen by row 3 only
assert F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., 0, :].isnan().all()
""",
    ),
    Finding(
        summary="a NaN or inf in a future *key* reaches past rows where the causal mask is "
        "added to the scores (NaN + -inf is NaN): torch turns a boolean `attn_mask` into an "
        "added -inf, transformers and Keras' torch backend pass additive masks",
        kind=DEVIATION,
        library="torch",
        adapters=(
            "torch_sdpa_bridged",
            "torch_mha_naive",
            "torch_mha_bridged",
            "transformers_sdpa_bridged",
            "transformers_llama_eager",
            "keras_torch_bridged",
        ),
        tests=("test_nonfinite_future_keys_do_not_reach_past_rows*",),
        reproducer="""
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
k[..., 3, :] = float("nan")  # seen by row 3 only
mask = torch.ones(4, 4, dtype=torch.bool).tril()
assert F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[..., 0, :].isnan().all()
assert not F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., 0, :].isnan().any()
""",
    ),
    Finding(
        summary="Keras' `dot_product_attention(is_causal=True)` is top-left aligned when Tq != Tk "
        "(its documentation does not say which)",
        kind=CONVENTION,
        library="keras",
        adapters=("keras_numpy_naive", "keras_torch_naive", "keras_jax_naive"),
        tests=TOP_LEFT_TESTS,
        reproducer=top_left_reproducer(
            """
import os

os.environ["KERAS_BACKEND"] = "numpy"
import keras


def attend(q, k, v):
    t = lambda x: np.swapaxes(x, 1, 2)  # (B, T, H, D)
    return t(keras.ops.dot_product_attention(t(q), t(k), t(v), is_causal=True))


def attend_all(q, k, v):
    t = lambda x: np.swapaxes(x, 1, 2)
    return t(keras.ops.dot_product_attention(t(q), t(k), t(v)))
""",
            "keras.ops.dot_product_attention(is_causal=True)",
        ),
    ),
    Finding(
        summary="Keras' `dot_product_attention` accepts queries and keys of head dim 0 and "
        "returns an answer instead of raising (numpy and torch backends)",
        kind=DEVIATION,
        library="keras",
        adapters=(
            "keras_numpy_naive",
            "keras_numpy_bridged",
            "keras_torch_naive",
            "keras_torch_bridged",
        ),
        tests=("test_unattendable_inputs_raise[*-head-dim-0]",),
        reproducer="""
import os

os.environ["KERAS_BACKEND"] = "numpy"
import keras
import numpy as np

q, k = np.zeros((1, 8, 2, 0), "float32"), np.zeros((1, 8, 2, 0), "float32")
v = np.ones((1, 8, 2, 4), "float32")
assert keras.ops.dot_product_attention(q, k, v).shape == (1, 8, 2, 4)
""",
    ),
    Finding(
        summary="Keras masks with a large finite negative, so a query row that sees no key gets "
        "the mean of all values, and an infinite scale gives finite values: neither zeros, NaN "
        "nor an error",
        kind=DEVIATION,
        library="keras",
        adapters=(
            "keras_numpy_naive",
            "keras_numpy_bridged",
            "keras_torch_bridged",
            "keras_jax_naive",
            "keras_jax_bridged",
        ),
        tests=("*-causal-Tq>Tk]", "*-scale-inf]"),
        reproducer="""
import os

os.environ["KERAS_BACKEND"] = "numpy"
import keras
import numpy as np

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, t, 1, 4)).astype("float32") for t in (3, 2, 2))
mask = np.tril(np.ones((3, 2), bool), -1)  # bottom-right: query 0 sees neither key
out = keras.ops.dot_product_attention(q, k, v, mask=mask)
assert np.allclose(out[0, 0, 0], v[0, :, 0].mean(axis=0), atol=1e-6)
""",
    ),
    Finding(
        summary="Keras' numpy backend sums float16 products in float16: OUT-AFFINE's values near "
        "-1000 come back 1.13x the budget that float32 sums meet",
        kind=DEVIATION,
        library="keras",
        adapters=("keras_numpy_naive", "keras_numpy_bridged"),
        tests=("test_output_is_affine_in_values[float16-*",),
        reproducer="""
import os

os.environ["KERAS_BACKEND"] = "numpy"
import keras
import numpy as np

rng = np.random.default_rng(0)
q, k = (rng.standard_normal((1, 64, 1, 16)).astype("float16") for _ in range(2))
v = (rng.standard_normal((1, 64, 1, 16)) - 1000).astype("float16")
out = keras.ops.dot_product_attention(q, k, v).astype("float64")
w = np.exp(q[0, :, 0].astype("float64") @ k[0, :, 0].astype("float64").T / 4)
exact = (w / w.sum(-1, keepdims=True)) @ v[0, :, 0].astype("float64")
weights = (w / w.sum(-1, keepdims=True)).astype("float16").astype("float32")
summed_in_float32 = (weights @ v[0, :, 0].astype("float32")).astype("float16")
assert np.abs(out[0, :, 0] - exact).max() > 2 * np.abs(summed_in_float32 - exact).max()
""",
    ),
    Finding(
        summary="Flax's `nnx.dot_product_attention` (through `jax.nn.dot_product_attention`) "
        "computes float64 at float32 precision, with jax's x64 mode on",
        kind=DEVIATION,
        library="flax",
        adapters=("flax_nnx_naive", "flax_nnx_bridged"),
        tests=("*[float64*",),
        reproducer="""
import jax

jax.config.update("jax_enable_x64", True)
import numpy as np
from flax import nnx

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 16, 2, 8)) for _ in range(3))
out = np.asarray(nnx.dot_product_attention(q, k, v))
assert out.dtype == np.float64
s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
w = np.exp(s - s.max(-1, keepdims=True))
exact = np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), v)
assert np.abs(out - exact).max() > 1e-9  # float64 rounding is about 1e-16
""",
    ),
    Finding(
        summary="Flax's `nnx.dot_product_attention(is_causal=True)` is top-left aligned when "
        "Tq != Tk (its documentation does not say which)",
        kind=CONVENTION,
        library="flax",
        adapters=("flax_nnx_naive",),
        tests=TOP_LEFT_TESTS,
        reproducer=top_left_reproducer(
            """
import jax

jax.config.update("jax_enable_x64", True)
from flax import nnx


def attend(q, k, v):
    t = lambda x: np.swapaxes(x, 1, 2)  # (B, T, H, D)
    return t(np.asarray(nnx.dot_product_attention(t(q), t(k), t(v), is_causal=True)))


def attend_all(q, k, v):
    t = lambda x: np.swapaxes(x, 1, 2)
    return t(np.asarray(nnx.dot_product_attention(t(q), t(k), t(v))))
""",
            "nnx.dot_product_attention(is_causal=True)",
        ),
    ),
    Finding(
        summary="tinygrad's `scaled_dot_product_attention(is_causal=True)` is top-left aligned "
        "when Tq != Tk (its documentation does not say which)",
        kind=CONVENTION,
        library="tinygrad",
        adapters=("tinygrad_naive",),
        tests=TOP_LEFT_TESTS,
        reproducer=top_left_reproducer(
            """
from tinygrad import Tensor


def attend(q, k, v):
    q, k, v = (Tensor(x) for x in (q, k, v))
    return q.scaled_dot_product_attention(k, v, is_causal=True).numpy()


def attend_all(q, k, v):
    q, k, v = (Tensor(x) for x in (q, k, v))
    return q.scaled_dot_product_attention(k, v).numpy()
""",
            "q.scaled_dot_product_attention(k, v, is_causal=True)",
        ),
    ),
    Finding(
        summary="tinygrad's `scaled_dot_product_attention` accepts queries and keys of head dim "
        "0 and returns an answer instead of raising",
        kind=DEVIATION,
        library="tinygrad",
        adapters=("tinygrad_naive", "tinygrad_bridged"),
        tests=("test_unattendable_inputs_raise[*-head-dim-0]",),
        reproducer="""
import numpy as np
from tinygrad import Tensor

q, k = Tensor(np.zeros((1, 2, 8, 0), "float32")), Tensor(np.zeros((1, 2, 8, 0), "float32"))
v = Tensor(np.ones((1, 2, 8, 4), "float32"))
assert q.scaled_dot_product_attention(k, v, is_causal=True).numpy().shape == (1, 2, 8, 4)
""",
    ),
    Finding(
        summary="torch SDPA with a boolean `attn_mask`, bfloat16 and an infinite scale returns a "
        "finite row now and then (17 of 200 random cases) instead of NaN everywhere or an error",
        kind=DEVIATION,
        library="torch",
        adapters=("torch_sdpa_bridged", "transformers_sdpa_bridged"),
        tests=("test_convention_inputs_raise_or_follow_the_convention[bfloat16-scale-inf]",),
        reproducer="""
import torch
import torch.nn.functional as F

causal = torch.ones(8, 8, dtype=torch.bool).tril()
finite_rows = 0
for seed in range(200):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=generator).bfloat16() for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=float("inf"))
    finite_rows += int((~out.isnan()).all(dim=-1).sum())
assert finite_rows > 0
""",
    ),
    Finding(
        summary="Flax's mask gives a query row that sees no key the mean of all values: neither "
        "zeros, NaN nor an error",
        kind=DEVIATION,
        library="flax",
        adapters=("flax_nnx_bridged",),
        tests=("test_convention_inputs_raise_or_follow_the_convention[*-causal-Tq>Tk]",),
        reproducer="""
import numpy as np
from flax import nnx

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, t, 1, 4)).astype("float32") for t in (3, 2, 2))
mask = np.tril(np.ones((1, 1, 3, 2), bool), -1)  # bottom-right: query 0 sees neither key
out = np.asarray(nnx.dot_product_attention(q, k, v, mask=mask))
assert np.allclose(out[0, 0, 0], v[0, :, 0].mean(axis=0), atol=1e-6)
""",
    ),
    Finding(
        summary="tinygrad masks by adding -inf to the scores, for `is_causal` and a boolean "
        "`attn_mask` alike: a NaN in a future key reaches past rows (NaN + -inf is NaN)",
        kind=DEVIATION,
        library="tinygrad",
        adapters=("tinygrad_naive", "tinygrad_bridged"),
        tests=("test_nonfinite_future_keys_do_not_reach_past_rows*",),
        reproducer="""
import numpy as np
from tinygrad import Tensor

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, 4, 8)).astype("float32") for _ in range(3))
k[..., 3, :] = np.nan  # seen by row 3 only
out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True).numpy()
assert np.isnan(out[..., 0, :]).all()
""",
    ),
]
