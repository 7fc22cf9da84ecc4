"""More zero-copy and state-surface faults: copies, checks or read-only freezing done on one path only
(values() of encoded values or struct fields, reset, sequences, scalars), counters that misreport, and
states of one model that are not isolated from each other."""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_runtime
from conformance.audit.fault import TESTEE_COPIES_RETURNED_VALUES, Fault, FaultState, wrap
from conformance.audit.faults_state import neutral_copy
from conformance.audit.faults_zero_copy import ScrubbingState, _detached, detached_outputs, restoring_backup
from conformance.values import Encoded, Struct
from reference_impl import state as state_module
from reference_impl.executor import program
from reference_impl.values import EncodedValue, leaves


def _map_neutral(value, on_array=None, on_encoded=None, in_struct: bool = False):
    """``value`` rebuilt with ``on_array(array, in_struct)`` / ``on_encoded(encoded)`` applied to its leaves."""
    if isinstance(value, np.ndarray):
        return on_array(value, in_struct) if on_array else value
    if isinstance(value, Encoded):
        return on_encoded(value) if on_encoded else value
    if isinstance(value, Struct):
        return Struct({k: _map_neutral(v, on_array, on_encoded, True) for k, v in value.items()}, value.type_id)
    if isinstance(value, list):
        return [_map_neutral(v, on_array, on_encoded, in_struct) for v in value]
    return value


# ------------------------------------------------------------------------------ values() on one kind
class _EncodedSnapshotState(FaultState):
    def values(self):
        return {name: _map_neutral(value, on_encoded=lambda e: Encoded(e.header, e.payload.copy()))
                for name, value in super().values().items()}


class EncodedValuesSnapshotted(Fault):
    """``values()`` shares retained tensors but hands out a copy of every encoded value's payload (the
    encoded wrapper is rebuilt with its bytes detached)."""

    fault_id = "ZC-VIEWS.encoded-payloads-snapshotted"
    clauses = ("ZC-VIEWS", "ZC-NO-PAYLOAD-COPY")

    def make_state(self, handle):
        return _EncodedSnapshotState(handle.state, self)


class _FieldSnapshotState(FaultState):
    def values(self):
        return {name: _map_neutral(value, on_array=lambda a, inside: a.copy() if inside else a)
                for name, value in super().values().items()}


class StructFieldsSnapshotted(Fault):
    """``values()`` shares retained whole tensors but copies the tensor fields of retained structs (the
    struct view is materialized field by field)."""

    fault_id = "ZC-VIEWS.struct-fields-snapshotted"
    clauses = ("ZC-VIEWS", "ZC-TRANSPORT")

    def make_state(self, handle):
        return _FieldSnapshotState(handle.state, self)


# --------------------------------------------------------------------------------- reset path only
class _ResetCopiesState(FaultState):
    def reset(self, initial):
        return super().reset({name: neutral_copy(value) for name, value in initial.items()})


class ResetCopiesInitialValues(Fault):
    """Retains the initial values given to ``open`` by reference but takes a private copy of the values
    given to ``reset`` (the reset path reuses a "restore a snapshot" helper)."""

    fault_id = "ZC-RETAIN.reset-copies"
    clauses = ("ZC-RETAIN", "STATE-RESET")

    def make_state(self, handle):
        return _ResetCopiesState(handle.state, self)


def _contiguous(array, in_struct):
    return np.ascontiguousarray(array) if array.dtype.kind not in "OUS" else array


class _ResetRepairsLayoutState(FaultState):
    def reset(self, initial):
        return super().reset({name: _map_neutral(value, on_array=_contiguous) for name, value in initial.items()})


class ResetRepairsStridedLayout(Fault):
    """The reset path normalizes every initial value with a contiguous conversion, so a strided buffer
    given to ``reset`` is silently copied (``open`` and ``run`` still reject it)."""

    fault_id = "PAY-UNSUPPORTED-OWNERSHIP.reset-strided-copied"
    clauses = ("PAY-UNSUPPORTED-OWNERSHIP", "ZC-ENTRY-POINTS")

    def make_state(self, handle):
        return _ResetRepairsLayoutState(handle.state, self)


