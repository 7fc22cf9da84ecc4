"""K/V allocations that can be appended to without disturbing any view already handed out.

A ``KVStorage`` owns one array of shape (batch, heads, capacity, head_size) and hands out read-only
prefix views of it, positions [0, stop). ``claimed`` is the largest ``stop`` of a view that is still
alive, or of an append's reservation still in flight: a write at or beyond ``claimed`` changes no byte
anyone can see. That is how an append writes only the new tokens while the previous state and
returned outputs keep their values (clauses KV-APPEND, ZC-NO-INPLACE); a write below ``claimed`` moves
to fresh storage instead.

Liveness is tracked explicitly, not by reference counts: every view is made over a small owner
object (``_ViewOwner``) that NumPy records as the base of the view and of every view derived from it,
and the storage keeps weak references to those owners. An owner is dead only when no array that can
reach its memory exists, so ``claimed`` can over-count (until a cycle is collected) but never
under-count. The owner exposes the memory read-only, so no holder can make a view writable.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

#: Allocations larger than this are refused rather than attempted (hostile capacities).
MAX_STORAGE_BYTES = 1 << 32


@dataclass
class KVCounters:
    """Byte accounting for cache writes (what appends wrote, what relocations copied, what sealing
    encoded) and the peak scratch of one attention call. Sums add up; ``workspace_peak`` is a maximum."""

    appended_bytes: int = 0
    relocated_bytes: int = 0
    allocations: int = 0
    allocated_bytes: int = 0
    in_place_appends: int = 0
    encoded_bytes: int = 0  # bytes of quantized blocks produced by sealing or conversion
    workspace_peak: int = 0  # largest scratch one attention call held at once (bytes)

    @property
    def written_bytes(self) -> int:
        """Every byte written into cache storage: new tokens, relocation copies and encoded blocks."""
        return self.appended_bytes + self.relocated_bytes + self.encoded_bytes

    def add(self, other: KVCounters) -> None:
        for name in self.__dataclass_fields__:
            if name == "workspace_peak":
                self.workspace_peak = max(self.workspace_peak, other.workspace_peak)
            else:
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


def counting_active() -> bool:
    """Whether anything counts (kernels skip their accounting otherwise)."""
    return bool(_ACTIVE.get())


def record_workspace(nbytes: int) -> None:
    """Report the scratch an attention call holds at one point (the counters keep the maximum)."""
    active = _ACTIVE.get()
    if active:
        record(KVCounters(workspace_peak=int(nbytes)))


def check_capacity(capacity, path: str) -> int:
    """A capacity is a positive Python/NumPy integer (not a bool)."""
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise violation(E.KV_CAPACITY_INVALID, path, f"capacity must be an integer, got {type(capacity).__name__}")
    if capacity <= 0:
        raise violation(E.KV_CAPACITY_INVALID, path, f"capacity must be positive, got {capacity}")
    return int(capacity)


def check_dims(dims: tuple, path: str) -> tuple[int, ...]:
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)) or dim <= 0:
            raise violation(E.KV_SHAPE_MISMATCH, path, f"cache dimensions must be positive integers, got {dims}")
    return tuple(int(d) for d in dims)


class _ViewOwner:
    """The base NumPy records for the views of one ``view`` call: the allocation's bytes, read-only.

    Views derived from a handed-out view (slices, transposes, byte views, buffer exports) keep this
    object alive through their base chain, so it dies exactly when the last of them does.
    """

    __slots__ = ("storage", "__array_interface__", "__weakref__")

    def __init__(self, storage: KVStorage):
        self.storage = storage
        self.__array_interface__ = storage.interface  # shared: NumPy only reads it


_SEQUENCE = itertools.count()


class KVStorage:
    """One K or V allocation, the views it handed out that are still alive, and whether it may grow.

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
            raise violation(E.KV_CAPACITY_INVALID, f"{path}.capacity",
                            f"{nbytes} bytes exceed the {MAX_STORAGE_BYTES}-byte allocation limit")
        shape = (batch, capacity, heads, head_size) if token_major else (batch, heads, capacity, head_size)
        self.data = np.zeros(shape, dtype=dtype)  # the storage's own; only ever written through ``slots``
        self.address = self.data.__array_interface__["data"][0]
        self.interface = {"shape": (self.data.nbytes,), "typestr": "|u1", "data": (self.address, True), "version": 3}
        self.token_major = token_major
        self.growable = growable
        self.lock = threading.Lock()
        self._views: list[tuple[int, int, weakref.ref]] = []  # heap of (-stop, sequence, owner ref)
        self._compact_at = 64
        self._handed: dict[int, weakref.ref] = {}  # id -> the prefix views handed out, as handed out
        self._layout = None  # (leading shape, trailing shape, strides) of the logical views
        self._reservations: list[int] = []  # stops of appends between reservation and publication
        record(KVCounters(allocations=1, allocated_bytes=nbytes))

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

    # ------------------------------------------------------------------------- what may be seen
    @property
    def claimed(self) -> int:
        """Positions [0, claimed) may be seen by a live view or are reserved by an append in flight."""
        with self.lock:
            return self._claimed()

    @claimed.setter
    def claimed(self, stop: int) -> None:
        """Assigning reserves [0, stop) until a view of ``stop`` is published (or ``release``)."""
        with self.lock:
            self._reservations.append(int(stop))

    def _claimed(self) -> int:
        """Under the lock: drop dead owners off the top of the heap, then the largest live stop."""
        views = self._views
        while views and views[0][2]() is None:
            heapq.heappop(views)
        seen = -views[0][0] if views else 0
        return max(seen, max(self._reservations, default=0))

    def has_views(self) -> bool:
        """True while any view this storage handed out (or any view derived from one) is alive."""
        with self.lock:
            return any(ref() is not None for _, _, ref in self._views)

    def reserve(self, length: int, needed: int) -> bool:
        """Reserve [length, needed) for an append from a prefix of ``length`` if nothing live or in
        flight extends beyond that prefix; the reservation ends with ``publish`` or ``release``."""
        with self.lock:
            if needed > self.capacity or self._claimed() != length:
                return False
            self._reservations.append(needed)
            return True

    def release(self, stop: int) -> None:
        """Give up a reservation (failed or cancelled append): the positions are unseen again."""
        with self.lock:
            if stop in self._reservations:
                self._reservations.remove(stop)

    def publish(self, stop: int) -> np.ndarray:
        """The view of [0, stop) that ends the reservation of ``stop`` (if any), in one step."""
        with self.lock:
            out = self._make_view(stop)
            if stop in self._reservations:
                self._reservations.remove(stop)
            return out

    def view(self, stop: int) -> np.ndarray:
        """Read-only logical (B, H, stop, D) view of positions [0, stop), tracked while alive."""
        with self.lock:
            return self._make_view(stop)

    def _make_view(self, stop: int) -> np.ndarray:
        owner = _ViewOwner(self)
        layout = self._layout
        if layout is None:
            slots = self.slots()
            layout = self._layout = (slots.shape[:2], slots.shape[3:], slots.strides)
        out = np.ndarray(layout[0] + (stop,) + layout[1], self.data.dtype, np.asarray(owner), 0, layout[2])
        heapq.heappush(self._views, (-stop, next(_SEQUENCE), weakref.ref(owner)))
        self._handed[id(out)] = weakref.ref(out)
        if len(self._views) > self._compact_at:  # dead owners below the top: drop them now and then
            self._views = [entry for entry in self._views if entry[2]() is not None]
            heapq.heapify(self._views)
            self._handed = {key: ref for key, ref in self._handed.items() if ref() is not None}
            self._compact_at = max(64, 2 * len(self._views))
        return out

    def window(self, start: int, stop: int) -> np.ndarray:
        """Read-only logical (B, H, stop - start, D) view of positions [start, stop), tracked like a view
        of [0, stop) (so nothing may write below ``stop`` while it lives)."""
        with self.lock:
            return self._make_view(stop)[:, :, start:]

    def slots(self) -> np.ndarray:
        """Writable logical (B, H, capacity, D) view for the cache's own writes; never handed out."""
        return self.data.transpose(0, 2, 1, 3) if self.token_major else self.data

    def is_prefix_view(self, array: np.ndarray) -> bool:
        """Whether ``array`` is exactly a logical view of positions [0, n) of this storage, for some n."""
        handed = self._handed.get(id(array))
        if handed is not None and handed() is array:  # a prefix view exactly as it was handed out
            return True
        slots = self.slots()
        return (storage_of(array) is self and array.ndim == 4 and array.strides == slots.strides
                and array.shape[:2] == slots.shape[:2] and array.shape[3] == slots.shape[3]
                and array.__array_interface__["data"][0] == self.address)


def storage_of(array: np.ndarray) -> KVStorage | None:
    """The KVStorage an array is a view of, if any (found through the base chain's owner)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.storage if type(base) is _ViewOwner else None


def check_cancel(cancel, path: str) -> None:
    """``cancel`` is None, a callable returning True to cancel, or an object with ``.cancelled``."""
    if cancel is None:
        return
    cancelled = cancel() if callable(cancel) else getattr(cancel, "cancelled", False)
    if cancelled:
        raise violation(E.STATE_CANCELLED, path, "the append was cancelled; the cache is unchanged")
