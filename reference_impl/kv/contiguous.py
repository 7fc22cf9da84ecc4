"""Contiguous fixed-capacity K/V caches: append writes only the new tokens.

Two front ends share ``KVStorage``:

* ``append(past, new)`` is the Attention past/present update: it returns exactly
  ``Concat(past, new, axis=2)``, but when ``past`` is the claimed prefix of a cache allocation with
  room left it writes ``new`` behind it and returns a longer view of the same memory. Anything else
  (a plain array, a branch from an older prefix, a full allocation) moves to fresh storage.
* ``ContiguousKVCache`` is a cache object with per-row write positions, ``linear`` or ``circular``
  writes equal to ONNX ``TensorScatter``, and a capacity policy (grow, or fail with
  KV_CAPACITY_EXCEEDED).

Either way a view that was handed out never changes, a failed or cancelled append leaves the cache as
it was, and the bytes written per append are the new tokens' bytes (relocations are counted apart).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv.storage import (
    KVCounters,
    KVStorage,
    check_cancel,
    check_capacity,
    counting_active,
    record,
    storage_of,
)

MODES = ("linear", "circular")


# ----------------------------------------------------------------------------- capacity policy
@dataclass(frozen=True)
class CapacityPolicy:
    """How much room a new allocation gets: ``fixed`` capacities fail when full, others double."""

    initial: int = 256
    fixed: bool = False
    token_major: bool = False  # layout of allocations made for plain (non-cache) pasts

    def capacity_for(self, needed: int, current: int | None = None, path: str = "kv.append") -> int:
        if self.fixed:
            capacity = current if current is not None else self.initial
            if needed > capacity:
                raise violation(E.KV_CAPACITY_EXCEEDED, path, f"{needed} tokens exceed the fixed capacity {capacity}")
            return capacity
        capacity = max(self.initial, current or 0)
        while capacity < needed:
            capacity *= 2
        return capacity


_DEFAULT_POLICY = CapacityPolicy()
_POLICY: contextvars.ContextVar[CapacityPolicy] = contextvars.ContextVar("kv_policy", default=_DEFAULT_POLICY)


@contextlib.contextmanager
def capacity_policy(initial: int = 256, fixed: bool = False, token_major: bool = False):
    """Set the policy ``append`` uses for caches it allocates (per thread/task)."""
    token = _POLICY.set(CapacityPolicy(check_capacity(initial, "kv.capacity_policy.initial"), fixed,
                                       token_major))
    try:
        yield
    finally:
        _POLICY.reset(token)


def empty_cache(batch: int, heads: int, head_size: int, capacity: int, dtype=np.float32,
                fixed: bool = True, token_major: bool = False) -> np.ndarray:
    """A zero-length (B, H, 0, D) past view backed by an allocation of ``capacity`` tokens.

    ``token_major`` stores tokens outermost, so ``present.transpose(0, 2, 1, 3)`` (B, S, H, D) stays
    C-contiguous for batch 1 as the cache grows in place.
    """
    storage = KVStorage(batch, heads, capacity, head_size, dtype, growable=not fixed, path="kv.empty_cache",
                        token_major=token_major)
    return storage.view(0)


# ----------------------------------------------------------------------------- functional append
def _check_new(past: np.ndarray, new: np.ndarray, path: str) -> None:
    if past.ndim != 4 or new.ndim != 4 or past.shape[:2] != new.shape[:2] or past.shape[3] != new.shape[3]:
        raise violation(E.KV_SHAPE_MISMATCH, path, f"new tokens {new.shape} do not extend the cache {past.shape}")
    if past.dtype != new.dtype:
        raise violation(E.KV_SHAPE_MISMATCH, path, f"new tokens are {new.dtype}, the cache holds {past.dtype}")


def _claim_in_place(storage: KVStorage | None, past: np.ndarray, needed: int) -> bool:
    """Reserve [len(past), needed) of past's own allocation if no live view or append reaches beyond it."""
    if storage is None or not storage.is_prefix_view(past) or needed > storage.capacity:
        return False
    return storage.reserve(past.shape[2], needed)