def _writable_again(value) -> None:
    for _, leaf in leaves(value, "value"):
        array = leaf.payload if isinstance(leaf, EncodedValue) else leaf
        if isinstance(array, np.ndarray) and not array.flags.writeable:
            try:
                array.flags.writeable = True
            except ValueError:
                continue


class _ResetWritableState(FaultState):
    def reset(self, initial):
        result = super().reset(initial)
        for value in self.state._values.values():
            _writable_again(value)
        return result


class ResetValuesLeftWritable(Fault):
    """The reset path retains the caller's buffers without freezing them, so the values handed out after
    a reset are writable views (open and run freeze them)."""

    fault_id = "ZC-READ-ONLY.reset-values-writable"
    clauses = ("ZC-READ-ONLY",)

    def make_state(self, handle):
        return _ResetWritableState(handle.state, self)


#: per-thread flags a fault sets around one path of the oracle (reset, a struct field, a sequence element)
_FLAGS = threading.local()


class _ResetOwnerlessState(FaultState):
    def reset(self, initial):
        _FLAGS.on = True
        try:
            return super().reset(initial)
        finally:
            _FLAGS.on = False


class ResetAcceptsOwnerless(Fault):
    """Checks ownership of initial values when the state is opened but not on ``reset``: an ownerless
    borrow given to reset becomes retained state."""

    fault_id = "PAY-OWNERLESS.reset-borrow-retained"
    clauses = ("PAY-OWNERLESS", "STATE-RESET")

    def patches(self):
        def make(original):
            return lambda array: False if getattr(_FLAGS, "on", False) else original(array)
        return [wrap(state_module, "_ownerless", make)]

    def make_state(self, handle):
        return _ResetOwnerlessState(handle.state, self)


# --------------------------------------------------------------------------- one kind of leaf only
_FIELD_PATH = re.compile(r"\]\.|^\.")
_INDEX_PATH = re.compile(r"\[\d+\]")


class StructFieldOwnershipUnchecked(Fault):
    """Checks that a retained or returned tensor has an owner only for whole tensors, not for the tensor
    fields of a struct: an ownerless borrow inside a struct becomes retained state or a returned output."""

    fault_id = "PAY-OWNERLESS.struct-fields-unchecked"
    clauses = ("PAY-OWNERLESS", "PAY-FIELD-OWNERS")

    def patches(self):
        def adopt_array(original):
            def adopting(array, path, counters, persistent, owned):
                if _FIELD_PATH.search(path):
                    _FLAGS.field = True
                    try:
                        return original(array, path, counters, persistent, owned)
                    finally:
                        _FLAGS.field = False
                return original(array, path, counters, persistent, owned)
            return adopting

        def ownerless(original):
            return lambda array: False if getattr(_FLAGS, "field", False) else original(array)

        def reject_outputs(original):
            def rejecting(found):
                return original({name: [(where, leaf) for where, leaf in pairs if not where]
                                 for name, pairs in found.items()})
            return rejecting
        return [wrap(state_module, "_adopt_array", adopt_array), wrap(state_module, "_ownerless", ownerless),
                wrap(state_module, "_reject_ownerless_outputs", reject_outputs)]


def _sequence_copies(original):
    def adopt_array(array, path, counters, persistent, owned):
        if _INDEX_PATH.search(path) and array.dtype.kind not in "OUS":
            array = np.array(array)  # the list walk builds its elements anew
        return original(array, path, counters, persistent, owned)
    return adopt_array


class SequenceElementsCopied(Fault):
    """Retains whole tensors and struct fields by reference but rebuilds everything inside a sequence
    (a paged cache's blocks and their fields) as new arrays when a sequence is taken on."""

    fault_id = "ZC-RETAIN.sequence-elements-copied"
    clauses = ("ZC-RETAIN", "ZC-NO-PAYLOAD-COPY")

    def patches(self):
        return [wrap(state_module, "_adopt_array", _sequence_copies)]


def _scalar_copies(original):
    def adopt_array(array, path, counters, persistent, owned):
        if array.ndim == 0 and array.dtype.kind not in "OUS":
            array = np.array(array)  # a 0-d value boxed and unboxed: a new buffer
        return original(array, path, counters, persistent, owned)
    return adopt_array


