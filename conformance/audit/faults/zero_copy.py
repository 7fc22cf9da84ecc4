"""Faults in zero-copy ownership: retained buffers, views, read-only values and counters."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_neutral, to_runtime
from conformance.audit.fault import TESTEE_COPIES_RETURNED_VALUES, Fault, FaultState, fault, name_faults, wrap
from conformance.audit.faults.shared import _INDEX_PATH, _ExtraRetainedState, _map_neutral
from conformance.values import Encoded
from reference_impl import state as state_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.values import EncodedValue, StructValue, leaves


def neutral_copy(value):
    """A deep copy of a neutral value (arrays copied, structure rebuilt)."""
    return to_neutral(_runtime_copy(to_runtime(value)))


def _runtime_copy(value):
    from reference_impl.values import EncodedValue, StructValue

    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, StructValue):
        return StructValue({k: _runtime_copy(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, EncodedValue):
        return EncodedValue(value.header, value.payload.copy(), value.source, value.base_dir)
    if isinstance(value, list):
        return [_runtime_copy(v) for v in value]
    return value


def _copied(values: dict) -> dict:
    return {name: neutral_copy(value) for name, value in values.items()}


class _CopyingInitialState(FaultState):
    def reset(self, initial):
        return super().reset(_copied(initial))


class InitialValuesCopied(Fault):
    """Takes a private copy of the initial values given to ``open`` and ``reset`` instead of retaining
    the caller's buffers."""

    fault_id = "ZC-RETAIN.initial-values-copied"
    clauses = ("ZC-RETAIN",)

    def open_state(self, model_bytes, initial, base_dir=None):
        return super().open_state(model_bytes, _copied(initial), base_dir)

    def make_state(self, handle):
        return _CopyingInitialState(handle.state, self)


class _SnapshotState(FaultState):
    def values(self):
        return _copied(super().values())


ValuesAreSnapshots = fault("ZC-VIEWS.values-snapshots", ("ZC-VIEWS",),
    """``values()`` returns deep-copy snapshots of the retained values instead of shared views.""",
    state=_SnapshotState)


class _ReturnsCopiesState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        retained = {b.output_name for b in self.state.bindings}
        return {name: neutral_copy(value) if name in retained else value for name, value in outputs.items()}


RetainedOutputsDuplicated = fault("ZC-NO-DUPLICATE.returned-outputs-duplicated", ("ZC-NO-DUPLICATE",),
    """Retains the selected outputs but returns duplicates of them to the caller.""", state=_ReturnsCopiesState)


class _DefensiveCopyState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        state = self.state
        copies = {name: to_runtime(neutral_copy(value)) for name, value in state._values.items()}
        state.counters.payload_bytes_copied += sum(leaf.nbytes for name, value in copies.items()
                                                   for _, leaf in leaves(value, name) if hasattr(leaf, "nbytes"))
        state._values = MappingProxyType(copies)
        return outputs


DefensiveCopyRetained = fault("ZC-NO-PAYLOAD-COPY.defensive-copy", ("ZC-NO-PAYLOAD-COPY",),
    """Retains a defensive copy of each selected output (state management copies payload bytes), so the next call does
    not receive the buffer the previous call returned.""", state=_DefensiveCopyState)


class _CopiesFeedsState(FaultState):
    def run(self, feeds):
        return super().run({name: np.array(value) if isinstance(value, np.ndarray) else value
                            for name, value in feeds.items()})


FeedsCopiedAtEntry = fault("ZC-ENTRY-POINTS.feeds-copied", ("ZC-ENTRY-POINTS",),
    """Converts every NumPy feed into a tensor of its own (a copy) at the entry point, so a fed buffer forwarded to a
    bound output is not the caller's buffer.""", state=_CopiesFeedsState)


class _NoStringsState(FaultState):
    def run(self, feeds):
        for name, value in feeds.items():
            if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
                raise violation(E.BINDING_STRING, f"feeds[{name!r}]", "string tensors are not supported by a state")
        return super().run(feeds)


StringFeedsRefused = fault("ZC-STRINGS-NONPERSISTENT.string-feeds-refused", ("ZC-STRINGS-NONPERSISTENT",),
    """Adopts every feed of a stateful session as if it were persistent, so ordinary string feeds are refused.""",
    state=_NoStringsState)


