"""``numpy_reference``: the float64 oracle, the document's formula as literally as NumPy allows.

    Attention(Q, K, V) = softmax(mask(Q K^T / sqrt(d_k))) V

Every other implementation is measured against this one. It favours being readable next to the
document over speed, and it also gives the attention weights and the analytic gradients that the
suite's probes and gradient checks need.
"""

from __future__ import annotations

import numpy as np

from impls.contract import (
    RAISES_ON_ALL,
    Capabilities,
    Implementation,
    NumpyArrays,
    causal_mask,
    resolve_scale,
    validate_inputs,
)


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


class NumpyReference(NumpyArrays, Implementation):
    name = "numpy_reference"
    capabilities = Capabilities(dtypes=("float64",), exposes_weights=True, conventions=RAISES_ON_ALL)

    def attention(self, q, k, v, *, causal=True, scale=None):
        validate_inputs(q, k, v, causal=causal, scale=scale)
        return reference_attention(q, k, v, causal=causal, scale=scale)

    def attention_weights(self, q, k, *, causal=True, scale=None):
        validate_inputs(q, k, k, causal=causal, scale=scale)
        return reference_weights(q, k, causal=causal, scale=scale)
