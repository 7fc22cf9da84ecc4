"""Caller buffer layouts a case may hand a runtime: the same logical tensor in memory laid out as a caller
might lay it out (non-native byte order, negative strides, a misaligned start, a view of a view).

The contract lets a runtime retain such a buffer as it is or refuse it explicitly ("report unsupported
layouts/ownership explicitly"); the cases built from these layouts fail only a silent copy or conversion,
which shows as a retained value whose buffer is not the caller's. Every layout holds exactly the values of
the plain array it is made from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: What a window's surrounding elements hold: a runtime that reads past the view reads this, not zeros.
JUNK_BYTE = 0x7F


def arrange(array: np.ndarray, literal: Mapping[str, Any]) -> np.ndarray:
    """``array``'s values in the layouts ``literal`` asks for, applied in a fixed order: reversed strides,
    byte order, then where the data sits (``offset`` bytes into a larger buffer, or a ``window``)."""
    if literal.get("reversed"):
        array = np.ascontiguousarray(np.flip(array)) if array.ndim else array
        array = np.flip(array) if array.ndim else array
    if literal.get("byteswapped"):
        array = array.byteswap().view(array.dtype.newbyteorder())
    if "offset" in literal:
        array = _at_offset(array, int(literal["offset"]))
    if literal.get("window"):
        array = _window(array)
    return array


def _at_offset(array: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous array of the same values whose data starts ``offset`` bytes into a larger buffer."""
    if not 0 <= offset <= 64:
        raise ValueError(f"offset {offset} is outside 0..64")
    array = np.ascontiguousarray(array)
    raw = np.full(array.nbytes + offset + 8, JUNK_BYTE, dtype=np.uint8)
    raw[offset:offset + array.nbytes] = array.reshape(-1).view(np.uint8)
    return raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)


def _window(array: np.ndarray) -> np.ndarray:
    """A contiguous view of a view: the values sit in the middle of a slice of a larger buffer, whose
    other elements are junk."""
    array = np.ascontiguousarray(array)
    flat = array.reshape(-1)
    outer = np.frombuffer(bytes([JUNK_BYTE]) * ((flat.size + 6) * array.itemsize), dtype=array.dtype).copy()
    middle = outer[2:-1]  # a view of the buffer
    inner = middle[1:1 + flat.size]  # a view of that view
    inner[...] = flat
    return inner.reshape(array.shape)
