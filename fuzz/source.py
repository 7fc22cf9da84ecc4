"""Sources of choices: one generator code path driven by Hypothesis, by fuzzer bytes, or by a seed.

Generators never call ``random`` or Hypothesis directly; they ask a ``Source`` for bounded integers
and byte strings. ``HypothesisSource`` gives Hypothesis full control (and shrinking), ``ByteSource``
turns a libFuzzer input into choices in the manner of a FuzzedDataProvider (so mutated bytes stay
nearly valid inputs), and ``RecordingSource`` writes the byte stream that makes ``ByteSource`` replay
the same choices, which is how structure-aware seeds are produced without hand-editing.

Byte encoding of one choice (the contract between ByteSource and RecordingSource):
``integer(lo, hi)`` reads ``ceil(bits(hi - lo) / 8)`` little-endian bytes and returns
``lo + value % (hi - lo + 1)`` (no bytes when ``lo == hi``); ``data(n)`` is ``integer(0, n)`` for the
length followed by that many raw bytes. An exhausted input reads as zero bytes, so every generator
terminates with the smallest choices.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def _width(span: int) -> int:
    return (span.bit_length() + 7) // 8


class Source:
    """Bounded choices; subclasses implement ``integer`` and ``data``."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def data(self, max_size: int) -> bytes:
        raise NotImplementedError

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def byte_array(self, count: int) -> np.ndarray:
        """Exactly ``count`` bytes as uint8 (zero-padded once the source runs dry)."""
        return np.frombuffer(self.data(count).ljust(count, b"\0"), dtype=np.uint8)[:count]

    def floats(self, shape: tuple, step: float) -> np.ndarray:
        """Float32 values (byte - 128) / step, so every value is exactly representable."""
        count = int(np.prod(shape, dtype=np.int64))
        return ((self.byte_array(count).astype(np.float32) - 128) / step).reshape(shape)

    def chance(self, numerator: int, denominator: int) -> bool:
        """True with probability numerator/denominator (under uniform bytes); False when exhausted."""
        return self.integer(0, denominator - 1) >= denominator - numerator

    def choice(self, options: Sequence[T]) -> T:
        if not options:
            raise ValueError("choice from an empty sequence")
        return options[self.integer(0, len(options) - 1)]

    def permutation(self, items: Sequence[T]) -> list[T]:
        """A permutation by successive picks (Fisher-Yates driven by choices)."""
        pool = list(items)
        out = []
        while pool:
            out.append(pool.pop(self.integer(0, len(pool) - 1)))
        return out


class ByteSource(Source):
    """Choices read from a fuzzer input, front to back."""

    __slots__ = ("_buf", "_pos")

    def __init__(self, buffer: bytes):
        self._buf = bytes(buffer)
        self._pos = 0

    @property
    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def _take(self, count: int) -> bytes:
        chunk = self._buf[self._pos:self._pos + count]
        self._pos += len(chunk)
        return chunk

    def integer(self, lo: int, hi: int) -> int:
        span = hi - lo
        if span <= 0:
            return lo
        raw = self._take(_width(span))
        return lo + int.from_bytes(raw, "little") % (span + 1)

    def data(self, max_size: int) -> bytes:
        return self._take(self.integer(0, max_size))


class RecordingSource(Source):
    """Delegates to ``inner`` and records the bytes that make a ByteSource replay the same choices."""

    def __init__(self, inner: Source):
        self.inner = inner
        self.recorded = bytearray()

    def integer(self, lo: int, hi: int) -> int:
        value = self.inner.integer(lo, hi)
        span = hi - lo
        if span > 0:
            self.recorded += (value - lo).to_bytes(_width(span), "little")
        return value

    def data(self, max_size: int) -> bytes:
        blob = self.inner.data(max_size)
        span = max_size
        if span > 0:
            self.recorded += len(blob).to_bytes(_width(span), "little")
        self.recorded += blob
        return blob


class RandomSource(Source):
    """Seeded pseudo-random choices (seed corpora, benchmarks)."""

    def __init__(self, seed: int | str):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        if hi <= lo:
            return lo
        # Favour small values: half of the draws come from the lowest sixteenth of the range.
        if hi - lo > 16 and self.rng.random() < 0.5:
            return self.rng.randint(lo, lo + (hi - lo) // 16)
        return self.rng.randint(lo, hi)

    def data(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.integer(0, max_size))


class HypothesisSource(Source):
    """Choices drawn through a Hypothesis ``draw`` so that failing inputs shrink to small ones."""

    def __init__(self, draw: Any):
        from hypothesis import strategies as st

        self._draw = draw
        self._st = st

    def integer(self, lo: int, hi: int) -> int:
        if hi <= lo:
            return lo
        return self._draw(self._st.integers(lo, hi))

    def data(self, max_size: int) -> bytes:
        return self._draw(self._st.binary(max_size=max_size))
