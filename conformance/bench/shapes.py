"""The shapes a bench times: named ones from real models, with their source, or B,H,Hkv,Tq,Tk,D."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class BenchShape:
    name: str
    batch: int
    heads: int
    kv_heads: int
    tq: int
    tk: int
    head_dim: int
    source: str = ""
    # the features' keywords the call carries (window, page_size, kv_indices, an explicit
    # scale): timed where both sides declare them
    keywords: dict = field(default_factory=dict, hash=False)
    # v as the first value_dim columns of k, MLA's absorbed form (None: v of its own, Dv = D)
    value_dim: int | None = None

    @property
    def dims(self) -> tuple[int, int, int, int, int, int]:
        return (self.batch, self.heads, self.kv_heads, self.tq, self.tk, self.head_dim)

    @property
    def out_dim(self) -> int:
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def keys_read(self) -> int:
        """The keys each query row reads: Tk, or the K a row lists under kv_indices."""
        indices = self.keywords.get("kv_indices")
        return self.tk if indices is None else min(self.tk, indices.shape[-1])

    def describe(self) -> str:
        kv = f" Hkv={self.kv_heads}" if self.kv_heads != self.heads else ""
        lengths = f"T={self.tq}" if self.tq == self.tk else f"Tq={self.tq} Tk={self.tk}"
        dv = "" if self.value_dim is None else f" Dv={self.value_dim} (k's first columns)"
        extras = "".join(
            f" {name}=({'x'.join(map(str, value.shape))})" if hasattr(value, "shape")
            else f" {name}={value:.4g}" if isinstance(value, float) else f" {name}={value}"
            for name, value in self.keywords.items()
        )  # fmt: skip
        return f"B={self.batch} H={self.heads}{kv} {lengths} D={self.head_dim}{dv}{extras}"

    def at_length(self, t: int) -> BenchShape:
        """The same shape with Tq = Tk = t (a sweep's point)."""
        return replace(self, name=f"{self.name}@T={t}", tq=t, tk=t)


LLAMA3_8B = "Llama 3 8B's attention: 32 query heads over 8 key/value heads of 128 (its config.json)"
DEEPSEEK_MLA = (
    "DeepSeek V3's MLA in its absorbed form, as FlashMLA decodes it: one latent key/value head "
    "of 576 (512 latent + 64 rotary), v its first 512 columns, 16 query heads (128 over 8 GPUs)"
)
# DeepSeek V3's softmax scale: 1 / sqrt(128 + 64) times mscale^2, mscale = 0.1 ln(40) + 1
# (YaRN); FlashMLA's default, 1 / sqrt(576), is another number
MLA_SCALE = (0.1 * math.log(40) + 1) ** 2 / math.sqrt(192)
DSA_TOPK = 2048  # DeepSeek V3.2's indexer: the top 2048 keys of each query


def indexer_choice(batch: int, tq: int, tk: int, topk: int, seed: int = 0) -> np.ndarray:
    """kv_indices (B, 1, Tq, topk): each query row's ``topk`` keys of ``tk``, as an indexer
    picks them (here at random, distinct, from a fixed seed), int32."""
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((batch, 1, tq, tk)), axis=-1)
    return np.sort(order[..., :topk], axis=-1).astype(np.int32)


NAMED_SHAPES = {
    shape.name: shape
    for shape in (
        BenchShape(
            "andrea", 1, 12, 12, 1024, 1024, 64,
            "one attention layer of the document's ANDREA-120M (d_model 768, 12 heads, T 1024)",
        ),
        BenchShape(
            "andrea-batch8", 8, 12, 12, 1024, 1024, 64,
            "the GPU gate's shape (perf/gates.toml): ANDREA-120M's layer, a batch of 8",
        ),
        BenchShape(
            "llama3-8b-prefill", 1, 32, 8, 4096, 4096, 128, f"{LLAMA3_8B}, a 4096-token prefill"
        ),
        BenchShape(
            "llama3-8b-decode", 16, 32, 8, 1, 4096, 128,
            f"{LLAMA3_8B}, one decoding step of a batch of 16 against 4096 cached keys",
        ),
        BenchShape(
            "long-prefill", 1, 12, 12, 16384, 16384, 64,
            "ANDREA-120M's heads over a 16384-token prefill, where the (T, T) scores no longer fit",
        ),
        BenchShape(
            "llama3-8b-window", 1, 32, 8, 8192, 8192, 128,
            f"{LLAMA3_8B}, an 8192-token prefill under Mistral 7B's sliding window of 4096",
            keywords={"window": 4096},
        ),
        BenchShape(
            "llama3-8b-paged-decode", 16, 32, 8, 1, 4096, 128,
            f"{LLAMA3_8B}, the decoding step read from a page pool of 16-key pages (vLLM's "
            "default block size)",
            keywords={"page_size": 16},
        ),
        BenchShape(
            "mla-decode", 16, 16, 1, 1, 4096, 576,
            f"{DEEPSEEK_MLA}; a decoding step of a batch of 16 against 4096 cached tokens",
            keywords={"scale": MLA_SCALE}, value_dim=512,
        ),
        BenchShape(
            "dsa-decode", 4, 16, 1, 1, 8192, 576,
            f"{DEEPSEEK_MLA}, under DeepSeek V3.2's sparse attention: a decoding step of a batch "
            f"of 4, each query reading the {DSA_TOPK} keys its indexer lists of 8192 cached",
            keywords={"scale": MLA_SCALE, "kv_indices": indexer_choice(4, 1, 8192, DSA_TOPK)},
            value_dim=512,
        ),
    )
}  # fmt: skip


def parse_shape(text: str) -> BenchShape:
    """A named shape, or B,H,Hkv,Tq,Tk,D; an argparse error naming both forms otherwise."""
    if text in NAMED_SHAPES:
        return NAMED_SHAPES[text]
    parts = text.split(",")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) != 6 or min(numbers) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a named shape ({', '.join(NAMED_SHAPES)}) nor B,H,Hkv,Tq,Tk,D "
            "(six positive integers, such as 1,12,12,1024,1024,64)"
        )
    batch, heads, kv_heads, tq, tk, head_dim = numbers
    if heads % kv_heads:
        raise argparse.ArgumentTypeError(f"{text!r}: H={heads} is not a multiple of Hkv={kv_heads}")
    return BenchShape(text, batch, heads, kv_heads, tq, tk, head_dim, "given on the command line")


def parse_sweep(text: str) -> list[int]:
    """``T=256,512,1024``: the lengths a sweep times."""
    name, _, values = text.partition("=")
    try:
        lengths = [int(value) for value in values.split(",")]
    except ValueError:
        lengths = []
    if name != "T" or not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a sweep is T=L1,L2,... (positive lengths), such as T=256,512,1024"
        )
    return lengths