class ScalarValuesCopied(Fault):
    """Takes 0-d tensors (a cache length, a step counter) on as Python scalars and rebuilds them, so a
    retained scalar is a new buffer each time it is retained."""

    fault_id = "ZC-RETAIN.scalars-copied"
    clauses = ("ZC-RETAIN", "ZC-NO-PAYLOAD-COPY")
    boundary = True

    def patches(self):
        return [wrap(state_module, "_adopt_array", _scalar_copies)]


# ------------------------------------------------------------------------------- forwarded feeds
class _ForwardedFeedCopyState(FaultState):
    def run(self, feeds):
        fed = [leaf for name, value in feeds.items() for _, leaf in leaves(to_runtime(value), name)
               if isinstance(leaf, np.ndarray) and leaf.dtype.kind not in "OUS"]
        outputs = super().run(feeds)
        bound = {b.output_name: b.input_name for b in self.state.bindings}
        retained = dict(self.state._values)
        for name, value in list(outputs.items()):
            if name not in bound:
                continue
            aliases = [leaf for _, leaf in leaves(to_runtime(value), name)
                       if isinstance(leaf, np.ndarray) and any(np.shares_memory(leaf, f) for f in fed)]
            if aliases:
                copy = neutral_copy(value)
                outputs[name] = copy
                retained[bound[name]] = to_runtime(copy)
        self.state._values = MappingProxyType(retained)
        return outputs


class ForwardedFeedCopied(Fault):
    """Copies a selected output that aliases one of the call's feeds (to avoid retaining caller memory),
    instead of retaining and returning the caller's buffer."""

    fault_id = "ZC-NO-DUPLICATE.forwarded-feed-copied"
    clauses = ("ZC-NO-DUPLICATE", "ZC-RETAIN")

    def make_state(self, handle):
        return _ForwardedFeedCopyState(handle.state, self)


# ---------------------------------------------------------------------------------- counters
class _ViewsCountedState(FaultState):
    def values(self):
        found = super().values()
        counters = self.state.counters
        for name, value in found.items():
            for _, leaf in leaves(to_runtime(value), name):
                array = leaf.payload if isinstance(leaf, EncodedValue) else leaf
                if isinstance(array, np.ndarray):
                    counters.payload_bytes_copied += array.nbytes
        return found


class ViewsCountedAsCopies(Fault):
    """Counts the bytes of every view ``values()`` hands out as copied payload bytes (the counter is
    bumped in a shared "export value" helper), so the copy counters misreport state-view access."""

    fault_id = "ZC-NO-PAYLOAD-COPY.views-counted-as-copies"
    clauses = ("ZC-NO-PAYLOAD-COPY",)

    def make_state(self, handle):
        return _ViewsCountedState(handle.state, self)


# ------------------------------------------------------------------------ encoded scrub on close
class _ScrubEncodedState(ScrubbingState):
    encoded_only = True


class EncodedScrubbedOnClose(Fault):
    """Zeroes retained encoded payloads (quantized weights, KV blocks) when the state closes, leaving
    plain tensors alone, so an outstanding view of an encoded value reads zeros."""

    fault_id = "ZC-OUTSTANDING.encoded-scrubbed-on-close"
    clauses = ("ZC-OUTSTANDING", "PAY-READ-ONLY")
    testee_blind = TESTEE_COPIES_RETURNED_VALUES

    def make_state(self, handle):
        return _ScrubEncodedState(handle.state, self)


# ------------------------------------------------------------------------- states of one model
class _SiblingState(FaultState):
    def __init__(self, state, fault, key):
        super().__init__(state, fault)
        self.key = key
        fault.family(key).add(self)

    def close(self):
        result = super().close()
        if self.fault.closes_siblings:
            for other in list(self.fault.family(self.key)):
                if other is not self and not other.state.closed:
                    other.state.close()
        return result

    def reset(self, initial):
        result = super().reset(initial)
        if self.fault.resets_siblings:
            for other in list(self.fault.family(self.key)):
                if other is not self and not other.state.closed:
                    other.state._values = self.state._values
        return result


class _Siblings(Fault):
    closes_siblings = False
    resets_siblings = False

    def family(self, key) -> weakref.WeakSet:
        families = self.__dict__.setdefault("_families", {})
        return families.setdefault(key, weakref.WeakSet())

    def open_state(self, model_bytes, initial, base_dir=None):
        self._key = model_bytes
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _SiblingState(handle.state, self, self._key)