class _NoAliasingState(FaultState):
    def run(self, feeds):
        before = self.state._values
        outputs = super().run(feeds)
        retained = [leaf for name, value in self.state._values.items() for _, leaf in leaves(value, name)
                    if isinstance(leaf, np.ndarray)]
        for name, value in outputs.items():
            for _, leaf in leaves(to_runtime(value), name):
                if isinstance(leaf, np.ndarray) and any(np.shares_memory(leaf, kept) for kept in retained):
                    self.state._values = before
                    raise violation(E.STATE_UNRETAINABLE, f"outputs[{name!r}]", "an output aliases retained state")
        return outputs


AliasingRefused = fault("ZC-SHARED-STORAGE.aliasing-refused", ("ZC-SHARED-STORAGE",),
    """Refuses to return an output that shares storage with the retained state (an alias check), instead of letting
    returned outputs and retained state share storage.""", state=_NoAliasingState)


def scrub(value, encoded_only: bool = False) -> None:
    """Zero the memory behind every leaf of ``value`` (or behind its encoded payloads only), through the base
    arrays, as a runtime scrubbing what it releases would."""
    for _, leaf in leaves(value, "value"):
        if encoded_only and not isinstance(leaf, EncodedValue):
            continue
        array = leaf.payload if isinstance(leaf, EncodedValue) else leaf
        while isinstance(array, np.ndarray) and isinstance(array.base, np.ndarray):
            array = array.base
        if isinstance(array, np.ndarray) and array.size:
            try:
                array.flags.writeable = True
            except ValueError:
                continue
            array[...] = 0


class ScrubbingState(FaultState):
    """Scrubs the retained values once the state is closed (``encoded_only``: their encoded payloads only)."""

    encoded_only = False

    def close(self):
        retained = list(self.state._values.values()) if not self.state.closed else []
        super().close()
        for value in retained:
            scrub(value, self.encoded_only)


ScrubsOnClose = fault("ZC-OUTSTANDING.scrub-on-close", ("ZC-OUTSTANDING",),
    """Zeroes the retained buffers when the state is closed (a security scrub), invalidating views the caller still
    holds.""", testee_blind=TESTEE_COPIES_RETURNED_VALUES, state=ScrubbingState)


def _detached(value):
    """A deep copy of a runtime value: what a deep-copy or serialization-based detachment helper gives."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, StructValue):
        return StructValue({k: _detached(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, EncodedValue):
        return EncodedValue(value.header, value.payload.copy())
    if isinstance(value, list):
        return [_detached(v) for v in value]
    return value


def _detaching(kernel_factory):
    def factory(node, session):
        kernel = kernel_factory(node, session)
        return lambda inputs, ctx: [_detached(v) for v in kernel(inputs, ctx)]
    return factory


class FieldTransportCopies(Fault):
    """Reads struct fields (GetField) and assembles structs (MakeStruct) into detached copies instead of
    handing the fields' buffers and owners through."""

    fault_id = "ZC-TRANSPORT.field-transport-copies"
    clauses = ("ZC-TRANSPORT", "PAY-FIELD-OWNERS")

    def patches(self):
        local = kernels.LOCAL_KERNELS
        return [wrap(local, "GetField", _detaching), wrap(local, "MakeStruct", _detaching)]


def _detached_function_inputs(original):
    def function_call(node, session, key, path, depth):
        kernel, height = original(node, session, key, path, depth)

        def run(args, ctx, values):
            return kernel([_detached(a) for a in args], ctx, values)
        return run, height
    return function_call


FunctionInputsDetached = fault("ZC-TRANSPORT.function-inputs-detached", ("ZC-TRANSPORT",),
    """Detaches the values passed into a function call (each argument deep-copied into the function's scope, struct
    fields and encoded payloads included) instead of handing the caller's buffers through.""", boundary=True,
    patches=lambda: [wrap(program, "_function_call", _detached_function_inputs)])


def detached_outputs(original):
    """A kernel builder (If, function call) whose kernels deep-copy every value they return."""
    def build(*args, **kwargs):
        kernel, height = original(*args, **kwargs)

        def run(args, ctx, values):
            return [_detached(v) for v in kernel(args, ctx, values)]
        return run, height
    return build


IfOutputsDetached = fault("ZC-TRANSPORT.if-outputs-detached", ("ZC-TRANSPORT",),
    """Deep-copies the values an If branch returns to the enclosing graph (struct fields and encoded payloads included)
    instead of passing their owners on.""", boundary=True, patches=lambda: [wrap(program, "_if", detached_outputs)])


