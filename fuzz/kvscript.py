"""KV cache operation scripts: appends that branch from old caches, held views, mixed block formats,
conversions, and broken calls with their codes.

``KVRunner`` keeps, next to every cache it creates, the plain NumPy concatenation of what was appended
to reach it, and checks after every operation that

* a contiguous present (functional ``append`` or ``ContiguousKVCache``) equals the concatenation, and
  every earlier present or view still equals its own (writes in place never reach a visible slot);
* a paged cache in dense format dequantizes to exactly the concatenation, and paged attention equals
  dense attention over the cache's dequantized K/V for every format mix;
* a rejected call raises its code and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fuzz.source import Source
from reference_impl import ContractError
from reference_impl.errors import ErrorCode as E
from reference_impl.kv import contiguous, paged
from reference_impl.kv.attention import attention
from reference_impl.kv.paged_attention import paged_attention

FORMATS = ("dense", "int8", "uint8", "int4", "uint4", "int2", "uint2", "codebook2")
KV_CODES = frozenset({E.KV_CAPACITY_INVALID, E.KV_CAPACITY_EXCEEDED, E.KV_SHAPE_MISMATCH, E.KV_BLOCK_INVALID,
                      E.ATTENTION_INPUT_INVALID})


class Mismatch(AssertionError):
    """A KV kernel's result differs from the concatenation or from dense attention."""


def _floats(src: Source, shape: tuple) -> np.ndarray:
    return src.floats(shape, 32)


