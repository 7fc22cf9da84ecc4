"""Expectations by digest, for values too large to hold or compare element by element in a case.

A case whose decoded value has millions of elements states it as ``values_digest = {sha256, dtype,
shape}`` (``fields_digest = {name = {...}}`` for generic field access): the SHA-256 of the value's
canonical bytes. Its builder may add ``samples`` (``field_samples``): the expected elements at the
standard sample positions (``sample_indices``), computed by a formula rather than from the whole value.
The judge checks dtype and shape, then the samples, then the digest, so a failure names the first
differing sample and where it sits (the first elements, around a power of two, the strided sweep, the
last elements); a digest that differs while every sample agrees says so.

Canonical bytes: the value in its expected dtype, little-endian, row-major, with -0.0 written as +0.0 (a
runtime may produce either sign of a zero difference times a scale); integer values of another integer
width are compared as the expected dtype when every value fits it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

#: Elements sampled at each end of a value and on each side of every power of two.
EDGE = 16
AROUND = 8
#: The strided sweep's step: a prime, so the sweep meets every residue of every power-of-two chunk size.
SWEEP = 4093


def sample_indices(count: int) -> np.ndarray:
    """The standard sample positions of a flat value of ``count`` elements, sorted and unique: the first
    and last ``EDGE``, ``AROUND`` on each side of every power of two from 2^10 below ``count``, and every
    ``SWEEP``-th element."""
    parts = [np.arange(min(EDGE, count)), np.arange(max(count - EDGE, 0), count), np.arange(0, count, SWEEP)]
    power = 1 << 10
    while power < count:
        parts.append(np.arange(max(power - AROUND, 0), min(power + AROUND, count)))
        power <<= 1
    return np.unique(np.concatenate(parts).astype(np.int64))


def region(index: int, count: int) -> str:
    """Where a flat index sits among the sample positions, in words."""
    if index < EDGE:
        return "among the first elements"
    if index >= count - EDGE:
        return "among the last elements"
    power = 1 << 10
    while power < count:
        if power - AROUND <= index < power + AROUND:
            return f"around 2^{power.bit_length() - 1} = {power}"
        power <<= 1
    return "in the strided sweep"


def canonical(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as ``dtype``, little-endian and C-contiguous, with negative zeros made positive."""
    dtype = np.dtype(dtype).newbyteorder("<")
    result = np.ascontiguousarray(array, dtype=dtype)
    if dtype.kind == "f" or dtype.kind == "V" and dtype.itemsize == 2:  # NumPy floats, bfloat16
        bits = result.view(f"<u{dtype.itemsize}")
        negative_zero = bits == (1 << (8 * dtype.itemsize - 1))  # the sign bit alone
        if negative_zero.any():
            result = result.copy()
            result.view(bits.dtype)[negative_zero] = 0
    return result


def sha256(array: np.ndarray, dtype: np.dtype | None = None) -> str:
    """The SHA-256 of ``array``'s canonical bytes as ``dtype`` (its own dtype by default)."""
    chunk = canonical(array, array.dtype if dtype is None else dtype)
    return hashlib.sha256(chunk.reshape(-1).view(np.uint8)).hexdigest()


class Digest:
    """The SHA-256 of a value's canonical bytes, fed a part at a time (parts in row-major order)."""

    def __init__(self, dtype: np.dtype):
        self.dtype = np.dtype(dtype)
        self._hash = hashlib.sha256()

    def update(self, part: np.ndarray) -> None:
        self._hash.update(canonical(part, self.dtype).reshape(-1).view(np.uint8))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _as_expected(actual: np.ndarray, dtype: np.dtype, path: str) -> tuple[np.ndarray | None, str | None]:
    """``actual`` in the expected dtype, or why it cannot be: integers of another width are compared as
    ``dtype`` when they fit it (a field read as int64 is the same value as an int8 one)."""
    if actual.dtype == dtype:
        return actual, None
    if dtype.kind in "iu" and actual.dtype.kind in "iub":
        info = np.iinfo(dtype)
        if actual.size and (int(actual.min()) < info.min or int(actual.max()) > info.max):
            return None, (f"{path}: values from {int(actual.min())} to {int(actual.max())} do not fit the "
                          f"expected {dtype}")
        return actual.astype(dtype), None
    return None, f"{path}: dtype {actual.dtype}, expected {dtype}"


def mismatch(spec: Mapping, actual: Any, samples: Mapping | None = None, atol: float = 0.0, rtol: float = 0.0,
             path: str = "value") -> str | None:
    """Why ``actual`` does not have the digest ``spec`` ({sha256, dtype, shape}), or None. ``samples``
    ({index, values}) are checked first, within ``atol``/``rtol``, to name the first differing element."""
    from conformance.values import dtype_of

    dtype = dtype_of(spec["dtype"])
    shape = tuple(int(d) for d in spec["shape"])
    if not isinstance(actual, np.ndarray):
        try:
            actual = np.asarray(actual)
        except Exception:  # noqa: BLE001 - any unconvertible value is a mismatch
            return f"{path}: expected a tensor, got {type(actual).__name__}"
    actual, reason = _as_expected(actual, dtype, path)
    if reason:
        return reason
    if actual.shape != shape:
        return f"{path}: shape {list(actual.shape)}, expected {list(shape)}"
    flat = actual.reshape(-1)
    if samples is not None:
        found = _sample_mismatch(flat, shape, samples, atol, rtol, path)
        if found:
            return found
    got = sha256(actual, dtype)
    if got != spec["sha256"]:
        sampled = "" if samples is None else \
            f"; all {len(samples['index'])} sampled elements agree, so the difference lies elsewhere"
        return (f"{path}: the {flat.size} values differ from the expected ones (SHA-256 of their canonical bytes "
                f"{got[:16]}…, expected {spec['sha256'][:16]}…){sampled}")
    return None


def _sample_mismatch(flat: np.ndarray, shape: tuple[int, ...], samples: Mapping, atol: float, rtol: float,
                     path: str) -> str | None:
    index = np.asarray(samples["index"], dtype=np.int64)
    want = np.asarray(samples["values"])
    got = flat[index]
    if want.dtype.kind in "fc":
        same = np.isclose(got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True)
    else:
        same = got == want
    if same.all():
        return None
    first = int(np.flatnonzero(~same)[0])
    where = int(index[first])
    position = list(np.unravel_index(where, shape)) if shape else []
    return (f"{path}: element {where} {[int(p) for p in position]} ({region(where, flat.size)}) is "
            f"{got[first]!r}, expected {want[first]!r}; {int((~same).sum())} of {index.size} sampled elements "
            f"differ")
