"""The shapes a bench times: named ones from real models, with their source, or B,H,Hkv,Tq,Tk,D."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace


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
    # the features' keywords the call carries (window, page_size): timed where both sides
    # declare them
    keywords: dict = field(default_factory=dict, hash=False)

    @property
    def dims(self) -> tuple[int, int, int, int, int, int]:
        return (self.batch, self.heads, self.kv_heads, self.tq, self.tk, self.head_dim)

    def describe(self) -> str:
        kv = f" Hkv={self.kv_heads}" if self.kv_heads != self.heads else ""
        lengths = f"T={self.tq}" if self.tq == self.tk else f"Tq={self.tq} Tk={self.tk}"
        extras = "".join(f" {name}={value}" for name, value in self.keywords.items())
        return f"B={self.batch} H={self.heads}{kv} {lengths} D={self.head_dim}{extras}"

    def at_length(self, t: int) -> BenchShape:
        """The same shape with Tq = Tk = t (a sweep's point)."""
        return replace(self, name=f"{self.name}@T={t}", tq=t, tk=t)


LLAMA3_8B = "Llama 3 8B's attention: 32 query heads over 8 key/value heads of 128 (its config.json)"

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
