"""The document's numbers, measured: dot-product growth, softmax saturation, a masked softmax,
ANDREA-120M's shapes. Shared by the mathematics tests, ``attnspec demo`` and the HTML report."""

from __future__ import annotations

import math

import numpy as np

from spec.formula import causal_mask, softmax

MATH_SEED = 20170612
SATURATION_KEYS = 128
ANDREA = dict(d_model=768, heads=12, d_k=64, t=1024)


def sample_dot_products(rng, d: int, samples: int, unit_norm: bool = False) -> np.ndarray:
    """``samples`` dot products of independent standard-normal d-vectors (or unit vectors)."""
    dots = np.empty(samples)
    # A few pairs at a time, drawn into the same two buffers: fresh memory for all of them
    # (256 MB at d = 4096) cost several times the drawing itself, in page faults.
    chunk = max(1, min(samples, 256))  # and no pieces at all for no samples
    a, b = np.empty((2, chunk, d), dtype=np.float32)
    for start in range(0, samples, chunk):
        rows = min(chunk, samples - start)
        x, y = a[:rows], b[:rows]
        rng.standard_normal(out=x, dtype=np.float32)
        rng.standard_normal(out=y, dtype=np.float32)
        if unit_norm:
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            y /= np.linalg.norm(y, axis=1, keepdims=True)
        dots[start : start + rows] = np.einsum("nd,nd->n", x, y, dtype=np.float64)
    return dots


def dot_product_std(d: int, samples: int = 8000, unit_norm: bool = False) -> float:
    """Measured standard deviation of q.k at dimension d (sqrt(d) for normal entries)."""
    rng = np.random.default_rng([MATH_SEED, d, int(unit_norm)])
    return float(np.sqrt(np.mean(sample_dot_products(rng, d, samples, unit_norm) ** 2)))


def jacobian_norms(weights: np.ndarray) -> np.ndarray:
    """Frobenius norm of each row's softmax Jacobian diag(p) - p p^T."""
    n = weights.shape[-1]
    jacobians = weights[:, :, None] * np.eye(n)[None] - weights[:, :, None] * weights[:, None, :]
    return np.linalg.norm(jacobians, axis=(1, 2))


def saturation(d_k: int, scale: float) -> tuple[float, float, float]:
    """(mean largest weight, fraction of rows whose Jacobian norm < 1e-2, median Jacobian norm)
    over 128 rows of 128 keys with unit-variance q, k."""
    rng = np.random.default_rng([MATH_SEED, d_k])
    q, k = rng.standard_normal((2, SATURATION_KEYS, d_k))
    weights = softmax(q @ k.T * scale)
    norms = jacobian_norms(weights)
    return float(weights.max(axis=1).mean()), float((norms < 1e-2).mean()), float(np.median(norms))


def masked_softmax_example(t: int = 5, d_k: int = 4) -> np.ndarray:
    """The (t, t) causal attention weights of one small random head, scaled by 1/sqrt(d_k)."""
    rng = np.random.default_rng([MATH_SEED, t, d_k])
    q, k = rng.standard_normal((2, t, d_k))
    scores = np.where(causal_mask(t, t), q @ k.T / math.sqrt(d_k), -np.inf)
    return softmax(scores)


def andrea_numbers() -> dict[str, object]:
    """ANDREA-120M's attention shapes and score counts, per layer."""
    t, heads, d_k, d_model = ANDREA["t"], ANDREA["heads"], ANDREA["d_k"], ANDREA["d_model"]
    return {
        "head output": (t, d_k),
        "heads concatenated": (t, heads * d_k),
        "after W_O": (t, d_model),
        "scores per head": t * t,
        "scores per layer": heads * t * t,
        "visible (causal) scores per layer": heads * t * (t + 1) // 2,
        "default scale 1/sqrt(d_k)": 1 / math.sqrt(d_k),
    }
