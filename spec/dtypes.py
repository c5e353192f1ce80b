"""The floating-point dtypes the suite knows, by name, independent of any array library.

Test inputs are made in float64 and rounded to the dtype under test here, so the float64 oracle
sees exactly the values the implementation sees. NumPy has no bfloat16, so bfloat16 rounding is
done on float32 bit patterns (round to nearest even, as every bfloat16 conversion does).
"""

from __future__ import annotations

import numpy as np

DTYPES = ("float64", "float32", "float16", "bfloat16")
ITEM_SIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}  # bytes per element

# Unit roundoff (half the distance from 1 to the next float) and the largest finite value.
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
SMALLEST_SUBNORMAL = {
    "float64": 2.0**-1074,
    "float32": 2.0**-149,
    "float16": 2.0**-24,
    "bfloat16": 2.0**-133,
}
LARGEST_FINITE = {
    "float64": float(np.finfo(np.float64).max),
    "float32": float(np.finfo(np.float32).max),
    "float16": 65504.0,
    "bfloat16": float(np.float32(3.3895313892515355e38)),
}


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}, but should be one of {', '.join(DTYPES)}")
    return name


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` rounded to ``dtype``, returned as float64 (exactly representable in ``dtype``)."""
    return rounded_in_storage(np.asarray(values, dtype=np.float64), dtype).astype(np.float64)


def rounded_in_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """Float ``values`` rounded to ``dtype``, held in :func:`numpy_storage` (bfloat16 in float32):
    ``values`` itself when they are already there, so never write into the result. Rounding
    from float32 or from float64 gives the same values, widening being exact."""
    storage = numpy_storage(dtype)
    with np.errstate(over="ignore"):  # beyond the largest finite value, rounding gives +-inf
        if dtype == "bfloat16":
            return _round_to_bfloat16(values.astype(storage, copy=False))
        return values.astype(storage, copy=False)


def _round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32)
    # Round to nearest, ties to even, on the 16 bits that bfloat16 drops; NaNs keep a quiet bit.
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    rounded = np.where(np.isnan(values), np.uint32(0x7FC00000), rounded)
    return rounded.astype(np.uint32).view(np.float32)


def numpy_storage(dtype: str) -> np.dtype:
    """The NumPy dtype that holds ``dtype`` exactly (bfloat16 lives in float32)."""
    check_dtype(dtype)
    return np.dtype(np.float32 if dtype == "bfloat16" else dtype)
