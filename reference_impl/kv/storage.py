"""K/V allocations that can be appended to without disturbing any view already handed out.

A ``KVStorage`` owns one array of shape (batch, heads, capacity, head_size) and records ``claimed``: the
sequence extent that views may have observed or that an append has reserved. Views are only ever made
over positions [0, claimed), so a write at or beyond ``claimed`` changes no byte anyone can see; that is
how an append writes only the new tokens while the previous state and returned outputs keep their
values (clauses KV-APPEND, ZC-NO-INPLACE). Writing below ``claimed`` is allowed only while no view of
the allocation is alive; otherwise the writer moves to fresh storage.

Liveness is the allocation's reference count: every NumPy view keeps its base array alive, and the
storage keeps the only other reference, so ``sys.getrefcount`` is exactly "is a view still out there".
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail

#: Allocations larger than this are refused rather than attempted (hostile capacities).
MAX_STORAGE_BYTES = 1 << 32


@dataclass
class KVCounters:
    """Byte accounting for cache writes: what appends wrote, and what relocations copied."""

    appended_bytes: int = 0
    relocated_bytes: int = 0
    allocations: int = 0
    allocated_bytes: int = 0
    in_place_appends: int = 0
    encoded_bytes: int = 0  # bytes of quantized blocks produced by sealing or conversion

    def add(self, other: KVCounters) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_ACTIVE: contextvars.ContextVar[tuple[KVCounters, ...]] = contextvars.ContextVar("kv_counters", default=())


@contextlib.contextmanager
def counting():
    """Accumulate the KV byte counters of everything run in this context (per thread/task)."""
    counters = KVCounters()
    token = _ACTIVE.set(_ACTIVE.get() + (counters,))
    try:
        yield counters
    finally:
        _ACTIVE.reset(token)


def record(delta: KVCounters) -> None:
    for counters in _ACTIVE.get():
        counters.add(delta)


def check_capacity(capacity, path: str) -> int:
    """A capacity is a positive Python/NumPy integer (not a bool)."""
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise fail(E.KV_CAPACITY_INVALID, path, f"capacity must be an integer, got {type(capacity).__name__}")
    if capacity <= 0:
        raise fail(E.KV_CAPACITY_INVALID, path, f"capacity must be positive, got {capacity}")
    return int(capacity)


def check_dims(dims: tuple, path: str) -> tuple[int, ...]:
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)) or dim <= 0:
            raise fail(E.KV_SHAPE_MISMATCH, path, f"cache dimensions must be positive integers, got {dims}")
    return tuple(int(d) for d in dims)


_REGISTRY: dict[int, KVStorage] = {}


class KVStorage:
    """One K or V allocation, its claimed extent and whether it may grow by relocation.

    Logical views are always (B, H, tokens, D). Physically the allocation is head-major
    (B, H, capacity, D) or, with ``token_major``, (B, capacity, H, D): then a prefix of tokens is one
    contiguous run of bytes, so the (B, tokens, H, D) layout of a batch-1 cache stays C-contiguous
    while it grows in place.
    """

    def __init__(self, batch: int, heads: int, capacity: int, head_size: int, dtype, growable: bool,
                 path: str = "kv.storage", token_major: bool = False):
        capacity = check_capacity(capacity, f"{path}.capacity")
        batch, heads, head_size = check_dims((batch, heads, head_size), path)
        dtype = np.dtype(dtype)
        nbytes = batch * heads * capacity * head_size * dtype.itemsize
        if nbytes > MAX_STORAGE_BYTES:
            raise fail(E.KV_CAPACITY_INVALID, f"{path}.capacity",
                       f"{nbytes} bytes exceed the {MAX_STORAGE_BYTES}-byte allocation limit")
        shape = (batch, capacity, heads, head_size) if token_major else (batch, heads, capacity, head_size)
        self.data = np.zeros(shape, dtype=dtype)
        self.token_major = token_major
        self.claimed = 0
        self.growable = growable
        self.lock = threading.Lock()
        record(KVCounters(allocations=1, allocated_bytes=nbytes))
        key = id(self.data)
        _REGISTRY[key] = self
        # Views keep ``data`` alive, and through this entry the storage; both go when the last view does.
        weakref.finalize(self.data, _REGISTRY.pop, key, None)

    @property
    def capacity(self) -> int:
        return self.data.shape[1 if self.token_major else 2]

    @property
    def heads(self) -> int:
        return self.data.shape[2 if self.token_major else 1]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def token_bytes(self, tokens: int) -> int:
        batch, _, _, head = self.data.shape
        return batch * self.heads * tokens * head * self.data.dtype.itemsize

    def has_views(self) -> bool:
        """True while any NumPy view of the allocation exists (refs: ``self.data`` + the call argument)."""
        return sys.getrefcount(self.data) > 2

    def slots(self) -> np.ndarray:
        """Writable logical (B, H, capacity, D) view for the cache's own writes; never handed out."""
        return self.data.transpose(0, 2, 1, 3) if self.token_major else self.data

    def view(self, stop: int) -> np.ndarray:
        """Read-only logical view of positions [0, stop); marks them observable."""
        with self.lock:
            self.claimed = max(self.claimed, stop)
        out = self.slots()[:, :, :stop]
        out.flags.writeable = False
        return out

    def is_prefix_view(self, array: np.ndarray) -> bool:
        """Whether ``array`` is exactly the logical view of positions [0, n) for some n."""
        slots = self.slots()
        return (array.base is self.data and array.strides == slots.strides
                and array.shape[:2] == slots.shape[:2] and array.shape[3] == slots.shape[3]
                and array.__array_interface__["data"][0] == self.data.__array_interface__["data"][0])


def storage_of(array: np.ndarray) -> KVStorage | None:
    """The KVStorage an array is a view of, if any."""
    base = array.base
    if not isinstance(base, np.ndarray):
        return None
    storage = _REGISTRY.get(id(base))
    if storage is None or storage.data is not base:
        return None
    return storage


def check_cancel(cancel, path: str) -> None:
    """``cancel`` is None, a callable returning True to cancel, or an object with ``.cancelled``."""
    if cancel is None:
        return
    cancelled = cancel() if callable(cancel) else getattr(cancel, "cancelled", False)
    if cancelled:
        raise fail(E.STATE_CANCELLED, path, "the append was cancelled; the cache is unchanged")