class CloseReleasesSiblings(_Siblings):
    """Keeps one execution context per loaded model and releases it when any state of that model is
    closed, so closing one request's state closes every other state of the same model."""

    fault_id = "STATE-ISOLATION.close-closes-siblings"
    clauses = ("STATE-ISOLATION", "STATE-CLOSE")
    closes_siblings = True


class ResetSharedAcrossStates(_Siblings):
    """Stores the values a reset restores on the loaded model, so resetting one request's state
    replaces the retained values of every other state of the same model."""

    fault_id = "STATE-ISOLATION.reset-shared"
    clauses = ("STATE-ISOLATION", "STATE-RESET")
    resets_siblings = True


# ------------------------------------------------------------------------------ more one-path bugs
class _UnboundArenaState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.arena: dict[str, np.ndarray] = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name for b in self.state.bindings}
        for name, value in outputs.items():
            if name in bound or not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = self.arena.get(name)
            if slot is None or slot.shape != value.shape or slot.dtype != value.dtype:
                self.arena[name] = value
                continue
            slot.flags.writeable = True
            slot[...] = value  # the previous call's returned output, still held by the caller
            outputs[name] = slot
        return outputs


class UnboundOutputArenaRecycled(Fault):
    """Keeps retained outputs alive but recycles the buffers of the outputs that are not retained
    (returned only) from one call to the next, although the caller still holds the previous ones."""

    fault_id = "PAY-ARENA.unretained-outputs-recycled"
    clauses = ("PAY-ARENA", "ZC-OUTSTANDING")

    def make_state(self, handle):
        return _UnboundArenaState(handle.state, self)


class _ResetInPlaceState(FaultState):
    def reset(self, initial):
        previous = dict(self.state._values) if not self.state.closed else {}
        super().reset(initial)
        restored = dict(self.state._values)
        for name, old in previous.items():
            new = restored.get(name)
            if isinstance(old, np.ndarray) and isinstance(new, np.ndarray) and old.shape == new.shape \
                    and old.dtype == new.dtype and old.dtype.kind not in "OUS":
                root = old
                while isinstance(root.base, np.ndarray):
                    root = root.base
                try:
                    root.flags.writeable = True
                except ValueError:
                    continue
                old.flags.writeable = True
                old[...] = new  # the initial values restored into the state's existing buffers
                old.flags.writeable = False
                restored[name] = old
        self.state._values = MappingProxyType(restored)


class ResetRestoresInPlace(Fault):
    """Restores the initial values of a reset by writing them into the buffers the state already holds
    (when shape and type match), instead of retaining the caller's new buffers; outstanding views of the
    previous state change."""

    fault_id = "ZC-OUTSTANDING.reset-writes-previous-buffers"
    clauses = ("ZC-OUTSTANDING", "ZC-NO-INPLACE", "ZC-RETAIN")

    def make_state(self, handle):
        return _ResetInPlaceState(handle.state, self)


def _readonly_copies(original):
    def adopt_array(array, path, counters, persistent, owned):
        if not array.flags.writeable and array.dtype.kind not in "OUS":
            array = array.copy()  # "cannot take a read-only buffer": made writable by a copy
        return original(array, path, counters, persistent, owned)
    return adopt_array


class ReadOnlyBuffersCopied(Fault):
    """Takes a caller's read-only buffer (a memory-mapped or frozen array) on by copying it into a
    writable array instead of sharing it."""

    fault_id = "ZC-ENTRY-POINTS.read-only-buffers-copied"
    clauses = ("ZC-ENTRY-POINTS", "ZC-RETAIN")

    def patches(self):
        return [wrap(state_module, "_adopt_array", _readonly_copies)]


class _CachedValuesState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.cached = None

    def run(self, feeds):
        self.cached = None
        return super().run(feeds)

    def values(self):
        if self.cached is None:
            self.cached = super().values()
        return self.cached


class ValuesCachedAcrossReset(Fault):
    """Caches the mapping ``values()`` hands out and refreshes it after each run but not after a reset,
    so values() after a reset shows the state before it."""

    fault_id = "STATE-RESET.values-cache-stale"
    clauses = ("STATE-RESET", "ZC-VIEWS")

    def make_state(self, handle):
        return _CachedValuesState(handle.state, self)


