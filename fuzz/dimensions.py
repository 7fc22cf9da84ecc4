"""Choices the scenario generators make on purpose, so bugs that hide off the beaten path are reached.

Random scripts put the interesting item first, keep sizes tiny, use one model per script and hand over
plain C-contiguous buffers: a runtime that checks only the first binding, drops the last partial tile of
a large tensor, caches a prepared model under an incomplete key, or silently copies an odd caller buffer
passes them all. Each helper here makes one of those dimensions a generator decision, and names it with a
tag (``"position:middle"``, ``"size:remainder"``, ``"twin:constant"``, ``"layout:misaligned"``,
``"attention:softcap*int4"``) that the scenario carries, so tests can count how often each occurs.
"""

from __future__ import annotations

import numpy as np

from fuzz.source import Source

POSITIONS = ("first", "middle", "last")
#: Internal chunk sizes a runtime plausibly tiles by; a remainder size crosses one and leaves a partial tile.
TILES = (8, 16, 32, 64, 128, 256)
#: Largest element count a remainder size reaches: every operation of a script stays well under a millisecond.
MAX_LARGE = 4 * 256 + 255
#: Caller buffer layouts with the same values as a plain array (``lay_out``).
LAYOUTS = ("plain", "strided", "readonly", "misaligned", "view_of_view", "big_endian", "zero_size")


def place(src: Source, count: int) -> tuple[int, str]:
    """The index of the interesting item among ``count`` and where it stands: first, middle or last (with
    one item all three are index 0; with two, the middle is the second)."""
    where = src.choice(POSITIONS)
    if count <= 1:
        return 0, where
    return {"first": 0, "middle": count // 2, "last": count - 1}[where], where


def remainder_size(src: Source) -> int:
    """An element count past a tile size that is not a multiple of it: ``tile * m + r`` with 1 <= r < tile,
    so the last partial tile is non-empty, at most ``MAX_LARGE``."""
    tile = src.choice(TILES)
    whole = src.integer(1, max(1, min(4, MAX_LARGE // tile - 1)))
    return tile * whole + src.integer(1, tile - 1)


def lay_out(array: np.ndarray, layout: str) -> np.ndarray:
    """``array``'s values in a caller buffer of ``layout``: ``strided`` (every other element of a larger
    buffer), ``readonly``, ``misaligned`` (one byte past an aligned start), ``view_of_view`` (a strided
    view of a strided view), ``big_endian`` (the same values byte-swapped in a '>' dtype), ``zero_size``
    (an empty array of the same dtype and rank, the size along axis 0 set to 0), ``plain`` (as it is)."""
    if layout == "plain":
        return array
    if layout == "strided":
        wide = np.zeros((array.size * 2,), array.dtype)
        wide[::2] = array.reshape(-1)
        return wide[::2].reshape(array.shape)
    if layout == "readonly":
        frozen = array.copy()
        frozen.flags.writeable = False
        return frozen
    if layout == "misaligned":
        raw = np.zeros(array.nbytes + 1, np.uint8)
        view = raw[1:].view(array.dtype).reshape(array.shape)
        view[...] = array
        return view
    if layout == "view_of_view":
        wide = np.zeros((array.size * 4,), array.dtype)
        wide[::4] = array.reshape(-1)
        return wide[::2][::2].reshape(array.shape)
    if layout == "big_endian":
        return array.astype(array.dtype.newbyteorder(">"))
    if layout == "zero_size":
        return np.zeros((0,) + array.shape[1:], array.dtype)
    raise ValueError(f"unknown layout {layout!r}")


def layout_of(array: np.ndarray) -> str:
    """Which ``LAYOUTS`` entry an array is in, read off the array itself (tests check generated buffers
    by what they are, not by what the generator said)."""
    if array.size == 0:
        return "zero_size"
    if array.dtype.byteorder == ">":
        return "big_endian"
    if not array.flags.aligned:
        return "misaligned"
    if not array.flags.c_contiguous:
        # NumPy collapses a view's base to the owner, so the two are told apart by the step: 2 or 4 items
        return "view_of_view" if array.strides[-1] == 4 * array.itemsize else "strided"
    return "plain" if array.flags.writeable else "readonly"
