"""Faults in zero-copy ownership: copies where buffers must be retained, shared or moved; views that
are not lifetime-safe or not read-only; in-place reuse of referenced buffers; field owners; arenas."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_runtime
from conformance.audit.fault import TESTEE_COPIES_RETURNED_VALUES, Fault, FaultState, Patch, wrap
from conformance.audit.faults_state import neutral_copy
from conformance.values import Struct
from reference_impl import state as state_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.values import EncodedValue, StructValue, leaves


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


class ValuesAreSnapshots(Fault):
    """``values()`` returns deep-copy snapshots of the retained values instead of shared views."""

    fault_id = "ZC-VIEWS.values-snapshots"
    clauses = ("ZC-VIEWS",)

    def make_state(self, handle):
        return _SnapshotState(handle.state, self)


class _ReturnsCopiesState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        retained = {b.output_name for b in self.state.bindings}
        return {name: neutral_copy(value) if name in retained else value for name, value in outputs.items()}


class RetainedOutputsDuplicated(Fault):
    """Retains the selected outputs but returns duplicates of them to the caller."""

    fault_id = "ZC-NO-DUPLICATE.returned-outputs-duplicated"
    clauses = ("ZC-NO-DUPLICATE",)

    def make_state(self, handle):
        return _ReturnsCopiesState(handle.state, self)


class _DefensiveCopyState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        state = self.state
        copies = {name: to_runtime(neutral_copy(value)) for name, value in state._values.items()}
        state.counters.payload_bytes_copied += sum(leaf.nbytes for name, value in copies.items()
                                                   for _, leaf in leaves(value, name) if hasattr(leaf, "nbytes"))
        state._values = MappingProxyType(copies)
        return outputs


class DefensiveCopyRetained(Fault):
    """Retains a defensive copy of each selected output (state management copies payload bytes), so the
    next call does not receive the buffer the previous call returned."""

    fault_id = "ZC-NO-PAYLOAD-COPY.defensive-copy"
    clauses = ("ZC-NO-PAYLOAD-COPY",)

    def make_state(self, handle):
        return _DefensiveCopyState(handle.state, self)


class _CopiesFeedsState(FaultState):
    def run(self, feeds):
        return super().run({name: np.array(value) if isinstance(value, np.ndarray) else value
                            for name, value in feeds.items()})


class FeedsCopiedAtEntry(Fault):
    """Converts every NumPy feed into a tensor of its own (a copy) at the entry point, so a fed buffer
    forwarded to a bound output is not the caller's buffer."""

    fault_id = "ZC-ENTRY-POINTS.feeds-copied"
    clauses = ("ZC-ENTRY-POINTS",)

    def make_state(self, handle):
        return _CopiesFeedsState(handle.state, self)


class _NoStringsState(FaultState):
    def run(self, feeds):
        for name, value in feeds.items():
            if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
                raise violation(E.BINDING_STRING, f"feeds[{name!r}]", "string tensors are not supported by a state")
        return super().run(feeds)


class StringFeedsRefused(Fault):
    """Adopts every feed of a stateful session as if it were persistent, so ordinary string feeds are
    refused."""

    fault_id = "ZC-STRINGS-NONPERSISTENT.string-feeds-refused"
    clauses = ("ZC-STRINGS-NONPERSISTENT",)

    def make_state(self, handle):
        return _NoStringsState(handle.state, self)


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


class AliasingRefused(Fault):
    """Refuses to return an output that shares storage with the retained state (an alias check), instead
    of letting returned outputs and retained state share storage."""

    fault_id = "ZC-SHARED-STORAGE.aliasing-refused"
    clauses = ("ZC-SHARED-STORAGE",)

    def make_state(self, handle):
        return _NoAliasingState(handle.state, self)


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


class ScrubsOnClose(Fault):
    """Zeroes the retained buffers when the state is closed (a security scrub), invalidating views the
    caller still holds."""

    fault_id = "ZC-OUTSTANDING.scrub-on-close"
    clauses = ("ZC-OUTSTANDING",)
    testee_blind = TESTEE_COPIES_RETURNED_VALUES

    def make_state(self, handle):
        return ScrubbingState(handle.state, self)


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


class FunctionInputsDetached(Fault):
    """Detaches the values passed into a function call (each argument deep-copied into the function's
    scope, struct fields and encoded payloads included) instead of handing the caller's buffers through."""

    fault_id = "ZC-TRANSPORT.function-inputs-detached"
    clauses = ("ZC-TRANSPORT",)
    boundary = True

    def patches(self):
        return [wrap(program, "_function_call", _detached_function_inputs)]


def detached_outputs(original):
    """A kernel builder (If, function call) whose kernels deep-copy every value they return."""
    def build(*args, **kwargs):
        kernel, height = original(*args, **kwargs)

        def run(args, ctx, values):
            return [_detached(v) for v in kernel(args, ctx, values)]
        return run, height
    return build


class IfOutputsDetached(Fault):
    """Deep-copies the values an If branch returns to the enclosing graph (struct fields and encoded payloads
    included) instead of passing their owners on."""

    fault_id = "ZC-TRANSPORT.if-outputs-detached"
    clauses = ("ZC-TRANSPORT",)
    boundary = True

    def patches(self):
        return [wrap(program, "_if", detached_outputs)]


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


class DecodeScratchesInput(Fault):
    """Uses an encoded input's payload as scratch space once its Decode has produced the values, although
    the buffer is still shared or retained (the state's own value, the caller's feed or initializer)."""

    fault_id = "ZC-READ-ONLY.decode-scratches-input"
    clauses = ("ZC-READ-ONLY", "PAY-READ-ONLY")

    def patches(self):
        return [wrap(kernels.LOCAL_KERNELS, "Decode", _decodes_in_place)]


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