class _EncodedOutputCopyState(FaultState):
    def run(self, feeds):
        return {name: _map_neutral(value, on_encoded=lambda e: Encoded(e.header, e.payload.copy()))
                for name, value in super().run(feeds).items()}


class EncodedOutputsDuplicated(Fault):
    """Retains encoded outputs by reference but returns a duplicate of every encoded output's payload to
    the caller (plain tensor outputs are returned as they are)."""

    fault_id = "ZC-NO-DUPLICATE.encoded-outputs-duplicated"
    clauses = ("ZC-NO-DUPLICATE",)

    def make_state(self, handle):
        return _EncodedOutputCopyState(handle.state, self)


class _PooledState(FaultState):
    def __init__(self, state, fault, key):
        super().__init__(state, fault)
        self.pool = fault.pools.setdefault(key, [])

    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name: b.input_name for b in self.state.bindings}
        retained = dict(self.state._values)
        for name, value in outputs.items():
            if not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = next((s for s in self.pool if s.shape == value.shape and s.dtype == value.dtype), None)
            if slot is None:
                continue
            self.pool.remove(slot)
            slot.flags.writeable = True
            slot[...] = value  # a buffer "released" by a closed state, still held by its caller
            slot.flags.writeable = False
            outputs[name] = slot
            if name in bound:
                retained[bound[name]] = slot
        self.state._values = MappingProxyType(retained)
        return outputs

    def close(self):
        produced = [] if self.state.closed else [v for v in self.state._values.values()
                                                 if isinstance(v, np.ndarray) and v.base is None]
        result = super().close()
        self.pool.extend(produced)
        return result


class ClosedStateBuffersPooled(Fault):
    """Returns the buffers a closed state retained to a per-model pool, from which the next call of
    any state of that model takes its output buffers, although the caller may still hold views of them."""

    fault_id = "PAY-ARENA.closed-state-buffers-pooled"
    clauses = ("PAY-ARENA", "ZC-OUTSTANDING", "STATE-CLOSE")
    testee_blind = TESTEE_COPIES_RETURNED_VALUES

    @property
    def pools(self) -> dict:
        return self.__dict__.setdefault("_pools", {})

    def open_state(self, model_bytes, initial, base_dir=None):
        self._key = model_bytes
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _PooledState(handle.state, self, self._key)


class _CancelBackupState(FaultState):
    def run_cancelled(self, feeds):
        return restoring_backup(self.state, lambda: super(_CancelBackupState, self).run_cancelled(feeds), Exception)

    def run_held(self, feeds, hold):
        return restoring_backup(self.state, lambda: super(_CancelBackupState, self).run_held(feeds, hold), Exception)


class CancelRestoresBackup(Fault):
    """On the cancellable path only, takes a backup copy of the state before the call and restores the
    copy when the call is cancelled or fails (plain runs keep the previous buffers as they should)."""

    fault_id = "ZC-FAILURE.cancel-backup-restored"
    clauses = ("ZC-FAILURE",)

    def make_state(self, handle):
        return _CancelBackupState(handle.state, self)


class _ViewedGuardState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.viewed = False

    def values(self):
        found = super().values()
        self.viewed = True
        return found

    def run(self, feeds):
        outputs = super().run(feeds)
        self.viewed = False
        return outputs

    def _guard(self, what):
        from reference_impl.errors import ErrorCode, violation

        if self.viewed and not self.state.closed:
            raise violation(ErrorCode.STATE_BUSY, f"state.{what}", "retained values are still viewed by the caller")

    def close(self):
        if self.fault.guards == "close":
            self._guard("close")
        return super().close()

    def reset(self, initial):
        if self.fault.guards == "reset":
            self._guard("reset")
        result = super().reset(initial)
        self.viewed = False
        return result


class CloseRefusedWhileViewed(Fault):
    """Refuses to close a state while the caller holds views from ``values()`` (reference-counted buffers
    in use), instead of letting outstanding views outlive the state."""

    fault_id = "ZC-OUTSTANDING.close-refused-while-viewed"
    clauses = ("ZC-OUTSTANDING", "STATE-CLOSE")
    guards = "close"

    def make_state(self, handle):
        return _ViewedGuardState(handle.state, self)


