"""``cupy_flash``: one fused CUDA kernel per (dtype, head dim) (``cupy_flash.cu``), tensor cores
for float16 and bfloat16; grouped-query heads and a left window in the kernel itself.

Index-sparse attention (``kv_indices``, with ``topk_length`` and ``kv_block_size``): a kernel of
its own in which each row walks its own list of keys, in float32 (16-bit inputs widened, the
output rounded back); blocks of keys are listed as their keys before the launch, and a key listed
twice weighs twice (cuDNN's reference). Its backward is the backward kernels with each row's
count of each key, from the same lists.

FP8 (spec.fp8): FlashAttention 3's convention on the FP8 kernels (e4m3 or e5m2 tensor cores, sm_89
and newer; P rounded to e4m3 with its 2^8 offset, the output in bfloat16); the key/value cache's
on the kernel of q's dtype, k and v widened to it (exact: every e4m3 and e5m2 value is a float16
and a bfloat16 value) and their scales applied per kv head by the kernel, k's to the scores, v's
to the output.

The FP4 caches (spec.block_scaled's fp4_cache), q in 16 bits: the tensor-core kernel of q's dtype
with each key and value tile decoded as it comes into shared memory (e2m1 pairs times their
block's scale, exact in q's dtype), NVFP4's global scales applied to the scores and the output as
an FP8 cache's are; q in float32, the cache decoded first for the float32 kernel.

MXFP8 (spec.block_scaled's mx_attention): the FP8 kernels' loop with an e8m0 scale per 32
elements, each 32-wide k-step of q k^T and of P v (one block of q's row and k's key, one block
of v's keys) summed by its own mma and times its blocks' scales in float32, as a block-scaled
MMA applies them; P rounded to e4m3 at 2^8, the output bfloat16, sm_89 and up.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np

from impls.block_scaled_calls import (
    CONVENTION_KEYWORDS,
    checked_block_call,
    is_block_scaled_call,
)
from impls.contract import RAISES_ON_ALL, Capabilities, Implementation, validate_inputs
from impls.cuda_kernels import (
    FLASH_HEAD_DIMS,
    FP4_KERNEL_FORMATS,
    FP8_KERNEL_FORMATS,
    backward_entry_points,
    flash_entry_point,
    fp4_entry_point,
    fp8_entry_point,
    mx_entry_point,
    sparse_entry_point,
)
from impls.cupy_arrays import (
    FLASH_THREADS,
    CupyArrays,
    cupy,
    kernel_module,
    scalar_scale,
)
from impls.fp8_calls import checked_scales, is_fp8_call
from impls.numpy_flash import BLOCK_M
from spec.block_scaled import GLOBAL_SCALE_KEYWORDS, block_format, e2m1_values, scale_byte_values
from spec.fp8 import Fp8Scales, values_of_bytes
from spec.masks import host_values

FLASH_CAPABILITIES = Capabilities(
    dtypes=("float32", "float16", "bfloat16"),
    head_dims=FLASH_HEAD_DIMS,
    distinct_value_dim=False,
    conventions=RAISES_ON_ALL,
    autograd=True,  # the backward kernels of cupy_flash.cu (vjp)
    gqa=True,
    window=True,
    lse=True,
    softcap=True,
    sinks=True,
    fp8=True,
    fp8_formats=tuple(FP8_KERNEL_FORMATS),
    fp8_p="e4m3_offset8",  # FlashAttention 3's; under kv_scale P is in q's dtype, finer
    fp8_output="bfloat16",
    sparse=True,
    topk_length=True,
    sparse_blocks=True,
    sparse_duplicates="count",  # each slot read: a key listed twice weighs twice
    block_scaled=True,
    block_conventions=("mx_attention", "fp4_cache"),
    block_formats=("mxfp8_e4m3", "mxfp8_e5m2", *FP4_KERNEL_FORMATS),
    block_p="e4m3_offset8",
    block_cache_p="bfloat16",  # the FP4 caches on the 16-bit kernels: P in q's 16 bits
    block_output="bfloat16",
)
# The keywords of index-sparse calls (spec.masks' kv_indices kind), which the sparse kernel takes
SPARSE_KEYWORDS = ("kv_indices", "topk_length", "kv_block_size")
FP8_TENSOR_CORES = 89  # the first compute capability with FP8 mma.sync (sm_89)


class CupyFlash(CupyArrays, Implementation):
    """One fused kernel per (dtype, head dim): tensor cores for float16 and bfloat16, CUDA cores
    for float32; the tiling of :mod:`impls.numpy_flash`."""

    name = "cupy_flash"

    @functools.cached_property
    def capabilities(self) -> Capabilities:
        """FLASH_CAPABILITIES; before sm_89, which has no FP8 tensor cores, FP8 under the
        key/value cache's convention only, and of the block-scaled calls the FP4 caches (once
        per instance: every call reads it)."""
        if self.unavailable_reason() is None and self.compute_capability() < FP8_TENSOR_CORES:
            return replace(
                FLASH_CAPABILITIES,
                fp8_conventions=("kv_scale",),
                block_conventions=("fp4_cache",),
                block_formats=FP4_KERNEL_FORMATS,
            )
        return FLASH_CAPABILITIES

    def compute_capability(self) -> int:
        return int(cupy.cuda.Device().compute_capability)  # 90 for sm_90

    def vjp(
        self, q, k, v, grad_out, *, causal=True, scale=None, window=None, softcap=None,
        sinks=None, grad_lse=None, **sparse,
    ):  # fmt: skip
        """The backward kernels on the forward's output and lse, in float32: the 16-bit inputs
        widened, the gradients rounded back to the inputs' dtype; dsinks (float32) from the lse
        and delta, -sum over each head's rows of p_sink * delta. ``sparse``: SPARSE_KEYWORDS,
        each key weighed by how often a row lists it."""
        options = dict(causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)
        if sparse.get("kv_indices") is not None:
            out, lse = self.sparse_attention_and_lse(q, k, v, **options, **sparse)
            blocks, lengths = sparse.get("kv_block_size"), sparse.get("topk_length")
            keys = listed_keys(k, kv_indices=sparse["kv_indices"], kv_block_size=blocks)
            counts = listed_counts(keys, k.shape[-2], lengths, blocks)
        else:
            unread_keywords_refused(q, k, v, options, sparse)
            out, lse = self.attention_and_lse(q, k, v, **options)
            counts = None
        dtype = self.dtype_name(q)
        q, k, v, grad_out, out = (widened(x, dtype) for x in (q, k, v, grad_out, out))
        xp = namespace(q)
        delta = (grad_out * out).sum(axis=-1)  # rowsum(dO * O), (B, H, Tq), float32
        if grad_lse is not None:
            grad_lse = xp.ascontiguousarray(widened(grad_lse, dtype))
        sink_logits = None if sinks is None else xp.asarray(sinks, dtype=xp.float32)  # (H,)
        grads = self.backward_kernels(
            q, k, v, grad_out, lse, xp.ascontiguousarray(delta), grad_lse,
            causal=causal, scale=scalar_scale(scale, q.shape[-1]), window=window,
            softcap=softcap, sinks=sink_logits, counts=counts,
        )  # fmt: skip
        grads = tuple(narrowed(grad, dtype) for grad in grads)
        if sinks is None:
            return grads
        with_sink = xp.logaddexp(lse, sink_logits[:, None])  # (B, H, Tq)
        seen = with_sink > -xp.inf
        sink_share = xp.where(seen, xp.exp(sink_logits[:, None] - xp.where(seen, with_sink, 0)), 0)
        return (*grads, -(sink_share * delta).sum(axis=(0, 2)))

    def backward_kernels(self, q, k, v, grad_out, lse, delta, grad_lse, *, causal, scale, window,
                         softcap, sinks, counts=None):  # fmt: skip
        """(dq, dk, dv) in float32 from the two backward kernels, on contiguous float32 arrays;
        ``counts``: listed_counts' (B, Hkv, Tq, Tk) of an index-sparse call, or None."""
        batch, heads, tq, d = q.shape
        kv_heads, tk = k.shape[1], k.shape[-2]
        dk_dv, dq = (
            kernel_module("cupy_flash").get_function(name)
            for name in backward_entry_points(d, softcap=softcap is not None)
        )
        grads = [cupy.empty_like(x) for x in (q, k, v)]
        arguments = (
            q, k, v, grad_out, lse, delta, grad_lse, np.int32(tq), np.int32(tk), scale,
            np.int32(causal), np.int32(heads // kv_heads),
            np.int32(-1 if window is None else window), kernel_softcap(softcap), sinks,
            np.int32(heads), counts,
        )  # fmt: skip
        dk_dv((math.ceil(tk / BLOCK_M), batch * kv_heads), (BACKWARD_THREADS,),
              (*arguments, grads[1], grads[2]))  # fmt: skip
        dq((math.ceil(tq / BLOCK_M), batch * heads), (BACKWARD_THREADS,), (*arguments, grads[0]))
        return tuple(grads)

    def attention(
        self, q, k, v, *, causal=True, scale=None, window=None, softcap=None, sinks=None,
        return_lse=False, **keywords,
    ):  # fmt: skip
        given = dict(window=window, softcap=softcap, sinks=sinks, return_lse=return_lse or None)
        extras = {name: value for name, value in given.items() if value is not None}
        if is_block_scaled_call(keywords):  # the entry point's checks refuse what it cannot take
            return self.block_scaled_attention(q, k, v, causal=causal, scale=scale, **extras,
                                               **keywords)  # fmt: skip
        if is_fp8_call(q, k, v, keywords, dtype_name=self.dtype_name):
            return self.fp8_attention(q, k, v, causal=causal, scale=scale, **extras, **keywords)
        sparse = {name: keywords.pop(name) for name in SPARSE_KEYWORDS if name in keywords}
        if keywords:
            raise TypeError(f"unexpected keyword arguments {sorted(keywords)} [{self.name}]")
        options = dict(causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)
        if sparse.get("kv_indices") is not None:
            out, lse = self.sparse_attention_and_lse(q, k, v, **options, **sparse)
        else:
            unread_keywords_refused(q, k, v, options, sparse)
            out, lse = self.attention_and_lse(q, k, v, **options)
        return (out, lse) if return_lse else out

    def sparse_attention_and_lse(
        self, q, k, v, *, causal, scale, window, softcap, sinks, kv_indices, topk_length=None,
        kv_block_size=None,
    ):  # fmt: skip
        """(out, lse) of an index-sparse call: its checks, q, k and v widened to float32 for the
        sparse kernel, the output rounded back to q's dtype; lse as attention_and_lse's."""
        validate_inputs(
            q, k, v, causal=causal, scale=scale, gqa=True, window=window, softcap=softcap,
            sinks=sinks, kv_indices=kv_indices, topk_length=topk_length,
            kv_block_size=kv_block_size,
        )  # fmt: skip
        dtype = self.dtype_name(q)
        if dtype not in self.capabilities.dtypes:
            raise TypeError(f"q is {dtype}, but should be one of {self.capabilities.dtypes}")
        d, dv = q.shape[-1], v.shape[-1]
        if d not in FLASH_HEAD_DIMS or dv != d:
            raise ValueError(
                f"head dims D={d}, Dv={dv}, but {self.name} is compiled for D = Dv in "
                f"{', '.join(map(str, FLASH_HEAD_DIMS))}"
            )
        xp = namespace(q)
        keys = listed_keys(k, kv_indices=kv_indices, kv_block_size=kv_block_size)
        counted = None if topk_length is None else xp.asarray(topk_length, dtype=xp.int32)
        if counted is not None and kv_block_size is not None:
            counted = counted * kv_block_size  # a block's slots follow one another
        sink_logits = None if sinks is None else xp.asarray(sinks, dtype=xp.float32)  # (H,)
        out, lse = self.sparse_kernel(
            *(widened(x, dtype) for x in (q, k, v)), keys, counted, causal=causal,
            scale=scalar_scale(scale, d), window=window, softcap=softcap, sinks=sink_logits,
        )  # fmt: skip
        return narrowed(out, dtype), lse

    def sparse_kernel(self, q, k, v, keys, counted, *, causal, scale, window, softcap, sinks):
        """The sparse kernel on contiguous float32 q, k, v and int32 ``keys`` (B, Hkv, Tq, K):
        (out, lse), float32."""
        batch, heads, tq, d = q.shape
        self.check_grid(batch * heads, tq)
        kernel = kernel_module("cupy_flash").get_function(
            sparse_entry_point(d, softcap=softcap is not None)
        )
        out = cupy.empty_like(q)  # (B, H, Tq, D)
        lse = cupy.empty((batch, heads, tq), dtype=cupy.float32)  # (B, H, Tq)
        kernel(
            (math.ceil(tq / BLOCK_M), batch * heads),
            (BACKWARD_THREADS,),
            (q, k, v, out, lse, np.int32(tq), np.int32(k.shape[-2]), scale, np.int32(causal),
             np.int32(heads // k.shape[1]), np.int32(-1 if window is None else window),
             kernel_softcap(softcap), sinks, np.int32(heads), keys, np.int32(keys.shape[-1]),
             counted),
        )  # fmt: skip
        return out, lse

    def fp8_attention(self, q, k, v, *, causal, scale, **keywords):
        """An FP8 call (the module's docstring): its checks, then its kernel."""
        capabilities = self.capabilities
        scales = checked_scales(
            capabilities, q, k, v, causal, scale, keywords, dtype_name=self.dtype_name
        )
        fmt = self.dtype_name(k)
        batch, kv_heads, d = q.shape[0], k.shape[1], q.shape[-1]
        if d not in FLASH_HEAD_DIMS or v.shape[-1] != d:
            raise ValueError(
                f"head dims D={d}, Dv={v.shape[-1]}, but {self.name} is compiled for D = Dv in "
                f"{', '.join(map(str, FLASH_HEAD_DIMS))}"
            )
        k_bits, v_bits = self.fp8_bits(k, "k"), self.fp8_bits(v, "v")
        xp = namespace(k_bits)

        def multipliers(*operands):  # per (b, h_kv), float32 (B * Hkv,) each
            return tuple(xp.asarray(per_kv_head(scales, x, batch, kv_heads)) for x in operands)

        if scales.convention == "kv_scale":
            query_dtype = self.dtype_name(q)
            k_wide, v_wide = (widened_fp8(x, fmt, query_dtype) for x in (k_bits, v_bits))
            out, _ = self.attention_and_lse(
                q, k_wide, v_wide, causal=causal, scale=scale, kv_scales=multipliers("k", "v")
            )
            return out
        return self.fp8_kernel(
            q, k, v, causal=causal, scale=scalar_scale(scale, d), descales=multipliers(*"qkv")
        )

    def block_scaled_attention(self, q, k, v, *, causal, scale, **keywords):
        """A block-scaled call (the module's docstring): its entry point's checks, then the MXFP8
        kernel of its format, or the kernel of q's dtype over an FP4 cache; (out, lse) with
        return_lse."""
        convention, fmt = checked_block_call(self.capabilities, q, k, v, causal, scale, keywords,
                                             dtype_name=self.dtype_name)  # fmt: skip
        packed = convention == "fp4_cache"
        d, dv = q.shape[-1], v.shape[-1] * (2 if packed else 1)
        if d not in FLASH_HEAD_DIMS or dv != d:
            raise ValueError(
                f"head dims D={d}, Dv={dv}, but {self.name} is compiled for D = Dv in "
                f"{', '.join(map(str, FLASH_HEAD_DIMS))}"
            )
        if packed:
            operands = [q, k, v]
        else:
            operands = [self.fp8_bits(x, name) for name, x in zip("qkv", (q, k, v), strict=True)]
        xp = namespace(operands[1])
        scales = [xp.ascontiguousarray(xp.asarray(keywords[name], dtype=xp.uint8))
                  for name in CONVENTION_KEYWORDS[convention]]  # fmt: skip
        options = dict(causal=causal, scale=scalar_scale(scale, d))
        if packed:
            out, lse = self.fp4_cache_attention(q, k, v, *scales, fmt=fmt, keywords=keywords,
                                                **options)  # fmt: skip
        else:
            out, lse = self.mx_kernel(*operands, *scales, fmt=self.dtype_name(q), **options)
        return (out, lse) if keywords.get("return_lse") else out

    def fp4_cache_attention(self, q, k, v, k_scales, v_scales, *, fmt, keywords, causal, scale):
        """(out, lse) over an FP4 cache: q in 16 bits, the tensor-core kernel that decodes each
        tile as it comes in; q in float32, or a cache some of whose values q's 16 bits do not
        hold exactly (decodes_exactly), the cache decoded first (exact in float32) for the
        float32 kernel, q widened and the output in its dtype. NVFP4's global scales multiply
        the scores and the output, as an FP8 cache's scales per kv head do."""
        batch, kv_heads = k.shape[:2]
        xp = namespace(k)
        global_scales = None
        if fmt == "nvfp4":
            global_scales = tuple(
                xp.full(batch * kv_heads, float(host_values(keywords[name])), dtype=xp.float32)
                for name in GLOBAL_SCALE_KEYWORDS
            )
        dtype = self.dtype_name(q)
        if dtype == "float32" or not decodes_exactly(fmt, dtype, k, k_scales, v, v_scales):
            k_values, v_values = (
                decoded_fp4(x, scales, fmt) for x, scales in ((k, k_scales), (v, v_scales))
            )
            out, lse = self.attention_and_lse(widened(q, dtype), k_values, v_values,
                                              causal=causal, scale=scale,
                                              kv_scales=global_scales)  # fmt: skip
            return narrowed(out, dtype), lse
        return self.fp4_kernel(q, k, v, k_scales, v_scales, global_scales, fmt=fmt,
                               causal=causal, scale=scale)  # fmt: skip

    def fp4_kernel(self, q, k, v, k_scales, v_scales, global_scales, *, fmt, causal, scale):
        """The tensor-core kernel of q's dtype over an FP4 cache of ``fmt``: (out, lse), q's
        dtype (B, H, Tq, D) and float32 (B, H, Tq)."""
        self.check_arrays(q=q)
        self.check_arrays(supported=("uint8",), k=k, v=v)
        batch, heads, tq, d = q.shape
        self.check_grid(batch * heads, tq)
        kernel = kernel_module("cupy_flash").get_function(
            fp4_entry_point(self.dtype_name(q), fmt, d)
        )
        out = cupy.empty(q.shape, dtype=q.dtype)  # (B, H, Tq, D)
        lse = cupy.empty((batch, heads, tq), dtype=cupy.float32)  # (B, H, Tq)
        kernel(
            (math.ceil(tq / BLOCK_M), batch * heads),
            (FLASH_THREADS,),
            (q, k, v, out, lse, np.int32(tq), np.int32(k.shape[-2]), scale, np.int32(causal),
             np.int32(heads // k.shape[1]), *(global_scales or (None, None)), k_scales, v_scales),
        )  # fmt: skip
        return out, lse

    def mx_kernel(self, q, k, v, q_scales, k_scales, v_scales, *, fmt, causal, scale):
        """The MXFP8 kernel of ``fmt`` on the bytes of q, k, v and their e8m0 scales, contiguous
        uint8 arrays: (out, lse), bfloat16 bits (B, H, Tq, D) and float32 (B, H, Tq)."""
        batch, heads, tq, d = q.shape
        self.check_grid(batch * heads, tq)
        kernel = kernel_module("cupy_flash").get_function(mx_entry_point(fmt, d))
        out = cupy.empty(q.shape, dtype=cupy.uint16)  # (B, H, Tq, D), bfloat16 bits
        lse = cupy.empty((batch, heads, tq), dtype=cupy.float32)  # (B, H, Tq)
        kernel(
            (math.ceil(tq / BLOCK_M), batch * heads),
            (FLASH_THREADS,),
            (q, k, v, out, lse, np.int32(tq), np.int32(k.shape[-2]), scale, np.int32(causal),
             np.int32(heads // k.shape[1]), q_scales, k_scales, v_scales),
        )  # fmt: skip
        return out, lse

    def fp8_kernel(self, q, k, v, *, causal, scale, descales):
        """The FP8 kernel of q's format on FP8 q, k, v of one format: the output, bfloat16 bits
        (B, H, Tq, D)."""
        # Before sm_89 the capabilities leave this convention out, and checked_scales refuses it.
        self.check_arrays(supported=tuple(FP8_KERNEL_FORMATS), q=q, k=k, v=v)
        batch, heads, tq, d = q.shape
        self.check_grid(batch * heads, tq)
        kernel = kernel_module("cupy_flash").get_function(fp8_entry_point(self.dtype_name(q), d))
        out = cupy.empty(q.shape, dtype=cupy.uint16)  # (B, H, Tq, D), bfloat16 bits
        kernel(
            (math.ceil(tq / BLOCK_M), batch * heads),
            (FLASH_THREADS,),
            (q.bits, k.bits, v.bits, out, None, np.int32(tq), np.int32(k.shape[-2]), scale,
             np.int32(causal), np.int32(heads // k.shape[1]), *descales),
        )  # fmt: skip
        return out

    def attention_and_lse(
        self, q, k, v, *, causal=True, scale=None, window=None, softcap=None, sinks=None,
        kv_scales=None,
    ):  # fmt: skip
        """(out, lse): the output and each row's float32 log-sum-exp (B, H, Tq), natural, of the
        scaled, capped, masked scores, the sink not included. ``kv_scales``: an FP8 cache's
        (k_scale, v_scale) per (b, h_kv), float32 (B * Hkv,) arrays on the device."""
        validate_inputs(
            q, k, v, causal=causal, scale=scale, gqa=True, window=window, softcap=softcap,
            sinks=sinks,
        )  # fmt: skip
        dtype = self.check_arrays(q=q, k=k, v=v)
        batch, heads, tq, d = q.shape
        tk, dv = k.shape[-2], v.shape[-1]
        if d not in FLASH_HEAD_DIMS or dv != d:
            raise ValueError(
                f"head dims D={d}, Dv={dv}, but {self.name} is compiled for D = Dv in "
                f"{', '.join(map(str, FLASH_HEAD_DIMS))}"
            )
        self.check_grid(batch * heads, tq)
        kernel = kernel_module("cupy_flash").get_function(
            flash_entry_point(dtype, d, softcap=softcap is not None)
        )
        out = cupy.empty(q.shape, dtype=q.dtype)  # (B, H, Tq, D)
        # Always written (B*H*Tq floats, next to nothing beside the output) so that the kernel is
        # launched the same way whether or not the caller asked for it.
        lse = cupy.empty((batch, heads, tq), dtype=cupy.float32)  # (B, H, Tq)
        sink_logits = None if sinks is None else cupy.asarray(sinks, dtype=cupy.float32)  # (H,)
        kernel(
            (math.ceil(tq / BLOCK_M), batch * heads),
            (FLASH_THREADS,),
            (q, k, v, out, lse, np.int32(tq), np.int32(tk),
             scalar_scale(scale, d), np.int32(causal),
             np.int32(heads // k.shape[1]), np.int32(-1 if window is None else window),
             kernel_softcap(softcap), sink_logits, np.int32(heads), *(kv_scales or (None, None))),
        )  # fmt: skip
        return out, lse


BACKWARD_THREADS = BLOCK_M * 4  # 4 threads per key or row (BACKWARD_THREADS in cupy_flash.cu)


def namespace(array):
    """NumPy for a host array (the emulation's), CuPy for a device one."""
    return np if isinstance(array, np.ndarray) else cupy


def widened(array, dtype: str):
    """A contiguous float32 copy of ``array`` of ``dtype`` (bfloat16 as uint16 bit patterns)."""
    xp = namespace(array)
    if dtype == "bfloat16":
        return xp.ascontiguousarray((array.astype(xp.uint32) << xp.uint32(16)).view(xp.float32))
    return xp.ascontiguousarray(array, dtype=xp.float32)


def narrowed(array, dtype: str):
    """float32 ``array`` rounded to ``dtype``, to nearest, ties to even (bfloat16's bits)."""
    xp = namespace(array)
    if dtype != "bfloat16":
        return array.astype(dtype)
    bits = array.view(xp.uint32)
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> xp.uint32(16)) & xp.uint32(1))) >> 16
    return xp.where(xp.isnan(array), xp.uint32(0x7FC0), rounded).astype(xp.uint16)


def per_kv_head(scales: Fp8Scales, operand: str, batch: int, kv_heads: int) -> np.ndarray:
    """``operand``'s multipliers in ``scales``, per (b, h_kv) as the kernels index them
    (b * Hkv + h_kv): float32 (B * Hkv,), contiguous."""
    table = scales.per_batch_kv_head(operand, batch, kv_heads)  # (B, Hkv) float64
    return np.ascontiguousarray(table, dtype=np.float32).reshape(-1)


def widened_fp8(bits, fmt: str, dtype: str):
    """FP8 bytes of ``fmt`` as ``dtype`` (bfloat16 as its bits): exact, since every e4m3 and e5m2
    value, NaN and e5m2's infinities included, is a float16 and a bfloat16 value."""
    xp = namespace(bits)
    values = xp.asarray(values_of_bytes(fmt).astype(np.float32))[bits]  # the bytes' values
    return xp.ascontiguousarray(narrowed(values, dtype))


def decoded_fp4(packed, scales, fmt: str):
    """An FP4 cache's values (spec.block_scaled), float32 (B, Hkv, Tk, D), contiguous, on the
    cache's device: each e2m1 code, the first of a byte in its low nibble, times its block's
    scale (exact in float32), the global scale not applied."""
    xp = namespace(packed)
    spec = block_format(fmt)
    codes = xp.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    elements = xp.asarray(e2m1_values(np.arange(16)).astype(np.float32))[codes]
    scale_values = xp.asarray(scale_byte_values(spec.scale).astype(np.float32))[scales]
    return xp.ascontiguousarray(elements * xp.repeat(scale_values, spec.block, axis=-1))


# The decoded values q's 16 bits hold exactly: an e2m1 element (at most 2 significant bits) times
# its block's scale (at most 4) keeps 6, which both formats' normal range holds; float16's is
# 2^-14 .. 65504, and bfloat16's 2^-126 .. 2^128 less a bit, past which a value rounds or turns to
# inf. (e2m1's smallest nonzero magnitude is 0.5, its largest 6.)
SIXTEEN_BIT_RANGES = {"float16": (2.0**-14, 65504.0), "bfloat16": (2.0**-126, 3.3895e38)}


def decodes_exactly(fmt: str, dtype: str, *packed_and_scales) -> bool:
    """Whether every nonzero element of an FP4 cache, given as (packed, block scales' bytes)
    pairs, times its scale, is a normal number of ``dtype`` (float16, bfloat16): its 16-bit tiles
    hold it exactly. Only blocks with a nonzero element count (a block of zeros has e8m0's code 0,
    2^-127, which no 16-bit value reaches, and decodes to zeros); a scale's sign does not matter;
    a NaN scale reads as NaN in any dtype."""
    spec = block_format(fmt)
    magnitudes = np.abs(scale_byte_values(spec.scale))  # by byte; NaN stays NaN
    smallest, largest = SIXTEEN_BIT_RANGES[dtype]
    for packed, scales in zip(packed_and_scales[::2], packed_and_scales[1::2], strict=True):
        xp = namespace(packed)
        nonzero = xp.stack([packed & 7, (packed >> 4) & 7], axis=-1) != 0  # each code's magnitude
        blocks = nonzero.reshape(*scales.shape, spec.block).any(axis=-1)  # as the scales lie
        counts = xp.bincount(scales[blocks].ravel(), minlength=256)
        used = magnitudes[(np.asarray(counts.tolist()) > 0) & (magnitudes > 0)]  # NaN > 0: False
        if used.size and (used.min() * 0.5 < smallest or used.max() * 6 > largest):
            return False
    return True


def unread_keywords_refused(q, k, v, options: dict, sparse: dict) -> None:
    """A clear error, naming it, for topk_length or kv_block_size given without kv_indices."""
    if any(value is not None for value in sparse.values()):
        validate_inputs(q, k, v, gqa=True, **options, **sparse)


def listed_keys(k, *, kv_indices, kv_block_size=None):
    """kv_indices as the sparse kernel reads them, on k's device: int32 (B, Hkv, Tq, K)
    contiguous, each block of ``kv_block_size`` listed as its keys (those past Tk as empty slots)
    in slots of its own."""
    xp = namespace(k)
    indices = xp.asarray(kv_indices).astype(xp.int32)  # from NumPy where the caller's are
    if kv_block_size is not None:
        keys = indices[..., None] * kv_block_size + xp.arange(kv_block_size, dtype=xp.int32)
        keys[(indices[..., None] < 0) | (keys >= k.shape[-2])] = -1
        indices = keys.reshape(*indices.shape[:-1], -1)
    return xp.ascontiguousarray(indices)


def listed_counts(keys, tk: int, topk_length=None, kv_block_size=None):
    """How often each row lists each key, int32 (B, Hkv, Tq, Tk): the backward's weights of an
    index-sparse call (empty slots and those past topk_length list nothing)."""
    xp = namespace(keys)
    if topk_length is not None:
        per_slot = 1 if kv_block_size is None else kv_block_size
        counted = xp.asarray(topk_length, dtype=xp.int32)[:, None, None, None] * per_slot
        keys = xp.where(xp.arange(keys.shape[-1]) < counted, keys, -1)
    rows = int(np.prod(keys.shape[:-1]))
    slots = xp.where(keys >= 0, keys, tk).reshape(rows, -1)  # an empty slot: column Tk
    flat = (xp.arange(rows)[:, None] * (tk + 1) + slots).ravel()
    counts = xp.bincount(flat, minlength=rows * (tk + 1)).reshape(rows, tk + 1)[:, :tk]
    return xp.ascontiguousarray(counts.astype(xp.int32).reshape(*keys.shape[:-1], tk))


def kernel_softcap(softcap: float | None) -> np.float32:
    """The kernel's softcap argument: the cap, or 0 where the kernel without one ignores it."""
    return np.float32(0.0 if softcap is None else softcap)
