"""Which convention (impls.contract.CONVENTIONS) an implementation's answer follows, if any.

Each checker takes the answer (float64) to inputs on which widely used kernels disagree on
purpose, and returns (the convention followed, "") or (None, why the answer follows none): a
wrong shape or wrong values are silent garbage, whichever convention they were meant to follow.
"""

from __future__ import annotations

import numpy as np

from conformance.judge.tolerance import compare_to_oracle


def broadcast_batch_axes(got, q, k, v, *, dtype: str, scale) -> tuple[str | None, str]:
    """'broadcast': the leading axes of q, k, v broadcast together, as NumPy's matmul does."""
    try:
        leading = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        return None, "returned a result, but these leading axes do not even broadcast"
    expected_shape = (*leading, q.shape[-2], v.shape[-1])
    if got.shape != expected_shape:
        return None, f"returned shape {got.shape}, but broadcasting gives {expected_shape}"

    def flat(x):  # (..., T, D) -> (B, 1, T, D) with the broadcast leading axes in B
        return np.broadcast_to(x, (*leading, *x.shape[-2:])).reshape(-1, 1, *x.shape[-2:])

    comparison = compare_to_oracle(flat(got), flat(q), flat(k), flat(v), dtype=dtype, scale=scale)
    if not comparison.ok:
        return None, f"returned the broadcast shape with wrong values: {comparison.describe()}"
    return "broadcast", ""


def unseen_rows_filled(got, q, k, v, *, dtype: str, scale) -> tuple[str | None, str]:
    """'zeros' or 'nan': the first Tq - Tk rows (no visible key) filled so, the rest right."""
    tq, tk = q.shape[-2], k.shape[-2]
    expected_shape = (*q.shape[:-1], v.shape[-1])
    if got.shape != expected_shape:
        return None, f"returned shape {got.shape}, but should be {expected_shape}"
    unseen = got[..., : tq - tk, :]
    if np.all(unseen == 0):
        followed = "zeros"
    elif np.all(np.isnan(unseen)):
        followed = "nan"
    else:
        return None, (
            f"rows 0..{tq - tk - 1} see no key, but are neither all zero nor all NaN "
            f"(first: {float(unseen.flat[0])})"
        )
    # Rows from Tq - Tk on sit at the same absolute positions as a Tq = Tk call's rows.
    comparison = compare_to_oracle(
        got[..., tq - tk :, :], q[..., tq - tk :, :], k, v, dtype=dtype, scale=scale
    )
    if not comparison.ok:
        return None, f"rows {tq - tk}.. (which see keys) are wrong: {comparison.describe()}"
    return followed, ""


def nan_everywhere(got, q, k, v, *, dtype: str, scale) -> tuple[str | None, str]:
    """'nan': a NaN or infinite scale makes every output NaN, as the formula's arithmetic does."""
    expected_shape = (*q.shape[:-1], v.shape[-1])
    if got.shape != expected_shape:
        return None, f"returned shape {got.shape}, but should be {expected_shape}"
    if not np.all(np.isnan(got)):
        finite = int(np.sum(~np.isnan(got)))
        return None, f"returned {finite} of {got.size} elements that are not NaN"
    return "nan", ""


def promoted_to_an_input_dtype(
    got, got_dtype: str, q, k, v, *, dtypes: tuple[str, ...], coarser: str
) -> tuple[str | None, str]:
    """'promote': mixed input dtypes give one of them, right to the coarser one's budget."""
    expected_shape = (*q.shape[:-1], v.shape[-1])
    if got_dtype not in dtypes:
        return None, f"returned dtype {got_dtype}, which is neither input's"
    if got.shape != expected_shape:
        return None, f"returned shape {got.shape}, but should be {expected_shape}"
    comparison = compare_to_oracle(got, q, k, v, dtype=coarser)
    if not comparison.ok:
        return None, f"returned wrong values: {comparison.describe()}"
    return "promote", ""


FOLLOWS = {
    "batch_axes": broadcast_batch_axes,
    "unseen_rows": unseen_rows_filled,
    "nonfinite_scale": nan_everywhere,
}