class ResetRefusedWhileViewed(Fault):
    """Refuses to reset a state while the caller holds views from ``values()``, instead of letting the
    outstanding views outlive the values they show."""

    fault_id = "ZC-OUTSTANDING.reset-refused-while-viewed"
    clauses = ("ZC-OUTSTANDING", "STATE-RESET")
    guards = "reset"

    def make_state(self, handle):
        return _ViewedGuardState(handle.state, self)


def _struct_fields_copied(value):
    return _map_neutral(value, on_array=lambda a, inside: a.copy() if inside and a.dtype.kind not in "OUS" else a)


class _StructInitialCopyState(FaultState):
    def reset(self, initial):
        return super().reset({name: _struct_fields_copied(value) for name, value in initial.items()})


class StructInitialFieldsCopied(Fault):
    """Takes each tensor field of a whole struct initial value (open and reset) on as its own private
    copy (fields are re-materialized one by one), while whole tensors are retained by reference."""

    fault_id = "ZC-RETAIN.struct-initial-fields-copied"
    clauses = ("ZC-RETAIN", "PAY-FIELD-OWNERS")

    def open_state(self, model_bytes, initial, base_dir=None):
        return super().open_state(model_bytes, {name: _struct_fields_copied(value) for name, value in initial.items()},
                                  base_dir)

    def make_state(self, handle):
        return _StructInitialCopyState(handle.state, self)


class _InitialSnapshotState(FaultState):
    def values(self):
        found = super().values()
        if self.state.steps:
            return found
        return {name: neutral_copy(value) for name, value in found.items()}


class InitialValuesSnapshotted(Fault):
    """``values()`` hands out copies while the state still holds the caller's initial values (no call
    yet since open or reset, "to protect the caller's buffers"), and shared views afterwards."""

    fault_id = "ZC-VIEWS.initial-values-snapshotted"
    clauses = ("ZC-VIEWS", "ZC-RETAIN")

    def make_state(self, handle):
        return _InitialSnapshotState(handle.state, self)


class _StringOutputsRefusedState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        from reference_impl.errors import ErrorCode, violation

        for name, value in outputs.items():
            if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
                raise violation(ErrorCode.BINDING_STRING, f"outputs[{name!r}]",
                                "string tensors cannot be held by a state")
        return outputs


class StringOutputsRefused(Fault):
    """Adopts every output of a stateful call as if it were retained, so an ordinary (unselected)
    string output makes the call fail."""

    fault_id = "ZC-STRINGS-NONPERSISTENT.string-outputs-refused"
    clauses = ("ZC-STRINGS-NONPERSISTENT",)

    def make_state(self, handle):
        return _StringOutputsRefusedState(handle.state, self)


class _SplitAliasesState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name for b in self.state.bindings}
        retained = [leaf for name, value in self.state._values.items() for _, leaf in leaves(value, name)
                    if isinstance(leaf, np.ndarray) and leaf.dtype.kind not in "OUS"]
        for name, value in list(outputs.items()):
            if name in bound:
                continue
            shared = [leaf for _, leaf in leaves(to_runtime(value), name)
                      if isinstance(leaf, np.ndarray) and any(np.shares_memory(leaf, kept) for kept in retained)]
            if shared:
                outputs[name] = neutral_copy(value)  # "an unselected output must not alias retained state"
        return outputs


class AliasedOutputsSplit(Fault):
    """Copies an unselected returned output that shares storage with the retained state (the input the
    call received, or the value it retains), instead of letting returned outputs and state share it."""

    fault_id = "ZC-SHARED-STORAGE.unselected-aliases-copied"
    clauses = ("ZC-SHARED-STORAGE", "ZC-NO-DUPLICATE")

    def make_state(self, handle):
        return _SplitAliasesState(handle.state, self)


class SequenceOwnershipUnchecked(Fault):
    """Checks that a retained tensor has an owner for whole tensors and struct fields but not for the
    elements of a sequence: an ownerless borrow inside a sequence becomes retained state."""

    fault_id = "PAY-OWNERLESS.sequence-elements-unchecked"
    clauses = ("PAY-OWNERLESS",)

    def patches(self):
        def adopt_array(original):
            def adopting(array, path, counters, persistent, owned):
                if _INDEX_PATH.search(path):
                    _FLAGS.element = True
                    try:
                        return original(array, path, counters, persistent, owned)
                    finally:
                        _FLAGS.element = False
                return original(array, path, counters, persistent, owned)
            return adopting

        def ownerless(original):
            return lambda array: False if getattr(_FLAGS, "element", False) else original(array)
        return [wrap(state_module, "_adopt_array", adopt_array), wrap(state_module, "_ownerless", ownerless)]