@dataclass
class KVRunner:
    heads: int
    head_size: int
    capacity: int
    block: int
    pasts: list = field(default_factory=list)  # (present array, expected concatenation)
    caches: list = field(default_factory=list)  # (PagedKVCache, expected K, expected V, lossless so far)
    codes: list = field(default_factory=list)

    @classmethod
    def create(cls, src: Source) -> KVRunner:
        runner = cls(src.integer(1, 2), src.choice((2, 4, 32)), src.integer(1, 6), src.integer(1, 5))
        empty = contiguous.empty_cache(1, runner.heads, runner.head_size, runner.capacity, fixed=src.boolean())
        runner.pasts.append((empty, np.zeros((1, runner.heads, 0, runner.head_size), np.float32)))
        runner.caches.append((paged.empty(runner.heads, runner.head_size, runner.block),
                              np.zeros((runner.heads, 0, runner.head_size), np.float32),
                              np.zeros((runner.heads, 0, runner.head_size), np.float32), True))
        return runner

    # ------------------------------------------------------------------------------ operations
    def step(self, src: Source) -> str:
        kind = src.choice(("append", "append", "paged", "paged", "convert", "attend", "bad_capacity",
                           "bad_shape", "bad_block", "bad_attention", "overflow"))
        try:
            getattr(self, f"_{kind}")(src)
            outcome = "ok"
        except ContractError as error:
            outcome = error.code.value
            self.codes.append(outcome)
        expected = self._expected_code
        self._expected_code = None
        if outcome != (expected or "ok"):
            raise Mismatch(f"{kind}: expected {expected or 'ok'}, got {outcome}")
        self.check()
        return outcome

    _expected_code: str | None = None

    def _append(self, src: Source, count: int | None = None) -> None:
        past, expected = src.choice(self.pasts)
        new = _floats(src, (1, self.heads, src.integer(0, 4) if count is None else count, self.head_size))
        storage = contiguous.storage_of(past)
        needed = past.shape[2] + new.shape[2]
        if storage is not None and not storage.growable and needed > storage.capacity:
            self._expected_code = E.KV_CAPACITY_EXCEEDED.value  # a fixed allocation cannot grow
        present = contiguous.append(past, new)
        self.pasts.append((present, np.concatenate([expected, new], axis=2)))

    def _overflow(self, src: Source) -> None:
        self._append(src, self.capacity + 1)

    @property
    def formats(self) -> tuple:
        """codebook2 needs whole 32-value groups: only offered when a token row is 32 values."""
        return FORMATS if self.head_size == 32 else FORMATS[:-1]

    def _paged(self, src: Source) -> None:
        cache, keys, values, exact = src.choice(self.caches)
        n = src.integer(1, 2 * self.block + 1)
        k, v = _floats(src, (self.heads, n, self.head_size)), _floats(src, (self.heads, n, self.head_size))
        formats = (src.choice(self.formats), src.choice(self.formats))
        grown = cache.append(k, v, *formats)
        self.caches.append((grown, np.concatenate([keys, k], 1), np.concatenate([values, v], 1),
                            exact and formats == ("dense", "dense")))

    def _convert(self, src: Source) -> None:
        cache, keys, values, exact = src.choice(self.caches)
        if not cache.blocks:
            return
        indices = sorted({src.integer(0, len(cache.blocks) - 1) for _ in range(src.integer(1, 3))})
        formats = (src.choice(self.formats), src.choice((None,) + self.formats))
        converted = cache.convert(indices, *formats)
        self.caches.append((converted, keys, values, exact and formats[0] == "dense" and formats[1] in (None, "dense")))

    def _attend(self, src: Source) -> None:
        cache = src.choice(self.caches)[0]
        if not cache.count:
            return
        group = src.choice((1, 2))
        q = _floats(src, (1, self.heads * group, src.integer(1, min(3, cache.count)), self.head_size))
        causal = src.integer(0, 1)
        got = paged_attention(q, cache, is_causal=causal)
        k, v = cache.dequantized()
        k, v = (k[None] if k.ndim == 3 else k), (v[None] if v.ndim == 3 else v)
        sq = q.shape[2]  # the queries are the last sq cached tokens: the rest is the past
        want = attention(q, k[:, :, -sq:], v[:, :, -sq:], None, k[:, :, :-sq], v[:, :, :-sq], is_causal=causal).y
        if not np.allclose(got, want, rtol=1e-5, atol=1e-4):  # online versus direct softmax in float32
            raise Mismatch(f"paged attention differs from dense attention over the dequantized cache by "
                           f"{np.max(np.abs(got - want))}")

    def _bad_capacity(self, src: Source) -> None:
        self._expected_code = E.KV_CAPACITY_INVALID.value
        capacity = src.choice((0, -1, 2.5, True, "4"))
        if src.boolean():
            contiguous.empty_cache(1, self.heads, self.head_size, capacity)
        else:
            paged.empty(self.heads, self.head_size, capacity)

    def _bad_shape(self, src: Source) -> None:
        self._expected_code = E.KV_SHAPE_MISMATCH.value
        wrong = src.choice(((1, self.heads + 1, 1, self.head_size), (1, self.heads, 1, self.head_size + 1),
                            (self.heads, 1, self.head_size)))
        if src.boolean():
            contiguous.append(src.choice(self.pasts)[0], np.zeros(wrong, np.float32))
        else:
            shape = wrong[1:] if len(wrong) == 4 else (self.heads, 1, self.head_size + 2)
            src.choice(self.caches)[0].append(np.zeros(shape, np.float32), np.zeros(shape, np.float32))

    def _bad_block(self, src: Source) -> None:
        self._expected_code = E.KV_BLOCK_INVALID.value
        cache = src.choice(self.caches)[0]
        cache.convert([len(cache.blocks) + src.integer(0, 3)], "int8")

    def _bad_attention(self, src: Source) -> None:
        cache = src.choice(self.caches)[0]
        self._expected_code = E.ATTENTION_INPUT_INVALID.value
        q = np.zeros((1, self.heads, 1, self.head_size + src.integer(1, 3)), np.float32)
        paged_attention(q, cache)

    # ----------------------------------------------------------------------------------- checks
    def check(self) -> None:
        for present, expected in self.pasts:
            if present.shape != expected.shape or not np.array_equal(present, expected):
                raise Mismatch(f"a contiguous present of {expected.shape[2]} tokens no longer equals the "
                               "concatenation of its appends")
        for cache, keys, values, exact in self.caches:
            if cache.count != keys.shape[1]:
                raise Mismatch(f"paged cache holds {cache.count} tokens, {keys.shape[1]} were appended")
            if exact:  # only dense appends and conversions so far: the cache is the concatenation
                if any(fmt != ("dense", "dense") for fmt in cache.formats):
                    raise Mismatch(f"dense appends produced block formats {cache.formats}")
                k, v = cache.dequantized()
                k = k[0] if k.ndim == 4 else k.transpose(1, 0, 2) if k.shape[0] != self.heads else k
                v = v[0] if v.ndim == 4 else v.transpose(1, 0, 2) if v.shape[0] != self.heads else v
                if not (np.array_equal(k, keys) and np.array_equal(v, values)):
                    raise Mismatch("a dense paged cache does not dequantize to the concatenation")


def run_kv_script(src: Source, steps: int | None = None) -> list[str]:
    runner = KVRunner.create(src)
    return [runner.step(src) for _ in range(steps if steps is not None else src.integer(1, 12))]
