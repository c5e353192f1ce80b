"""The formula: the float64 oracle every implementation is judged against, owned by the spec.

    Attention(Q, K, V) = softmax(mask(Q K^T / sqrt(d_k))) V

Written to be read next to the document rather than to be fast. The judge (``conformance/``)
takes its truth from here, never from the package of things it judges; ``impls.numpy_reference``
wraps these functions as an implementation, so the oracle is itself judged by the suite.

Causal attention is bottom-right aligned: query row i sits at absolute position i + Tk - Tq and
sees keys j <= i + Tk - Tq. ``scale=None`` means 1/sqrt(D).
"""

from __future__ import annotations

import math

import numpy as np


def resolve_scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def causal_mask(tq: int, tk: int) -> np.ndarray:
    """Boolean (Tq, Tk) mask, True where query i may see key j: j <= i + Tk - Tq."""
    return np.tril(np.ones((tq, tk), dtype=bool), k=tk - tq)


def reference_scores(q: np.ndarray, k: np.ndarray, scale: float | None = None) -> np.ndarray:
    """Scaled scores Q K^T * scale, (B, H, Tq, Tk), in float64."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    return (q @ k.swapaxes(-1, -2)) * resolve_scale(scale, q.shape[-1])


def reference_masked_scores(q, k, *, causal: bool = True, scale: float | None = None):
    """Scaled scores with -inf where the causal mask hides a key, (B, H, Tq, Tk), in float64."""
    scores = reference_scores(q, k, scale)
    if causal:
        tq, tk = scores.shape[-2:]
        scores = np.where(causal_mask(tq, tk), scores, -np.inf)
    return scores


def reference_log_sum_exp(q, k, *, causal: bool = True, scale: float | None = None) -> np.ndarray:
    """log(sum_j exp(score[i, j])) over each row's visible keys, (B, H, Tq), in float64: what a
    flash kernel's optional second output should hold."""
    scores = reference_masked_scores(q, k, causal=causal, scale=scale)
    top = scores.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True)))[..., 0]


def reference_weights(q, k, *, causal: bool = True, scale: float | None = None) -> np.ndarray:
    """softmax(mask(scores)) row by row, (B, H, Tq, Tk), in float64."""
    scores = reference_masked_scores(q, k, causal=causal, scale=scale)
    # Subtracting the row maximum leaves the softmax unchanged and keeps exp() from overflowing.
    shifted = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def reference_attention(q, k, v, *, causal: bool = True, scale: float | None = None) -> np.ndarray:
    """output[i] = sum_j A[i, j] V[j], (B, H, Tq, Dv), in float64."""
    return reference_weights(q, k, causal=causal, scale=scale) @ np.asarray(v, np.float64)


def reference_vjp(q, k, v, grad_out, *, causal: bool = True, scale: float | None = None):
    """Gradients (dq, dk, dv) of sum(attention(q, k, v) * grad_out), in float64.

    With A = softmax(S), S = scale * Q K^T, O = A V:
      dV = A^T dO;  dA = dO V^T;  dS = A * (dA - rowsum(dA * A));
      dQ = scale dS K;  dK = scale dS^T Q.
    Masked entries have A = 0, so they contribute nothing to any gradient.
    """
    q, k, v, grad_out = (np.asarray(x, np.float64) for x in (q, k, v, grad_out))
    weights = reference_weights(q, k, causal=causal, scale=scale)
    scale = resolve_scale(scale, q.shape[-1])
    grad_v = weights.swapaxes(-1, -2) @ grad_out
    grad_weights = grad_out @ v.swapaxes(-1, -2)
    grad_scores = weights * (grad_weights - (grad_weights * weights).sum(axis=-1, keepdims=True))
    grad_q = scale * grad_scores @ k
    grad_k = scale * grad_scores.swapaxes(-1, -2) @ q
    return grad_q, grad_k, grad_v