class _ResetIgnoresUnknownState(FaultState):
    def reset(self, initial):
        bound = {b.input_name for b in self.state.bindings}
        return super().reset({name: value for name, value in initial.items() if name in bound})


class ResetIgnoresUnknownNames(Fault):
    """Checks the names of the initial values when the state is opened but not on ``reset``, where values
    for names that are not bound inputs are silently dropped."""

    fault_id = "STATE-RESET.unknown-names-ignored"
    clauses = ("STATE-RESET", "STATE-INITIAL")

    def make_state(self, handle):
        return _ResetIgnoresUnknownState(handle.state, self)


class _ResetBindingByBindingState(FaultState):
    def reset(self, initial):
        from reference_impl.errors import ContractError

        try:
            return super().reset(initial)
        except ContractError:
            if self.state.closed or not isinstance(initial, dict):
                raise
            applied = dict(self.state._values)
            for binding in self.state.bindings:  # the bindings before the failing one were swapped in
                name = binding.input_name
                if name not in initial:
                    break
                try:
                    super().reset({**applied, name: initial[name]})
                except ContractError:
                    break
                applied = dict(self.state._values)
            raise


class ResetPublishedBindingByBinding(Fault):
    """Replaces the retained values of a reset one binding at a time, so a reset whose later value is
    invalid fails after the earlier bindings were already replaced."""

    fault_id = "STATE-RESET.published-binding-by-binding"
    clauses = ("STATE-RESET", "STATE-ATOMIC")

    def make_state(self, handle):
        return _ResetBindingByBindingState(handle.state, self)


# ------------------------------------------------------------------- transport: the other direction
class FunctionOutputsDetached(Fault):
    """Deep-copies the values a function call returns to its caller (struct fields and encoded payloads
    included) instead of passing their owners on; the arguments go in as they are."""

    fault_id = "ZC-TRANSPORT.function-outputs-detached"
    clauses = ("ZC-TRANSPORT",)
    boundary = True

    def patches(self):
        return [wrap(program, "_function_call", detached_outputs)]


class _DetachedScope(Mapping):
    """An If branch's view of the enclosing scope that hands out deep copies of the captured values."""

    def __init__(self, values):
        self.values = values

    def __getitem__(self, name):
        return _detached(self.values[name])

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)


def _detached_captures(original):
    def if_kernel(node, session, opsets, path, depth):
        kernel, height = original(node, session, opsets, path, depth)

        def run(args, ctx, values):
            return kernel(args, ctx, _DetachedScope(values))
        return run, height
    return if_kernel


class IfCapturesDetached(Fault):
    """Builds an If branch's scope from deep copies of the enclosing values it captures, instead of
    handing the outer buffers and owners into the branch."""

    fault_id = "ZC-TRANSPORT.if-captures-detached"
    clauses = ("ZC-TRANSPORT",)
    boundary = True

    def patches(self):
        return [wrap(program, "_if", _detached_captures)]


# ------------------------------------------------------------------ one guard for a model's states
class _SessionGuardState(FaultState):
    def __init__(self, state, fault, key):
        super().__init__(state, fault)
        self.key = key

    def _active(self):
        return self.fault.active.setdefault(self.key, [0])

    def _counted(self, call):
        counter = self._active()
        with self.fault.lock:
            counter[0] += 1
        try:
            return call()
        finally:
            with self.fault.lock:
                counter[0] -= 1

    def run(self, feeds):
        return self._counted(lambda: super(_SessionGuardState, self).run(feeds))

    def run_cancelled(self, feeds):
        return self._counted(lambda: super(_SessionGuardState, self).run_cancelled(feeds))

    def run_held(self, feeds, hold):
        return self._counted(lambda: super(_SessionGuardState, self).run_held(feeds, hold))

    def _guard(self, what):
        from reference_impl.errors import ErrorCode, violation

        if self._active()[0] and not self.state.closed:
            raise violation(ErrorCode.STATE_BUSY, f"state.{what}", "a call is active on this model's session")

    def reset(self, initial):
        self._guard("reset")
        return super().reset(initial)

    def close(self):
        self._guard("close")
        return super().close()