def _scribble(value) -> None:
    """Overwrite an encoded value's bytes in place: its owner's buffer when it is writable, else the value."""
    root = value.payload
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.flags.writeable:
        root[...] = 0
    else:
        value.payload = np.zeros_like(value.payload)
        value.source = None


def _decodes_in_place(factory):
    def make(node, session):
        kernel = factory(node, session)

        def decode(inputs, ctx):
            result = kernel(inputs, ctx)
            if isinstance(inputs[0], EncodedValue):
                _scribble(inputs[0])  # the encoded input used as scratch once it is decoded
            return result
        return decode
    return make


DecodeScratchesInput = fault("ZC-READ-ONLY.decode-scratches-input", ("ZC-READ-ONLY", "PAY-READ-ONLY"),
    """Uses an encoded input's payload as scratch space once its Decode has produced the values, although the buffer is
    still shared or retained (the state's own value, the caller's feed or initializer).""",
    patches=lambda: [wrap(kernels.LOCAL_KERNELS, "Decode", _decodes_in_place)])


def _in_place_add(original):
    def standard(node, opsets, path):
        kernel = original(node, opsets, path)
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx"):
            return kernel

        def run(args, ctx, values):
            a, b = args
            if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == np.broadcast_shapes(
                    a.shape, b.shape) and a.dtype == np.result_type(a, b):
                try:
                    a.flags.writeable = True
                except ValueError:
                    return kernel(args, ctx, values)
                np.add(a, b, out=a)
                return [a]
            return kernel(args, ctx, values)
        return run
    return standard


InPlaceAdd = fault("ZC-NO-INPLACE.in-place-add", ("ZC-NO-INPLACE",), """Reuses an Add's first input buffer for its
    output when the shapes allow, even though that buffer is still referenced by the previous state or a returned
    output.""", patches=lambda: [wrap(program, "_standard", _in_place_add)])


def restoring_backup(state, call, caught: type[BaseException] | tuple = ContractError):
    """``call()`` after taking a backup copy of ``state``'s retained values, put back (unless the state
    was closed) when the call raises ``caught``: a rollback by copies instead of by keeping the buffers."""
    backup = {name: to_runtime(neutral_copy(value)) for name, value in state._values.items()}
    try:
        return call()
    except caught:
        if not state.closed:
            state._values = MappingProxyType(backup)
        raise


class _BackupState(FaultState):
    def run(self, feeds):
        return restoring_backup(self.state, lambda: super(_BackupState, self).run(feeds))


RollbackFromBackup = fault("ZC-FAILURE.backup-copy-restored", ("ZC-FAILURE",),
    """Takes a backup copy of the state before each call and restores the copy when the call fails.""",
    state=_BackupState)


class _AllOutputsRetainedState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.last: dict = {}

    def run(self, feeds):
        self.last = super().run(feeds)
        return self.last

    def values(self):
        return {**self.last, **super().values()}


ContextWidePersistence = fault("ZC-EXACT-OUTPUTS.every-output-retained", ("ZC-EXACT-OUTPUTS",),
    """Switches the whole call into a persistence mode that retains every output, not just the exact outputs the
    bindings select.""", state=_AllOutputsRetainedState)


class _PoisonedState(FaultState):
    """After a failed run, refuses every later run (the state is marked broken)."""

    broken = False

    def run(self, feeds):
        if self.broken:
            raise violation(E.STATE_RUN_FAILED, "state.run", "an earlier run failed; the state is unusable")
        try:
            return super().run(feeds)
        except ContractError as error:
            if error.code is E.STATE_RUN_FAILED:
                self.broken = True
            raise

    def reset(self, initial):
        super().reset(initial)
        self.broken = False


FailedRunPoisonsState = fault("ZC-FAILURE.failed-run-poisons-state", ("ZC-FAILURE", "STATE-ATOMIC"),
    """Marks the state broken when a run fails: the previous values stay readable, but every later run is refused until
    a reset, instead of the state staying valid for the next call.""", state=_PoisonedState)


class _EncodedSnapshotState(FaultState):
    def values(self):
        return {name: _map_neutral(value, on_encoded=lambda e: Encoded(e.header, e.payload.copy()))
                for name, value in super().values().items()}


