"""The probe: attention weights recovered from an implementation's outputs alone.

Most fast kernels never materialise the (Tq, Tk) weight matrix. But output = A V, so with V set
to a block of one-hot columns (columns c0 .. c0+Dv-1 of the Tk x Tk identity) the output *is*
columns c0 .. c0+Dv-1 of A. ceil(Tk / Dv) calls recover all of A, entry by entry, with no
arithmetic on our side: each output entry is one weight times 1 plus zeros.
"""

from __future__ import annotations

import numpy as np

from conformance.judge.harness import Case, Subject


def one_hot_values(case: Case, first_key: int) -> np.ndarray:
    """V (B, H, Tk, Dv) whose column c is 1 at key first_key + c and 0 elsewhere."""
    values = np.zeros(case.v_shape)
    for column in range(case.value_dim):
        if first_key + column < case.tk:
            values[:, :, first_key + column, column] = 1.0
    return values


def recover_weights(subject: Subject, case: Case, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The (B, H, Tq, Tk) attention weights of ``subject`` for q, k, as float64."""
    weights = np.empty((case.batch, case.heads, case.tq, case.tk))
    for first_key in range(0, case.tk, case.value_dim):
        block = subject.call(case, q, k, one_hot_values(case, first_key))  # (B, H, Tq, Dv)
        width = min(case.value_dim, case.tk - first_key)
        weights[..., first_key : first_key + width] = block[..., :width]
    return weights


def exposed_weights(subject: Subject, case: Case, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The weights from ``attention_weights``, for implementations that expose them."""
    subject.require(case, weights=True)
    native_q, native_k = subject.to_native(case, q, k)
    native = subject.client.attention_weights(
        native_q, native_k, causal=case.causal, scale=case.scale
    )
    return subject.client.to_numpy(native).astype(np.float64)


def all_weights(subject: Subject, case: Case, q, k) -> list[tuple[str, np.ndarray]]:
    """("probe", weights) for every implementation, and ("exposed", weights) where it has them."""
    found = [("probe", recover_weights(subject, case, q, k))]
    if subject.client.capabilities.exposes_weights:
        found.append(("exposed", exposed_weights(subject, case, q, k)))
    return found
