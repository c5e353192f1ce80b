"""The mistakes of block-scaled kernels: the plumbing of the blocks, as public reports of Blackwell
kernels and of DeepSeek's latent caches found them. Each is the naive formula of the call
(spec.block_scaled.BlockCall.baseline) with one thing wrong: its bytes read with one field of
:class:`spec.block_scaled.Reading` changed, P rounded without its scale, or the row sum
mis-reduced, so that a failing output is named by the variant it matches within its budget
(``conformance/judge/block_scaled.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spec.block_scaled import BlockCall, Reading
from spec.mistakes.registry import Family, mistake


def block_mistake(name: str, text: str, hint: str, shows: Callable[[BlockCall], bool]):
    """Register the decorated variant (BlockCall -> output) as block-scaled mistake ``name``."""
    return mistake(Family.BLOCK, name, text, hint, shows)


def misreading(name: str, text: str, hint: str, shows: Callable[[BlockCall], bool], reading):
    """Register mistake ``name``: the call's bytes read with the fields ``reading(call)`` gives
    of :class:`spec.block_scaled.Reading` changed."""
    block_mistake(name, text, hint, shows)(lambda call: call.baseline(Reading(**reading(call))))


misreading(
    "block-v-scaled-along-d",
    "v's MX scales applied along the head dimension, where mx_attention lays them along the keys "
    "(one per 32 keys, for the P v product)",
    "a kernel that scales v as it scales q and k (TransformerEngine PR #3379)",
    lambda call: call.convention == "mx_attention",
    lambda call: dict(v_axis=3),
)


misreading(
    "block-scale-from-neighbour",
    "each element takes the scale of the block after its own",
    "an off-by-one in the scale tensor's index (a row's last block reads the next row's first)",
    lambda call: True,
    lambda call: dict(scale_block_shift=1),
)


# the block a kernel takes for the format's: NVFP4's 16 and MX's 32 for each other, DeepSeek
# V4's 64 for V3.2's 128
MISREAD_BLOCK = {16: 32, 32: 16, 128: 64}

misreading(
    "block-size-misread",
    "one scale applied to 16 elements where the format's block is 32, to 32 where it is 16, or "
    "to 64 where it is 128",
    "NVFP4's block of 16 and MX's of 32 mixed up in a kernel that takes both; DeepSeek V4's "
    "cache's block of 64 read in V3.2's of 128",
    lambda call: True,
    lambda call: dict(block=MISREAD_BLOCK[call.format.block]),
)


misreading(
    "block-e8m0-bias-128",
    "e8m0 scales decoded with a bias of 128, not 127: every scale halved",
    "a decoder that takes e8m0 for an IEEE exponent field with its bias off by one",
    lambda call: call.format.scale == "e8m0",
    lambda call: dict(e8m0_bias=128),
)


misreading(
    "block-rope-read-as-e4m3",
    "a latent cache's rotary part read as e4m3fn bytes, unscaled, where it is 64 bfloat16 values",
    "a kernel that takes the whole key of 576 for FP8, as if the cache quantized its rotary part "
    "too (DeepSeek's layouts leave it in bfloat16)",
    lambda call: call.convention == "mla_fp8_cache",
    lambda call: dict(rope_as_e4m3=True),
)


misreading(
    "block-nibbles-swapped",
    "packed e2m1 read with the first element in the high nibble",
    "an unpacking written for the other nibble order (torch's float4_e2m1fn_x2 keeps the first "
    "in the low bits)",
    lambda call: call.format.packed,
    lambda call: dict(low_first=False),
)


misreading(
    "block-global-scale-dropped",
    "NVFP4's float32 global scales never applied: each block's e4m3 scale taken as the whole",
    "a wrapper that does not pass the global scale on (or folds it into the softmax scale and "
    "forgets v's)",
    lambda call: call.format.global_scale,
    lambda call: dict(global_scales=False),
)


@block_mistake(
    "block-p-at-scale-1",
    "P rounded to e4m3 as it is, where the kernel declares it scaled by 2^8 first: a long row's "
    "small weights fall to subnormals or 0",
    "an upstream P scale of 1 where cuDNN fixes 256 (cudnn-frontend PR #904)",
    lambda call: call.p_rounding in ("e4m3_offset8", "float32", "bfloat16"),
)
def _p_scale_1(call: BlockCall):
    return call.baseline(p_rounding="e4m3")


@block_mistake(
    "block-output-halved",
    "every output halved: the row sum reduced twice over the threads that share a row",
    "a mis-reduced row sum (FlashInfer PR #3838's NVFP4 kernel; its LSE off by ln 2 too)",
    lambda call: True,
)
def _halved(call: BlockCall):
    return call.baseline() / 2


def _partial_last_page(call: BlockCall) -> bool:
    lengths = call.options.get("key_lengths") or ()
    return call.page_size is not None and any(n % call.page_size for n in lengths)


@block_mistake(
    "block-last-page-read-whole",
    "each item's last page read whole: the slots past its length (NaN in the pool) taken as keys, "
    "the rows that reach them NaN",
    "an item's key count rounded up to whole pages where the pages are split among blocks "
    "(FlashInfer's split-KV read FP4 pages wrongly for short queries over long caches)",
    _partial_last_page,
)
def _last_page_whole(call: BlockCall):
    size = call.page_size
    lengths = [int(n) for n in call.options["key_lengths"]]
    whole = tuple(-(-n // size) * size for n in lengths)
    q, k, v = call.dequantized()
    # zeros past each item's whole pages: never read, and no NaN for a masked weight of 0 to meet
    read = [np.zeros((*x.shape[:2], max(whole), x.shape[-1])) for x in (k, v)]
    for b, (length, end) in enumerate(zip(lengths, whole, strict=True)):
        for dense, x in zip(read, (k, v), strict=True):
            dense[b, :, :length] = x[b, :, :length]
            dense[b, :, length:end] = np.nan
    return call.baseline(operands=(q, *read), key_lengths=whole)