@dataclass
class _Append:
    """One planned append: into a reservation behind ``past`` (in place) or into fresh storage."""

    storage: KVStorage
    past: np.ndarray
    new: np.ndarray
    in_place: bool

    @property
    def needed(self) -> int:
        return self.past.shape[2] + self.new.shape[2]

    def write(self) -> None:
        slots = self.storage.slots()
        if not self.in_place:
            slots[:, :, :self.past.shape[2]] = self.past
        slots[:, :, self.past.shape[2]:self.needed] = self.new

    def abort(self) -> None:
        """Nothing saw the reserved slots: give them back, so the same past can append again."""
        if self.in_place:
            self.storage.release(self.needed)

    def commit(self) -> np.ndarray:
        if counting_active():
            record(KVCounters(appended_bytes=self.new.nbytes, in_place_appends=int(self.in_place),
                              relocated_bytes=0 if self.in_place else self.past.nbytes))
        return self.storage.publish(self.needed)


def _plan(past: np.ndarray, new: np.ndarray, path: str, policy: CapacityPolicy | None) -> _Append:
    """Reserve room behind ``past`` or allocate fresh storage (the only step before any write)."""
    needed = past.shape[2] + new.shape[2]
    storage = storage_of(past)
    if _claim_in_place(storage, past, needed):
        return _Append(storage, past, new, True)
    if storage is not None:  # an allocation keeps its own policy when it moves
        policy = CapacityPolicy(storage.capacity, fixed=not storage.growable, token_major=storage.token_major)
        capacity = policy.capacity_for(needed, storage.capacity, path)
    else:
        policy = policy or _POLICY.get()
        capacity = policy.capacity_for(needed, path=path)
    batch, heads, _, head = past.shape
    fresh = KVStorage(batch, heads, capacity, head, past.dtype, not policy.fixed, path, policy.token_major)
    return _Append(fresh, past, new, False)


def _run(pairs: list[tuple[np.ndarray, np.ndarray, str]], cancel, path: str,
         policy: CapacityPolicy | None) -> list[np.ndarray]:
    """Validate, plan, then write every pair with cancellation checks in between; publish only when all
    writes are done. A failure or cancellation gives back every reservation: nothing was published."""
    pairs = [(np.asarray(past), np.asarray(new), where) for past, new, where in pairs]
    for past, new, where in pairs:
        _check_new(past, new, where)
    plans: list[_Append] = []
    try:
        for past, new, where in pairs:
            plans.append(_plan(past, new, where, policy))
        for plan in plans:
            check_cancel(cancel, path)  # each earlier write landed in unseen slots: still safe to stop
            plan.write()
    except BaseException:
        for plan in plans:
            plan.abort()
        raise
    return [plan.commit() for plan in plans]


def append(past: np.ndarray, new: np.ndarray, cancel=None, path: str = "kv.append",
           policy: CapacityPolicy | None = None) -> np.ndarray:
    """``Concat(past, new, axis=2)`` that writes only ``new`` when ``past`` owns the spare room.

    ``policy`` sizes the allocation made when ``past`` is a plain array (default: ``capacity_policy``);
    an existing allocation keeps its own capacity and growth when it moves.
    """
    return _run([(past, new, path)], cancel, path, policy)[0]