EncodedValuesSnapshotted = fault("ZC-VIEWS.encoded-payloads-snapshotted", ("ZC-VIEWS", "ZC-NO-PAYLOAD-COPY"),
    """``values()`` shares retained tensors but hands out a copy of every encoded value's payload (the encoded wrapper
    is rebuilt with its bytes detached).""", state=_EncodedSnapshotState)


class _FieldSnapshotState(FaultState):
    def values(self):
        return {name: _map_neutral(value, on_array=lambda a, inside: a.copy() if inside else a)
                for name, value in super().values().items()}


StructFieldsSnapshotted = fault("ZC-VIEWS.struct-fields-snapshotted", ("ZC-VIEWS", "ZC-TRANSPORT"),
    """``values()`` shares retained whole tensors but copies the tensor fields of retained structs (the struct view is
    materialized field by field).""", state=_FieldSnapshotState)


class _ResetCopiesState(FaultState):
    def reset(self, initial):
        return super().reset({name: neutral_copy(value) for name, value in initial.items()})


ResetCopiesInitialValues = fault("ZC-RETAIN.reset-copies", ("ZC-RETAIN", "STATE-RESET"),
    """Retains the initial values given to ``open`` by reference but takes a private copy of the values given to
    ``reset`` (the reset path reuses a "restore a snapshot" helper).""", state=_ResetCopiesState)


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


ResetValuesLeftWritable = fault("ZC-READ-ONLY.reset-values-writable", ("ZC-READ-ONLY",),
    """The reset path retains the caller's buffers without freezing them, so the values handed out after a reset are
    writable views (open and run freeze them).""", state=_ResetWritableState)


def _sequence_copies(original):
    def adopt_array(array, path, counters, persistent, owned):
        if _INDEX_PATH.search(path) and array.dtype.kind not in "OUS":
            array = np.array(array)  # the list walk builds its elements anew
        return original(array, path, counters, persistent, owned)
    return adopt_array


SequenceElementsCopied = fault("ZC-RETAIN.sequence-elements-copied", ("ZC-RETAIN", "ZC-NO-PAYLOAD-COPY"),
    """Retains whole tensors and struct fields by reference but rebuilds everything inside a sequence (a paged cache's
    blocks and their fields) as new arrays when a sequence is taken on.""",
    patches=lambda: [wrap(state_module, "_adopt_array", _sequence_copies)])


def _scalar_copies(original):
    def adopt_array(array, path, counters, persistent, owned):
        if array.ndim == 0 and array.dtype.kind not in "OUS":
            array = np.array(array)  # a 0-d value boxed and unboxed: a new buffer
        return original(array, path, counters, persistent, owned)
    return adopt_array


ScalarValuesCopied = fault("ZC-RETAIN.scalars-copied", ("ZC-RETAIN", "ZC-NO-PAYLOAD-COPY"),
    """Takes 0-d tensors (a cache length, a step counter) on as Python scalars and rebuilds them, so a retained scalar
    is a new buffer each time it is retained.""", boundary=True,
    patches=lambda: [wrap(state_module, "_adopt_array", _scalar_copies)])


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


ForwardedFeedCopied = fault("ZC-NO-DUPLICATE.forwarded-feed-copied", ("ZC-NO-DUPLICATE", "ZC-RETAIN"),
    """Copies a selected output that aliases one of the call's feeds (to avoid retaining caller memory), instead of
    retaining and returning the caller's buffer.""", state=_ForwardedFeedCopyState)


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


ViewsCountedAsCopies = fault("ZC-NO-PAYLOAD-COPY.views-counted-as-copies", ("ZC-NO-PAYLOAD-COPY",),
    """Counts the bytes of every view ``values()`` hands out as copied payload bytes (the counter is bumped in a shared
    "export value" helper), so the copy counters misreport state-view access.""", state=_ViewsCountedState)


class _ScrubEncodedState(ScrubbingState):
    encoded_only = True


EncodedScrubbedOnClose = fault("ZC-OUTSTANDING.encoded-scrubbed-on-close", ("ZC-OUTSTANDING", "PAY-READ-ONLY"),
    """Zeroes retained encoded payloads (quantized weights, KV blocks) when the state closes, leaving plain tensors
    alone, so an outstanding view of an encoded value reads zeros.""", testee_blind=TESTEE_COPIES_RETURNED_VALUES,
    state=_ScrubEncodedState)


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