class ResetCloseGuardedPerModel(Fault):
    """Keeps "reset or close cannot race with a call" with one count of active calls per loaded model, so
    a reset or close of one state is refused while a call on another state of the same model is active."""

    fault_id = "STATE-ISOLATION.reset-close-guarded-per-model"
    clauses = ("STATE-ISOLATION", "STATE-NO-RACE")

    @property
    def active(self) -> dict:
        return self.__dict__.setdefault("_active", {})

    @property
    def lock(self):
        return self.__dict__.setdefault("_lock", threading.Lock())

    def open_state(self, model_bytes, initial, base_dir=None):
        self._key = model_bytes
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _SessionGuardState(handle.state, self, self._key)


def _field_layout_repaired(original):
    def adopt_array(array, path, counters, persistent, owned):
        if _FIELD_PATH.search(path) and not array.flags.c_contiguous and array.dtype.kind not in "OUS":
            array = np.ascontiguousarray(array)  # the struct packer wants dense fields
        return original(array, path, counters, persistent, owned)
    return adopt_array


class StridedStructFieldsCopied(Fault):
    """Rejects a strided whole tensor but silently repairs a strided struct field with a contiguous
    copy (the struct path packs its fields densely)."""

    fault_id = "PAY-UNSUPPORTED-OWNERSHIP.strided-fields-copied"
    clauses = ("PAY-UNSUPPORTED-OWNERSHIP", "PAY-FIELD-OWNERS")

    def patches(self):
        return [wrap(state_module, "_adopt_array", _field_layout_repaired)]


class _BoundOnlyState(FaultState):
    def run(self, feeds):
        _FLAGS.bound = {b.output_name for b in self.state.bindings}
        try:
            return super().run(feeds)
        finally:
            _FLAGS.bound = None


class UnboundOutputsOwnershipUnchecked(Fault):
    """Checks that outputs have an owner only for the outputs it retains: an ownerless borrow fed for the
    call and returned directly as an unselected output leaves the call."""

    fault_id = "PAY-OWNERLESS.unselected-outputs-unchecked"
    clauses = ("PAY-OWNERLESS",)

    def patches(self):
        def reject_outputs(original):
            def rejecting(found):
                bound = getattr(_FLAGS, "bound", None)
                if bound is None:
                    return original(found)
                return original({name: pairs for name, pairs in found.items() if name in bound})
            return rejecting
        return [wrap(state_module, "_reject_ownerless_outputs", reject_outputs)]

    def make_state(self, handle):
        return _BoundOnlyState(handle.state, self)


def _encoded_counted(original):
    def adopt_encoded(value, path, counters, persistent):
        adopted = original(value, path, counters, persistent)
        counters.payload_bytes_copied += adopted.payload.nbytes  # the repackaged value counted as a copy
        counters.payload_allocations += 1
        return adopted
    return adopt_encoded


class EncodedAdoptionCountedAsCopy(Fault):
    """Shares encoded payloads correctly but reports each encoded value it takes on as a payload copy
    (the counter is bumped where the encoded wrapper is rebuilt), so its copy counters misreport."""

    fault_id = "ZC-NO-PAYLOAD-COPY.encoded-counted-as-copied"
    clauses = ("ZC-NO-PAYLOAD-COPY",)

    def patches(self):
        return [wrap(state_module, "_adopt_encoded", _encoded_counted)]


def _feeds_adopted_persistent(original):
    def adopting(value, path, counters, *, persistent, **options):
        if path.startswith("feeds["):
            persistent = True  # one adoption routine for everything entering the state
        return original(value, path, counters, persistent=persistent, **options)
    return adopting


class StructFeedStringsRefused(Fault):
    """Adopts fresh structured feeds with the rules for retained values, so a string field in a fresh
    (non-persistent) struct feed is refused; plain string tensor feeds still work."""

    fault_id = "ZC-STRINGS-NONPERSISTENT.struct-feed-strings-refused"
    clauses = ("ZC-STRINGS-NONPERSISTENT",)

    def patches(self):
        return [wrap(state_module, "adopt", _feeds_adopted_persistent, aliases=False)]