def append_kv(past_key: np.ndarray, new_key: np.ndarray, past_value: np.ndarray, new_value: np.ndarray,
              cancel=None, path: str = "kv.append", policy: CapacityPolicy | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Both halves of an Attention cache update as one transaction: cancellation is observed before the
    key write and between the key and value writes, and a cancelled or failed update leaves both
    allocations as they were, reservations included."""
    key, value = _run([(past_key, new_key, f"{path}.key"), (past_value, new_value, f"{path}.value")], cancel,
                      path, policy)
    return key, value


# ----------------------------------------------------------------------------- TensorScatter
def tensor_scatter(past_cache: np.ndarray, update: np.ndarray, write_indices: np.ndarray | None = None,
                   mode: str = "linear", axis: int = -2) -> np.ndarray:
    """ONNX TensorScatter as a pure function (a fresh present_cache; the input is not touched)."""
    past_cache, update = np.asarray(past_cache), np.asarray(update)
    rank = past_cache.ndim
    if mode not in MODES:
        raise violation(E.KV_SHAPE_MISMATCH, "TensorScatter.mode", f"mode {mode!r} is not linear or circular")
    if not -rank <= axis < rank or axis % rank == 0:
        raise violation(E.KV_SHAPE_MISMATCH, "TensorScatter.axis", f"axis {axis} is the batch axis or out of range")
    axis %= rank
    capacity, count = past_cache.shape[axis], update.shape[axis] if update.ndim == rank else -1
    if update.ndim != rank or count > capacity or any(
            a != b for i, (a, b) in enumerate(zip(past_cache.shape, update.shape)) if i != axis):
        raise violation(E.KV_SHAPE_MISMATCH, "TensorScatter.update",
                        f"update {update.shape} does not fit past_cache {past_cache.shape} on axis {axis}")
    batch = past_cache.shape[0]
    starts = np.zeros(batch, np.int64) if write_indices is None else np.asarray(write_indices, np.int64)
    if starts.shape != (batch,) or np.any(starts < 0):
        raise violation(E.KV_SHAPE_MISMATCH, "TensorScatter.write_indices", "need one nonnegative index per row")
    positions = starts[:, None] + np.arange(count)[None, :]
    if mode == "circular":
        positions %= capacity
    elif np.any(positions >= capacity):
        raise violation(E.KV_CAPACITY_EXCEEDED, "TensorScatter.write_indices",
                        "linear mode requires write_indices + sequence_length <= max_sequence_length")
    present = past_cache.copy()
    _scatter_rows(np.moveaxis(present, axis, 1), np.moveaxis(update, axis, 1), positions)
    return present


def _scatter_rows(target: np.ndarray, update: np.ndarray, positions: np.ndarray) -> None:
    """target[b, positions[b, i], ...] = update[b, i, ...] for the (B, S, ...) views given."""
    rows = np.arange(target.shape[0])[:, None]
    target[rows, positions] = update


# ----------------------------------------------------------------------------- the cache object
@dataclass(frozen=True)
class AppendStats:
    """What one append did: bytes of new tokens written, bytes copied to move storage."""

    appended_bytes: int
    relocated_bytes: int
    relocated: bool


class ContiguousKVCache:
    """K and V buffers of shape (B, H, capacity, D) with per-row lengths and a write mode.

    ``append`` equals TensorScatter(full cache, update, write_indices=lengths, mode) on the full views,
    writing in place when no handed-out view can observe the written slots and moving to fresh
    storage otherwise. ``keys()``/``values()`` give read-only views of the written extent.
    """

    def __init__(self, batch: int, kv_heads: int, head_size: int, capacity: int, *, v_head_size=None,
                 dtype=np.float32, mode: str = "linear", grow: bool = False, path: str = "kv.cache"):
        if mode not in MODES:
            raise violation(E.KV_SHAPE_MISMATCH, f"{path}.mode", f"mode {mode!r} is not linear or circular")
        if mode == "circular" and grow:
            raise violation(E.KV_CAPACITY_INVALID, f"{path}.capacity", "a circular cache has a fixed capacity")
        self.path = path
        self.mode = mode
        self.grow = grow
        v_head_size = head_size if v_head_size is None else v_head_size
        self._key = KVStorage(batch, kv_heads, capacity, head_size, dtype, grow, f"{path}.key")
        self._value = KVStorage(batch, kv_heads, capacity, v_head_size, dtype, grow, f"{path}.value")
        self.lengths = np.zeros(batch, np.int64)

    @property
    def capacity(self) -> int:
        return self._key.capacity

    @property
    def extent(self) -> int:
        """Slots holding written tokens in every row's view: max length (linear) or up to capacity."""
        longest = int(self.lengths.max(initial=0))
        return min(longest, self.capacity)

    @property
    def write_indices(self) -> np.ndarray:
        return self.lengths % self.capacity if self.mode == "circular" else self.lengths.copy()

    def keys(self) -> np.ndarray:
        return self._key.view(self.extent)

    def values(self) -> np.ndarray:
        return self._value.view(self.extent)

    def full_keys(self) -> np.ndarray:
        """The whole (B, H, capacity, D) buffer, as TensorScatter's present_cache."""
        return self._key.view(self.capacity)

    def full_values(self) -> np.ndarray:
        return self._value.view(self.capacity)

    def storage_ids(self) -> tuple[int, int]:
        """Identities of the current allocations (they change exactly when the cache moves)."""
        return id(self._key.data), id(self._value.data)

    def _check_update(self, key: np.ndarray, value: np.ndarray) -> int:
        for name, update, storage in (("key", key, self._key), ("value", value, self._value)):
            shape = storage.data.shape
            if update.ndim != 4 or update.shape[:2] != shape[:2] or update.shape[3] != shape[3] \
                    or update.dtype != storage.data.dtype:
                raise violation(E.KV_SHAPE_MISMATCH, f"{self.path}.append.{name}",
                                f"{update.dtype}{list(update.shape)} does not fit a cache of "
                                f"{storage.data.dtype}{list(shape[:2])}[*]{list(shape[3:])}")
        if key.shape[2] != value.shape[2]:
            raise violation(E.KV_SHAPE_MISMATCH, f"{self.path}.append", "key and value token counts differ")
        count = key.shape[2]
        if self.mode == "circular" and count > self.capacity:
            raise violation(E.KV_SHAPE_MISMATCH, f"{self.path}.append",
                            f"{count} tokens exceed the ring of {self.capacity}")
        return count

    def _positions(self, count: int) -> np.ndarray:
        positions = self.lengths[:, None] + np.arange(count)[None, :]
        return positions % self.capacity if self.mode == "circular" else positions

    def _target(self, storage: KVStorage, positions: np.ndarray, needed: int) -> tuple[KVStorage, int]:
        """The storage to write: this one if no view can see the written slots, else a fresh copy."""
        fits = needed <= storage.capacity
        unseen = positions.size == 0 or int(positions.min()) >= storage.claimed
        if fits and unseen:
            return storage, 0
        capacity = CapacityPolicy(storage.capacity, fixed=not self.grow).capacity_for(needed, storage.capacity)
        batch, heads, _, head = storage.data.shape
        fresh = KVStorage(batch, heads, capacity, head, storage.data.dtype, self.grow, self.path)
        live = self.extent
        fresh.data[:, :, :live] = storage.data[:, :, :live]
        return fresh, storage.token_bytes(live)

    def append(self, key: np.ndarray, value: np.ndarray, cancel=None) -> AppendStats:
        """Write one update (B, H, n, D) at each row's write index; all-or-nothing."""
        key, value = np.asarray(key), np.asarray(value)
        count = self._check_update(key, value)
        positions = self._positions(count)
        needed = int(positions.max(initial=-1)) + 1 if self.mode == "linear" else self.capacity
        if self.mode == "linear" and needed > self.capacity and not self.grow:
            raise violation(E.KV_CAPACITY_EXCEEDED, f"{self.path}.append",
                            f"{needed} tokens exceed the fixed capacity {self.capacity}")
        key_target, key_moved = self._target(self._key, positions, needed)
        value_target, value_moved = self._target(self._value, positions, needed)
        check_cancel(cancel, f"{self.path}.append")
        overwrites_live = self.mode == "circular" and bool(np.any(self.lengths + count > self.capacity)) \
            and key_target is self._key
        _scatter_rows(np.moveaxis(key_target.data, 2, 1), np.moveaxis(key, 2, 1), positions)
        if not overwrites_live:  # the key landed in slots no token lives in: still safe to stop here
            check_cancel(cancel, f"{self.path}.append")
        _scatter_rows(np.moveaxis(value_target.data, 2, 1), np.moveaxis(value, 2, 1), positions)
        relocated = key_target is not self._key or value_target is not self._value
        # Commit: only now does the cache take the new storage and lengths.
        self._key, self._value = key_target, value_target
        self.lengths = self.lengths + count
        stats = AppendStats(key.nbytes + value.nbytes, key_moved + value_moved, relocated)
        record(KVCounters(appended_bytes=stats.appended_bytes, relocated_bytes=stats.relocated_bytes,
                          in_place_appends=int(not stats.relocated)))
        return stats
