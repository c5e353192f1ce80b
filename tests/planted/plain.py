"""Plain callables (the --impl contract): a correct one, and ones that break the contract itself.

Implementations with numerical or masking bugs live in the zoo (``tests/zoo``)."""

from __future__ import annotations

import hashlib
import os

import numpy as np

from impls.contract import validate_inputs
from spec.formula import gathered_pages
from tests.zoo.formula import attend, attend_extended


def correct(q, k, v, *, causal=True, scale=None):
    """A correct plain implementation: the suite must accept it."""
    validate_inputs(q, k, v, causal=causal, scale=scale)
    return attend(q, k, v, causal=causal, scale=scale)


def returns_a_list(q, k, v, *, causal=True, scale=None):
    """Returns a nested list instead of an array."""
    return correct(q, k, v, causal=causal, scale=scale).tolist()


def wrong_signature(q, k):
    """Takes no v and no keywords."""
    return q


NOT_CALLABLE = 42


def _top_left(q, k, v, *, causal=True, scale=None):
    """The formula with the causal mask aligned top-left (j <= i), as torch's is_causal is."""
    scores = (q @ np.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        scores = np.where(np.tri(*scores.shape[-2:], 0, bool), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)


def masks_by_adding(q, k, v, *, causal=True, scale=None):
    """Masks by adding -inf to the future scores, as additive masks do: right for finite keys,
    but a NaN or infinite future key reaches past rows (NaN + -inf and inf + -inf are NaN)."""
    validate_inputs(q, k, v, causal=causal, scale=scale)
    scores = (q @ np.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    tq, tk = scores.shape[-2:]
    if causal:
        scores = scores + np.where(np.tri(tq, tk, tk - tq, bool), 0.0, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True) @ v).astype(q.dtype)


def unseen_rows_garbage(q, k, v, *, causal=True, scale=None):
    """Correct when Tq <= Tk; when Tq > Tk it answers with a top-left mask, so rows that see no
    key get an answer that is neither zero nor NaN: silent garbage."""
    if causal and q.shape[-2] > k.shape[-2]:
        return _top_left(q, k, v, causal=causal, scale=scale)
    return correct(q, k, v, causal=causal, scale=scale)


def zeros_for_nonfinite_scale(q, k, v, *, causal=True, scale=None):
    """Returns zeros for a NaN or infinite scale instead of raising or propagating NaN."""
    if scale is not None and not np.isfinite(scale):
        return np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    return correct(q, k, v, causal=causal, scale=scale)


def broadcasts_keys_wrongly(q, k, v, *, causal=True, scale=None):
    """Broadcasts leading axes, but returns the heads in reverse order when it does: the
    broadcast shape with wrong values."""
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        return attend(q, k, v, causal=causal, scale=scale)[..., ::-1, :, :].copy()
    return correct(q, k, v, causal=causal, scale=scale)


def promotes_to_a_third_dtype(q, k, v, *, causal=True, scale=None):
    """Mixed dtypes come back as float16: a dtype neither input had."""
    if not (q.dtype == k.dtype == v.dtype):
        return attend(
            q.astype(np.float64),
            k.astype(np.float64),
            v.astype(np.float64),
            causal=causal,
            scale=scale,
        ).astype(np.float16)
    return correct(q, k, v, causal=causal, scale=scale)


def drops_a_column(q, k, v, *, causal=True, scale=None):
    """Returns one value column too few."""
    return correct(q, k, v, causal=causal, scale=scale)[..., :-1]


INPUTS_LOG_VAR = "ATTNSPEC_INPUTS_LOG"  # where the two recorders below append their inputs' hashes


def _record_inputs(recorder: str, q, k, v) -> None:
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(x).tobytes() for x in (q, k, v)))
    with open(f"{os.environ[INPUTS_LOG_VAR]}.{recorder}", "a", encoding="utf-8") as log:
        log.write(digest.hexdigest() + "\n")


def records_inputs_first(q, k, v, *, causal=True, scale=None):
    """Correct, and notes what it was given: one of two implementations that differ only in name."""
    _record_inputs("first", q, k, v)
    return correct(q, k, v, causal=causal, scale=scale)


def records_inputs_second(q, k, v, *, causal=True, scale=None):
    """Correct, and notes what it was given: one of two implementations that differ only in name."""
    _record_inputs("second", q, k, v)
    return correct(q, k, v, causal=causal, scale=scale)


def pages_of_four_only(
    q, k, v, *, causal=True, scale=None, block_table=None, page_size=None, key_lengths=None
):
    """A paged cache read right, whose kernel takes pages of 4 keys and raises on any other size:
    it declares so (``page_sizes``), and the suite must fit its paged cases to it."""
    validate_inputs(q, k, v, causal=causal, scale=scale, block_table=block_table,
                    page_size=page_size, key_lengths=key_lengths)  # fmt: skip
    if block_table is None:
        return correct(q, k, v, causal=causal, scale=scale)
    if k.shape[1] != 4:
        raise ValueError(f"page size {k.shape[1]}, but this kernel takes pages of 4 keys")
    dense_k, dense_v = (gathered_pages(x, block_table, key_lengths) for x in (k, v))
    return attend_extended(q, dense_k, dense_v, causal=causal, scale=scale, key_lengths=key_lengths)


pages_of_four_only.page_sizes = (4,)