class InPlaceAdd(Fault):
    """Reuses an Add's first input buffer for its output when the shapes allow, even though that buffer
    is still referenced by the previous state or a returned output."""

    fault_id = "ZC-NO-INPLACE.in-place-add"
    clauses = ("ZC-NO-INPLACE",)

    def patches(self):
        return [wrap(program, "_standard", _in_place_add)]


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


class RollbackFromBackup(Fault):
    """Takes a backup copy of the state before each call and restores the copy when the call fails."""

    fault_id = "ZC-FAILURE.backup-copy-restored"
    clauses = ("ZC-FAILURE",)

    def make_state(self, handle):
        return _BackupState(handle.state, self)


class _AllOutputsRetainedState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.last: dict = {}

    def run(self, feeds):
        self.last = super().run(feeds)
        return self.last

    def values(self):
        return {**self.last, **super().values()}


class ContextWidePersistence(Fault):
    """Switches the whole call into a persistence mode that retains every output, not just the exact
    outputs the bindings select."""

    fault_id = "ZC-EXACT-OUTPUTS.every-output-retained"
    clauses = ("ZC-EXACT-OUTPUTS",)

    def make_state(self, handle):
        return _AllOutputsRetainedState(handle.state, self)


class _FeedsRetainedState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.feeds: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        self.feeds = dict(feeds)
        return outputs

    def values(self):
        return {**self.feeds, **super().values()}


class FeedsKeptAsHiddenState(Fault):
    """Keeps each call's feeds as hidden kernel state next to the bound values (a second value
    system besides the graph's bindings)."""

    fault_id = "BIND-NO-CONTENTS.hidden-feed-state"
    clauses = ("BIND-NO-CONTENTS",)

    def make_state(self, handle):
        return _FeedsRetainedState(handle.state, self)


def _regrouped(value):
    """A struct whose array fields are copied into one shared allocation."""
    arrays = {name: item for name, item in value.items()
              if isinstance(item, np.ndarray) and item.dtype.kind not in "OUS"}
    if not arrays:
        return value
    block = np.zeros(sum(item.nbytes for item in arrays.values()), np.uint8)
    fields, offset = dict(value), 0
    for name, item in arrays.items():
        view = block[offset:offset + item.nbytes].view(item.dtype).reshape(item.shape)
        view[...] = item
        fields[name] = view
        offset += item.nbytes
    return Struct(fields, value.type_id)


class StructFieldsRegrouped(Fault):
    """Packs the fields of a whole struct into one allocation when it takes the struct on, instead of
    retaining each field's own buffer and owner."""

    fault_id = "PAY-FIELD-OWNERS.fields-regrouped"
    clauses = ("PAY-FIELD-OWNERS",)

    def open_state(self, model_bytes, initial, base_dir=None):
        initial = {name: _regrouped(value) if isinstance(value, Struct) else value for name, value in initial.items()}
        return super().open_state(model_bytes, initial, base_dir)


def _contiguous_copy(original):
    def adopt_array(array, path, counters, persistent, owned):
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return original(array, path, counters, persistent, owned)
    return adopt_array


class StridedBuffersCopied(Fault):
    """Repairs an unsupported (strided) buffer with a hidden contiguous copy instead of rejecting it."""

    fault_id = "PAY-UNSUPPORTED-OWNERSHIP.hidden-copy"
    clauses = ("PAY-UNSUPPORTED-OWNERSHIP",)

    def patches(self):
        return [wrap(state_module, "_adopt_array", _contiguous_copy)]


class CallerBuffersTakenAsOwned(Fault):
    """Does not track which buffers the caller only lent for the call: a borrowed raw pointer (an
    ownerless borrow) is retained or returned like any buffer, although nothing keeps its memory alive
    after the call."""

    fault_id = "PAY-OWNERLESS.borrowed-feed-retained"
    clauses = ("PAY-OWNERLESS",)

    def patches(self):
        return [Patch(state_module, "_ownerless", lambda array: False)]


class _ArenaState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.arena: dict[str, np.ndarray] = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name: b.input_name for b in self.state.bindings}
        retained = dict(self.state._values)
        for name, value in outputs.items():
            if not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = self.arena.get(name)
            if slot is None or slot.shape != value.shape or slot.dtype != value.dtype:
                self.arena[name] = value  # this call's buffer becomes the arena slot
                continue
            slot.flags.writeable = True
            slot[...] = value  # recycled while the previous call's output still refers to it
            slot.flags.writeable = False
            outputs[name] = slot
            if name in bound:
                retained[bound[name]] = slot
        self.state._values = MappingProxyType(retained)
        return outputs


class OutputArenaRecycled(Fault):
    """Writes each call's outputs into the previous call's output buffers (an arena recycled per call)
    while those buffers are still referenced by returned outputs."""

    fault_id = "PAY-ARENA.output-buffers-recycled"
    clauses = ("PAY-ARENA",)

    def make_state(self, handle):
        return _ArenaState(handle.state, self)


def _encoded_copy(original):
    def adopt_encoded(value, path, counters, persistent):
        adopted = original(value, path, counters, persistent)
        return EncodedValue(adopted.header, adopted.payload.copy(), adopted.source, adopted.base_dir)
    return adopt_encoded


class EncodedInputsCopiedForWriting(Fault):
    """Takes a private writable copy of every encoded input so its kernels may write into it, instead of
    treating encoded inputs as read-only shared payloads."""

    fault_id = "PAY-READ-ONLY.encoded-inputs-copied"
    clauses = ("PAY-READ-ONLY",)

    def patches(self):
        return [wrap(state_module, "_adopt_encoded", _encoded_copy)]
