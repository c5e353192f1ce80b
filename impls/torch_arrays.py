"""What the PyTorch built-ins share: torch tensors as native arrays, their conversions and
gradients. torch is optional: without it the implementations exist, declare what they would
support, and report "torch is not installed" as the reason they cannot run.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np

from impls.contract import (
    ContractViolation,
)
from spec.masks import LISTED_KEYWORDS, Grid, extent_of, mask_options, prepared, visible

try:
    import torch
except ImportError:  # optional dependency: reported through unavailable_reason()
    torch = None


class TorchArrays:
    """Conversions and gradients for implementations whose native arrays are torch tensors."""

    family = "torch"
    device = "cpu"

    def version(self) -> str:
        if torch is None:
            return "torch not installed"
        if self.device == "cuda" and torch.cuda.is_available():
            return f"torch {torch.__version__}, {torch.cuda.get_device_name()}"
        return f"torch {torch.__version__}"

    def unavailable_reason(self) -> str | None:
        if torch is None:
            return "torch is not installed (pip install torch==2.13.0, the version this suite pins)"
        if self.device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        return None

    def from_numpy(self, array: np.ndarray, dtype: str) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64)).to(
            device=self.device, dtype=getattr(torch, dtype)
        )

    def to_numpy(self, native: Any) -> np.ndarray:
        if not isinstance(native, torch.Tensor):
            raise ContractViolation(
                f"{self.name} returned {type(native).__qualname__}, but should return torch.Tensor"
            )
        native = native.detach().cpu()
        narrow_float = native.is_floating_point() and native.dtype.itemsize == 1  # FP8
        if native.dtype == torch.bfloat16 or narrow_float:
            native = native.float()  # NumPy has no bfloat16 or FP8; float32 holds them exactly
        return native.numpy()

    def dtype_name(self, native: Any) -> str:
        return torch_dtype_name(native)

    def device_of(self, native: Any) -> str:
        return native.device.type

    def permuted(self, native: Any, axes: tuple[int, ...]) -> Any:
        return native.permute(axes)

    def concatenate(self, parts: list[Any], axis: int) -> Any:
        return torch.cat(parts, dim=axis)

    def zeros(self, shape: tuple[int, ...], like: Any) -> Any:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)

    @contextlib.contextmanager
    def poisoned_allocations(self):
        """PyTorch's own mode: with deterministic algorithms on (warn_only, so no op refuses),
        torch.utils.deterministic.fill_uninitialized_memory fills torch.empty's memory with NaN."""
        enabled = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        filled = torch.utils.deterministic.fill_uninitialized_memory
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.utils.deterministic.fill_uninitialized_memory = filled
            torch.use_deterministic_algorithms(enabled, warn_only=warn_only)

    def broadcast(self, native: Any, shape: tuple[int, ...]) -> Any:
        return native.expand(shape)

    def vjp(self, q, k, v, grad_out, *, causal=True, scale=None, grad_lse=None, **variant):
        """By autograd through :meth:`attention`. Sinks come to attention as a tensor (H,) that
        requires grad, for torch.as_tensor(sinks) to keep in the graph."""
        inputs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        if variant.get("sinks") is not None:
            # float32, the sinks' dtype in kernels, unless the call is float64: a float64
            # gradient of float32 sinks would come back rounded to float32
            dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            sinks = torch.tensor(list(variant["sinks"]), dtype=dtype, device=q.device)
            variant["sinks"] = sinks.requires_grad_(True)
            inputs.append(variant["sinks"])
        with torch.enable_grad():
            if grad_lse is None:
                out = self.attention(*inputs[:3], causal=causal, scale=scale, **variant)
                return torch.autograd.grad(out, inputs, grad_out)
            outputs = self.attention(
                *inputs[:3], causal=causal, scale=scale, return_lse=True, **variant
            )
            return torch.autograd.grad(outputs, inputs, (grad_out, grad_lse))


def torch_dtype_name(native: Any) -> str:
    """A tensor's dtype by the suite's name: torch.float8_e4m3fn as float8_e4m3fn."""
    return str(native.dtype).removeprefix("torch.")


def repeated_heads(q, kv):
    """k or v (B, Hkv, T, D) as (B, Hq, T, D): query head h reads head h // (Hq / Hkv)."""
    return kv.repeat_interleave(q.shape[-3] // kv.shape[-3], dim=-3)


def query_positions(tq: int, tk: int, device, key_lengths=None) -> Any:
    """(B or 1, Tq, 1): query row i of item b at absolute position i + L_b - Tq."""
    lengths = torch.tensor([tk] if key_lengths is None else list(key_lengths), device=device)
    return torch.arange(tq, device=device)[:, None] + (lengths - tq)[:, None, None]


def visible_mask(tq: int, tk: int, device, *, causal=True, heads: int = 1, **mask) -> Any:
    """(B or 1, H or 1, Tq, Tk) boolean tensor, True where query row i of batch item b and head h
    sees key j: spec.masks' predicates, declared once, asked on torch tensors on ``device``;
    ``heads``: the call's query heads."""
    options = prepared({"causal": causal, **mask_options(mask)})
    for name in (*LISTED_KEYWORDS, "kv_members"):  # NumPy arrays by the contract, or tensors
        if options.get(name) is not None:
            given = options[name]
            given = given if isinstance(given, torch.Tensor) else torch.as_tensor(given)
            options[name] = given.to(device)
    batch, heads = extent_of(options, heads=heads)
    grid = Grid.over(
        batch, heads, tq, tk, key_lengths=options.get("key_lengths"),
        arange=functools.partial(torch.arange, device=device),
        asarray=functools.partial(torch.tensor, device=device),
    )  # fmt: skip
    return visible(grid, options)


def blind_rows_kept_finite(mask) -> tuple[Any, Any]:
    """``mask`` (B or 1, H or 1, Tq, Tk) with its rows that see no key opened to every key, and
    those rows, (B or 1, H or 1, Tq, 1): a softmax over nothing is 0 / 0, and its NaN reaches
    every gradient through autograd even where the output is then set."""
    blind = ~mask.any(dim=-1, keepdim=True)
    return mask | blind, blind


def alibi_bias(tq: int, tk: int, slopes, like, key_lengths=None) -> Any:
    """(B or 1, H, Tq, Tk) ALiBi's -m_h * |p - j| in ``like``'s dtype and device."""
    positions = query_positions(tq, tk, like.device, key_lengths)  # (B, Tq, 1)
    distance = (positions - torch.arange(tk, device=like.device)).abs()  # (B, Tq, Tk)
    slopes = torch.tensor(list(slopes), dtype=like.dtype, device=like.device)[:, None, None]
    return -slopes * distance[:, None].to(like.dtype)  # (B, H, Tq, Tk)


def padding_zeroed(kv, key_lengths) -> Any:
    """k or v with each item's rows past its key length set to 0: a value there gets a weight of
    0, and 0 x NaN would still be NaN."""
    if key_lengths is None:
        return kv
    lengths = torch.tensor(list(key_lengths), device=kv.device)
    padding = torch.arange(kv.shape[-2], device=kv.device) >= lengths[:, None]  # (B, Tk)
    return kv.masked_fill(padding[:, None, :, None], 0)


def bottom_right_mask(tq: int, tk: int, device) -> Any:
    """(Tq, Tk) boolean mask, True where query i may see key j <= i + Tk - Tq."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(diagonal=tk - tq)