ResetRestoresInPlace = fault("ZC-OUTSTANDING.reset-writes-previous-buffers",
    ("ZC-OUTSTANDING", "ZC-NO-INPLACE", "ZC-RETAIN"), """Restores the initial values of a reset by writing them into the
    buffers the state already holds (when shape and type match), instead of retaining the caller's new buffers;
    outstanding views of the previous state change.""", state=_ResetInPlaceState)


def _readonly_copies(original):
    def adopt_array(array, path, counters, persistent, owned):
        if not array.flags.writeable and array.dtype.kind not in "OUS":
            array = array.copy()  # "cannot take a read-only buffer": made writable by a copy
        return original(array, path, counters, persistent, owned)
    return adopt_array


ReadOnlyBuffersCopied = fault("ZC-ENTRY-POINTS.read-only-buffers-copied", ("ZC-ENTRY-POINTS", "ZC-RETAIN"),
    """Takes a caller's read-only buffer (a memory-mapped or frozen array) on by copying it into a writable array
    instead of sharing it.""", patches=lambda: [wrap(state_module, "_adopt_array", _readonly_copies)])


class _EncodedOutputCopyState(FaultState):
    def run(self, feeds):
        return {name: _map_neutral(value, on_encoded=lambda e: Encoded(e.header, e.payload.copy()))
                for name, value in super().run(feeds).items()}


EncodedOutputsDuplicated = fault("ZC-NO-DUPLICATE.encoded-outputs-duplicated", ("ZC-NO-DUPLICATE",),
    """Retains encoded outputs by reference but returns a duplicate of every encoded output's payload to the caller
    (plain tensor outputs are returned as they are).""", state=_EncodedOutputCopyState)


class _CancelBackupState(FaultState):
    def run_cancelled(self, feeds):
        return restoring_backup(self.state, lambda: super(_CancelBackupState, self).run_cancelled(feeds), Exception)

    def run_held(self, feeds, hold):
        return restoring_backup(self.state, lambda: super(_CancelBackupState, self).run_held(feeds, hold), Exception)


CancelRestoresBackup = fault("ZC-FAILURE.cancel-backup-restored", ("ZC-FAILURE",),
    """On the cancellable path only, takes a backup copy of the state before the call and restores the copy when the
    call is cancelled or fails (plain runs keep the previous buffers as they should).""", state=_CancelBackupState)


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


InitialValuesSnapshotted = fault("ZC-VIEWS.initial-values-snapshotted", ("ZC-VIEWS", "ZC-RETAIN"),
    """``values()`` hands out copies while the state still holds the caller's initial values (no call yet since open or
    reset, "to protect the caller's buffers"), and shared views afterwards.""", state=_InitialSnapshotState)


class _StringOutputsRefusedState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        from reference_impl.errors import ErrorCode, violation

        for name, value in outputs.items():
            if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
                raise violation(ErrorCode.BINDING_STRING, f"outputs[{name!r}]",
                                "string tensors cannot be held by a state")
        return outputs


StringOutputsRefused = fault("ZC-STRINGS-NONPERSISTENT.string-outputs-refused", ("ZC-STRINGS-NONPERSISTENT",),
    """Adopts every output of a stateful call as if it were retained, so an ordinary (unselected) string output makes
    the call fail.""", state=_StringOutputsRefusedState)


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


AliasedOutputsSplit = fault("ZC-SHARED-STORAGE.unselected-aliases-copied", ("ZC-SHARED-STORAGE", "ZC-NO-DUPLICATE"),
    """Copies an unselected returned output that shares storage with the retained state (the input the call received, or
    the value it retains), instead of letting returned outputs and state share it.""", state=_SplitAliasesState)

FunctionOutputsDetached = fault("ZC-TRANSPORT.function-outputs-detached", ("ZC-TRANSPORT",),
    """Deep-copies the values a function call returns to its caller (struct fields and encoded payloads included)
    instead of passing their owners on; the arguments go in as they are.""", boundary=True,
    patches=lambda: [wrap(program, "_function_call", detached_outputs)])


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


IfCapturesDetached = fault("ZC-TRANSPORT.if-captures-detached", ("ZC-TRANSPORT",),
    """Builds an If branch's scope from deep copies of the enclosing values it captures, instead of handing the outer
    buffers and owners into the branch.""", boundary=True, patches=lambda: [wrap(program, "_if", _detached_captures)])


def _encoded_counted(original):
    def adopt_encoded(value, path, counters, persistent):
        adopted = original(value, path, counters, persistent)
        counters.payload_bytes_copied += adopted.payload.nbytes  # the repackaged value counted as a copy
        counters.payload_allocations += 1
        return adopted
    return adopt_encoded


EncodedAdoptionCountedAsCopy = fault("ZC-NO-PAYLOAD-COPY.encoded-counted-as-copied", ("ZC-NO-PAYLOAD-COPY",),
    """Shares encoded payloads correctly but reports each encoded value it takes on as a payload copy (the counter is
    bumped where the encoded wrapper is rebuilt), so its copy counters misreport.""",
    patches=lambda: [wrap(state_module, "_adopt_encoded", _encoded_counted)])


def _feeds_adopted_persistent(original):
    def adopting(value, path, counters, *, persistent, **options):
        if path.startswith("feeds["):
            persistent = True  # one adoption routine for everything entering the state
        return original(value, path, counters, persistent=persistent, **options)
    return adopting


StructFeedStringsRefused = fault("ZC-STRINGS-NONPERSISTENT.struct-feed-strings-refused", ("ZC-STRINGS-NONPERSISTENT",),
    """Adopts fresh structured feeds with the rules for retained values, so a string field in a fresh (non-persistent)
    struct feed is refused; plain string tensor feeds still work.""",
    patches=lambda: [wrap(state_module, "adopt", _feeds_adopted_persistent, aliases=False)])


_ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


def _in_place_last_operand(original):
    def standard(node, opsets, path):
        kernel = original(node, opsets, path)
        if node.op_type not in _ELEMENTWISE or node.domain not in ("", "ai.onnx"):
            return kernel

        def run(args, ctx, values):
            if len(args) == 2 and all(isinstance(x, np.ndarray) for x in args):
                a, b = args
                shape = np.broadcast_shapes(a.shape, b.shape)
                if b.shape == shape and b.dtype == np.result_type(a, b) and b.dtype.kind in "iuf" and b.size:
                    expected = kernel(args, ctx, values)
                    try:
                        b.flags.writeable = True
                    except ValueError:
                        return expected
                    np.copyto(b, expected[0])  # the output written over its last operand
                    return [b]
            return kernel(args, ctx, values)
        return run
    return standard


InPlaceLastOperand = fault("ZC-NO-INPLACE.in-place-last-operand", ("ZC-NO-INPLACE",),
    """Writes an elementwise Add/Sub/Mul/Div result over its second operand when that operand has the output's shape and
    type, although the buffer is still referenced by the previous state, a feed or a returned output.""",
    patches=lambda: [wrap(program, "_standard", _in_place_last_operand)])


class _RecyclingState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.pool: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        selected = {b.output_name for b in self.state.bindings}
        for name, value in list(outputs.items()):
            if name in selected or not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
                continue
            previous = self.pool.get(name)
            if previous is not None and previous.shape == value.shape and previous.dtype == value.dtype \
                    and previous is not value and not np.shares_memory(previous, value):
                previous.flags.writeable = True
                np.copyto(previous, value)  # last call's buffer reused for this call's output
                outputs[name] = previous
            elif value.base is None and value.flags.owndata and value.flags.writeable:
                self.pool[name] = value
        return outputs


OutputBuffersRecycled = fault("ZC-NO-INPLACE.output-buffers-recycled", ("ZC-NO-INPLACE", "ZC-OUTSTANDING"),
    """Keeps an output buffer pool per state: each unselected output is written into the buffer the same output had in
    the previous call, although the caller may still hold that returned output.""", state=_RecyclingState)


def _producer_siblings(state, outputs) -> list[str]:
    executor = state._executor
    if executor is None:
        return []
    selected = {b.output_name for b in state.bindings}
    found = []
    for node in executor.model.graph.node:
        if selected.intersection(node.output):
            found += [name for name in node.output if name in outputs and name not in selected]
    return found


class ProducerOutputsRetained(Fault):
    """Switches persistence on per node: every graph output of a node that produces a bound output (the
    Y of an Attention whose present is bound, the other half of a Split) is retained too."""

    fault_id = "ZC-EXACT-OUTPUTS.producer-outputs-retained"
    clauses = ("ZC-EXACT-OUTPUTS", "STATE-UNSELECTED")

    def make_state(self, handle):
        return _ExtraRetainedState(handle.state, self, _producer_siblings)


name_faults(globals())
